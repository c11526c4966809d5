package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/gateways/envoy"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/loopback"
)

// TestThirdPartyPicker: a picker that serves ext_proc without
// grpc.health.v1 on the same port, as GAIE's and llm-d's do unless run with
// --health-checking (fakeproc.StartWithoutHealth, written from that
// behaviour). With the default gRPC check Envoy never finds it healthy:
// a FailOpen pool never picks, a FailClose pool answers 500 to everything.
// With healthCheck tcp (a connect-only check) every request is picked, and
// when the picker stops the pools fail as their mode says within the
// window of two missed checks.
func TestThirdPartyPicker(t *testing.T) {
	s, err := sim.New(sim.Config{Name: "sim-0", TimeScale: 50})
	if err != nil {
		t.Fatal(err)
	}
	simAddr := loopback.Serve(t, s.Serve)
	picker := fakeproc.StartWithoutHealth(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: simAddr, MetadataDest: simAddr}))
	gw := func(failOpen bool, check string) string {
		b, err := envoy.Bootstrap(envoy.Config{
			Listen: "127.0.0.1:8080",
			Pools: []envoy.Pool{{Name: "llama", Endpoints: []string{simAddr},
				Picker: envoy.Processor{Address: picker.Addr, Plaintext: true, FailOpen: failOpen, HealthCheck: check}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		n := gatewaytest.StandIn(t, envoysim.NodeConfig{Bootstrap: b, FreePorts: true, DebugMetadata: true})
		return gatewaytest.ListenerURL(t, n, envoy.ListenerName)
	}
	type gateway struct {
		name     string
		failOpen bool
		base     string
	}
	var grpcChecked, tcpChecked []gateway
	for _, fo := range []bool{true, false} {
		name := map[bool]string{true: "FailOpen", false: "FailClose"}[fo]
		grpcChecked = append(grpcChecked, gateway{name, fo, gw(fo, envoy.HealthGRPC)})
		tcpChecked = append(tcpChecked, gateway{name, fo, gw(fo, envoy.HealthTCP)})
	}
	// Past the first checks (a cluster warms until then, 15 s at most).
	time.Sleep(outWindow)
	for _, g := range grpcChecked {
		r := summarize(burst(g.base, 20), time.Now())
		fmt.Printf("faults: %-32s %-9s gRPC check: %s\n", t.Name(), g.name, r)
		if g.failOpen && (r.picked != 0 || r.unpicked != r.sent) {
			t.Errorf("%s, gRPC check: %s; want every request answered unpicked (the picker is never healthy)", g.name, r)
		}
		if !g.failOpen && r.failed["500"] != r.sent {
			t.Errorf("%s, gRPC check: %s; want every request 500", g.name, r)
		}
	}
	for _, g := range tcpChecked {
		r := summarize(burst(g.base, 20), time.Now())
		fmt.Printf("faults: %-32s %-9s TCP check: %s\n", t.Name(), g.name, r)
		if r.picked != r.sent {
			t.Errorf("%s, TCP check: %s; want every request picked", g.name, r)
		}
	}
	picker.Stop()
	time.Sleep(outWindow)
	for _, g := range tcpChecked {
		r := summarize(burst(g.base, 20), time.Now())
		fmt.Printf("faults: %-32s %-9s TCP check, picker stopped: %s\n", t.Name(), g.name, r)
		if g.failOpen && r.unpicked != r.sent {
			t.Errorf("%s, picker stopped: %s; want every request answered unpicked", g.name, r)
		}
		if !g.failOpen && r.failed["500"] != r.sent {
			t.Errorf("%s, picker stopped: %s; want every request 500", g.name, r)
		}
	}
}

// burst sends n requests one after another.
func burst(base string, n int) []outcome {
	var out []outcome
	for range n {
		out = append(out, post(context.Background(), base))
	}
	return out
}
