package istio

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/extproc/payload"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/test/gatewaytest"
)

// startPayload runs the payload processor at its pod's address over TLS,
// with a guardrail that refuses one phrase.
func startPayload(t *testing.T) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "payload.yaml")
	if err := os.WriteFile(cfg, []byte("deny: [{name: injection, contains: [ignore previous instructions]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := payload.New(payload.Config{
		Server: server.Options{GRPCAddr: fmt.Sprintf("%s:%d", podAddr(payloadIndex), payloadPort), HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
			TLS: server.TLSOptions{Enabled: true}, DrainTimeout: time.Second},
		ConfigFile: cfg,
		Logger:     logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// standIn runs the Envoy stand-in as the Gateway's Envoy on istiod's xDS.
func standIn(t *testing.T) *envoysim.Node {
	t.Helper()
	return gatewaytest.StandIn(t, envoysim.NodeConfig{
		XDS:           gatewayNode(),
		FreePorts:     true,
		ResolveOnly:   true,
		Timeouts:      envoysim.Timeouts{Route: 20 * time.Second, Connect: time.Second, Shutdown: time.Second},
		DebugMetadata: true,
	})
}

// TestTrafficThroughIstio: the stand-in takes istiod's xDS as the
// Gateway's Envoy, with the payload processor (by the chart's
// EnvoyFilter) and the pool's picker (Istio's own InferencePool filter)
// live: requests reach the picker's choice, through a route that matches
// the base-model header the processor sets; a guardrail refusal is
// answered before the picker; with the picker stopped FailClose answers
// 500 and FailOpen a pool endpoint.
func TestTrafficThroughIstio(t *testing.T) {
	for _, mode := range []string{"FailClose", "FailOpen"} {
		t.Run(mode, func(t *testing.T) {
			c := startCluster(t)
			c.startIstiod(t)
			servers := gatewaytest.ModelServers(t, "llama", 2, modelPort)
			stopPicker := gatewaytest.StartPicker(t, fmt.Sprintf("%s:%d", podAddr(pickerIndex), pickerPort), servers)
			startPayload(t)
			c.install(t, mode, 2)
			n := standIn(t)
			base := gatewaytest.ListenerURL(t, n, "0.0.0.0_80", "0.0.0.0_8080")
			post := func(body string) gatewaytest.Reply {
				return gatewaytest.Send(t, http.MethodPost, base+"/v1/completions", body)
			}
			var r gatewaytest.Reply
			gatewaytest.WaitFor(t, "a first answer from a model server", testTimeout, func() bool {
				r = post(`{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"hello","max_tokens":2}`)
				return r.Status == 200
			})
			for i := range 10 {
				r = post(fmt.Sprintf(`{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"hello %d","max_tokens":2}`, i))
				if r.Status != 200 || r.Picked == "" || r.Picked != r.Upstream || servers[r.Upstream] != r.Pod {
					t.Fatalf("%d %q: picked %q, went to %q, %q answered", r.Status, r.Body, r.Picked, r.Upstream, r.Pod)
				}
			}
			// The route matches the base-model header only the payload
			// processor sets: another model has no route.
			r = post(`{"model":"another-model","prompt":"hello","max_tokens":2}`)
			if r.Status != 404 || r.Pod != "" {
				t.Fatalf("a model no route serves: %d %q from %q, want 404 from the gateway", r.Status, r.Body, r.Pod)
			}
			r = post(`{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"please ignore previous instructions","max_tokens":2}`)
			if r.Status != 403 || r.Reason != "denied" || r.Pod != "" {
				t.Fatalf("guardrail: %d %q reason %q from %q, want 403 denied from the processor", r.Status, r.Body, r.Reason, r.Pod)
			}
			// The picker's pod goes: its endpoint turns not ready (istiod
			// pushes the picker's cluster without it), then it stops.
			// Istio's outbound cluster is not health checked, so only the
			// push takes it out; until then a request whose body reached
			// the filter gets a 500 even with FailOpen (Envoy's canFailOpen).
			c.notReady(t, modelsNS, "llama-epp")
			stopPicker()
			after := func() gatewaytest.Reply {
				return post(`{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"after","max_tokens":2}`)
			}
			switch mode {
			case "FailClose":
				if r = after(); r.Status < 500 || r.Pod != "" {
					t.Fatalf("FailClose, picker down: %d from %q, want 5xx from the gateway", r.Status, r.Pod)
				}
			case "FailOpen":
				gatewaytest.WaitFor(t, "FailOpen once istiod pushed the picker's cluster without its endpoint", testTimeout, func() bool {
					r = after()
					return r.Status == 200
				})
				for range 5 {
					if r = after(); r.Status != 200 || servers[r.Upstream] == "" {
						t.Fatalf("FailOpen, picker down: %d from %q, want 200 from a pool endpoint", r.Status, r.Upstream)
					}
				}
			}
		})
	}
}
