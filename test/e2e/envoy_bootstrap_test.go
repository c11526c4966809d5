package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/gateways/envoy"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/loopback"
)

// startBootstrap runs the stand-in from the bootstrap envoy-bootstrap
// renders for cfg (its listener on a free port) and returns its base URL.
func startBootstrap(t *testing.T, cfg envoy.Config) string {
	t.Helper()
	cfg.Listen = "127.0.0.1:8080" // bound on a free port instead (FreePorts)
	b, err := envoy.Bootstrap(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := gatewaytest.StandIn(t, envoysim.NodeConfig{
		Bootstrap:     b,
		FreePorts:     true,
		Timeouts:      envoysim.Timeouts{Route: 10 * time.Second, Connect: time.Second, Shutdown: time.Second},
		DebugMetadata: true,
	})
	return gatewaytest.ListenerURL(t, n, envoy.ListenerName)
}

// TestPlainEnvoyBootstrap runs the stand-in from a rendered bootstrap in
// front of real pickers, the payload processor and sims: every request
// reaches the picker's choice, a client's own destination header is
// ignored, and with the picker stopped a FailOpen pool answers from its
// endpoints while a FailClose pool answers 500; a spoofed header then gets
// an error from the gateway, never the client's address.
func TestPlainEnvoyBootstrap(t *testing.T) {
	for _, failOpen := range []bool{true, false} {
		t.Run(fmt.Sprintf("failOpen=%v", failOpen), func(t *testing.T) {
			sims, pool := newPool(t, 2)
			e := startEPP(t, pool, stopsAsCharted)
			var endpoints []string
			byAddr := map[string]string{}
			for _, s := range sims {
				endpoints = append(endpoints, s.addr)
				byAddr[s.addr] = s.name
			}
			base := startBootstrap(t, envoy.Config{Pools: []envoy.Pool{{
				Name: "llama", Picker: envoy.Processor{Address: e.GRPCAddr(), FailOpen: failOpen}, Endpoints: endpoints,
			}}})
			followsPicks(t, base, byAddr, 10)

			rogue := startSims(t, 1)[0]
			r, err := post(t, base, completion, "x-gateway-destination-endpoint", rogue.addr)
			if err != nil || r.status != 200 || r.upstream == rogue.addr || byAddr[r.upstream] != r.pod {
				t.Fatalf("a client naming its own upstream: %v %d, served by %q at %q", err, r.status, r.pod, r.upstream)
			}

			e.stop()
			r, err = post(t, base, completion)
			switch {
			case err != nil:
				t.Fatal(err)
			case failOpen && (r.status != 200 || byAddr[r.upstream] == ""):
				t.Fatalf("FailOpen, picker down: %d from %q (%q), want 200 from a pool endpoint", r.status, r.upstream, r.pod)
			case !failOpen && (r.status != 500 || r.pod != ""):
				t.Fatalf("FailClose, picker down: %d from %q, want 500 from the gateway", r.status, r.pod)
			}
			// A spoofed header picked the ORIGINAL_DST route before it was
			// removed (Envoy matches the route before the filters run, and
			// header_mutation does not clear the route cache): with the
			// picker down nothing sets it again, and the cluster finds no
			// host. Never the client's address.
			r, err = post(t, base, completion, "x-gateway-destination-endpoint", rogue.addr)
			if want := map[bool]int{true: 503, false: 500}[failOpen]; err != nil || r.status != want || r.pod != "" {
				t.Fatalf("picker down, spoofed header: %v %d from %q, want %d from the gateway", err, r.status, r.pod, want)
			}
		})
	}
}

// TestPlainEnvoyBootstrapRoutesByModel: behind the payload processor, two
// pools serve two base models; each request reaches its model's pool, at
// the pick of that pool's picker.
func TestPlainEnvoyBootstrapRoutesByModel(t *testing.T) {
	qwen := make([]simProc, 2)
	for i := range qwen {
		name := fmt.Sprintf("qwen-%d", i)
		s, err := sim.New(sim.Config{Name: name, Model: "Qwen/Qwen3-0.6B", TimeScale: 50})
		if err != nil {
			t.Fatal(err)
		}
		qwen[i] = simProc{name: name, addr: loopback.Serve(t, s.Serve), srv: s}
	}
	qwenPool := filepath.Join(t.TempDir(), "qwen.yaml")
	writePool(t, qwenPool, qwen)
	llama, llamaPool := newPool(t, 2)
	llamaEPP, qwenEPP := startEPP(t, llamaPool), startEPP(t, qwenPool)
	proc := startPayload(t, server.TLSOptions{Enabled: true})
	base := startBootstrap(t, envoy.Config{
		Payload: &envoy.Processor{Address: proc.GRPCAddr()},
		Pools: []envoy.Pool{
			{Name: "qwen", Picker: envoy.Processor{Address: qwenEPP.GRPCAddr()}, Models: []string{"Qwen/Qwen3-0.6B"}},
			{Name: "llama", Picker: envoy.Processor{Address: llamaEPP.GRPCAddr()}},
		},
	})
	names := map[string]string{}
	for _, s := range append(llama, qwen...) {
		names[s.addr] = s.name
	}
	for i := range 12 {
		model, want := sim.DefaultModel, "sim-"
		if i%2 == 1 {
			model, want = "Qwen/Qwen3-0.6B", "qwen-"
		}
		r, err := post(t, base, fmt.Sprintf(`{"model":%q,"prompt":"hello %d","max_tokens":2}`, model, i))
		if err != nil || r.status != 200 || len(r.pod) < len(want) || r.pod[:len(want)] != want || names[r.upstream] != r.pod {
			t.Fatalf("model %s: %v %d %s, served by %q at %q", model, err, r.status, r.body, r.pod, r.upstream)
		}
	}
}
