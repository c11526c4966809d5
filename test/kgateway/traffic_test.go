package kgateway

import (
	"fmt"
	"net/http"
	"testing"

	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/test/gatewaytest"
)

func completion(prompt string) string {
	return fmt.Sprintf(`{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":%q,"max_tokens":2}`, prompt)
}

// TestTrafficThroughKgateway: the stand-in takes kgateway's xDS as the
// Gateway's Envoy, with infergate's picker and two simulated model
// servers live. Each request goes where the picker sent it: its header,
// copied into envoy.lb by header_to_metadata, names the subset of one
// pool endpoint. With the picker gone, FailClose answers 5xx; FailOpen
// sends a request without a body to any pool endpoint (the subset load
// balancer's ANY_ENDPOINT fallback), but a request whose body reached the
// ext_proc filter still gets a 500: kgateway's picker cluster has no
// health check, so Envoy opens the stream to the dead picker, the body
// follows the headers, and a FULL_DUPLEX_STREAMED filter that has passed
// body data on can no longer fail open (ext_proc.cc, processor_state.cc
// canFailOpen).
func TestTrafficThroughKgateway(t *testing.T) {
	for _, mode := range []inferencev1.EndpointPickerFailureMode{inferencev1.EndpointPickerFailClose, inferencev1.EndpointPickerFailOpen} {
		t.Run(string(mode), func(t *testing.T) { checkTraffic(t, mode) })
	}
}

func checkTraffic(t *testing.T, mode inferencev1.EndpointPickerFailureMode) {
	c := startCluster(t)
	servers := gatewaytest.ModelServers(t, poolName, 2, modelPort)
	stopPicker := gatewaytest.StartPicker(t, fmt.Sprintf("%s:%d", podAddr(pickerIndex), pickerPort), servers)
	c.install(t, mode, 2)
	n := standIn(t)
	base := gatewaytest.ListenerURL(t, n, kgatewayListener)
	var r gatewaytest.Reply
	gatewaytest.WaitFor(t, "a first answer from a model server", testTimeout, func() bool {
		r = gatewaytest.Send(t, http.MethodPost, base+"/v1/completions", completion("hello"))
		return r.Status == 200
	})
	picks := map[string]int{}
	for i := range 10 {
		r = gatewaytest.Send(t, http.MethodPost, base+"/v1/completions", completion(fmt.Sprintf("hello %d", i)))
		if r.Status != 200 || r.Picked == "" || r.Picked != r.Upstream || servers[r.Upstream] != r.Pod {
			t.Fatalf("%d %q: picked %q, went to %q, %q answered", r.Status, r.Body, r.Picked, r.Upstream, r.Pod)
		}
		picks[r.Picked]++
	}
	t.Logf("picks %v", picks)

	stopPicker()
	switch mode {
	case inferencev1.EndpointPickerFailClose:
		if r = gatewaytest.Send(t, http.MethodPost, base+"/v1/completions", completion("after")); r.Status < 500 || r.Pod != "" {
			t.Fatalf("FailClose, picker down: %d from %q, want 5xx from the gateway", r.Status, r.Pod)
		}
	case inferencev1.EndpointPickerFailOpen:
		for range 4 {
			if r = gatewaytest.Send(t, http.MethodGet, base+"/v1/models", ""); r.Status != 200 || servers[r.Upstream] == "" || r.Picked != "" {
				t.Fatalf("FailOpen, picker down, no body: %d from %q (picked %q), want 200 from a pool endpoint", r.Status, r.Upstream, r.Picked)
			}
		}
		if r = gatewaytest.Send(t, http.MethodPost, base+"/v1/completions", completion("after")); r.Status != 500 || r.Pod != "" {
			t.Fatalf("FailOpen, picker down, a body: %d from %q, want Envoy's 500", r.Status, r.Pod)
		}
	}
}

// kgatewayListener is the name kgateway gives the Gateway's port-80
// listener.
const kgatewayListener = "listener~80"
