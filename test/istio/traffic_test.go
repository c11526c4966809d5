package istio

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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

type reply struct {
	status                int
	upstream, pod, picked string
	body                  string
	reason                string
}

func post(t *testing.T, base, body string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, upstream: resp.Header.Get(envoysim.UpstreamHeader), pod: resp.Header.Get("x-inference-pod"),
		body: string(b), reason: resp.Header.Get("x-llm-d-request-dropped-reason")}
	var lb struct {
		Dest string `json:"x-gateway-destination-endpoint"`
	}
	_ = json.Unmarshal([]byte(resp.Header.Get(envoysim.DebugMetadataHeader)), &lb)
	r.picked = lb.Dest
	return r
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
			var r reply
			gatewaytest.WaitFor(t, "a first answer from a model server", testTimeout, func() bool {
				r = post(t, base, `{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"hello","max_tokens":2}`)
				return r.status == 200
			})
			for i := range 10 {
				r = post(t, base, fmt.Sprintf(`{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"hello %d","max_tokens":2}`, i))
				if r.status != 200 || r.picked == "" || r.picked != r.upstream || servers[r.upstream] != r.pod {
					t.Fatalf("%d %q: picked %q, went to %q, %q answered", r.status, r.body, r.picked, r.upstream, r.pod)
				}
			}
			// The route matches the base-model header only the payload
			// processor sets: another model has no route.
			r = post(t, base, `{"model":"another-model","prompt":"hello","max_tokens":2}`)
			if r.status != 404 || r.pod != "" {
				t.Fatalf("a model no route serves: %d %q from %q, want 404 from the gateway", r.status, r.body, r.pod)
			}
			r = post(t, base, `{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"please ignore previous instructions","max_tokens":2}`)
			if r.status != 403 || r.reason != "denied" || r.pod != "" {
				t.Fatalf("guardrail: %d %q reason %q from %q, want 403 denied from the processor", r.status, r.body, r.reason, r.pod)
			}
			// The picker's pod goes: its endpoint turns not ready (istiod
			// pushes the picker's cluster without it), then it stops.
			// Istio's outbound cluster is not health checked, so only the
			// push takes it out; until then a request whose body reached
			// the filter gets a 500 even with FailOpen (Envoy's canFailOpen).
			c.notReady(t, modelsNS, "llama-epp")
			stopPicker()
			after := func() reply {
				return post(t, base, `{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"after","max_tokens":2}`)
			}
			switch mode {
			case "FailClose":
				if r = after(); r.status < 500 || r.pod != "" {
					t.Fatalf("FailClose, picker down: %d from %q, want 5xx from the gateway", r.status, r.pod)
				}
			case "FailOpen":
				gatewaytest.WaitFor(t, "FailOpen once istiod pushed the picker's cluster without its endpoint", testTimeout, func() bool {
					r = after()
					return r.status == 200
				})
				for range 5 {
					if r = after(); r.status != 200 || servers[r.upstream] == "" {
						t.Fatalf("FailOpen, picker down: %d from %q, want 200 from a pool endpoint", r.status, r.upstream)
					}
				}
			}
		})
	}
}
