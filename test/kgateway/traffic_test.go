package kgateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/test/gatewaytest"
)

// reply is what a request through the Gateway came back with: the
// status, the endpoint the stand-in sent it to, the model server that
// answered, and the endpoint the request's envoy.lb metadata names.
type reply struct {
	status                int
	upstream, pod, picked string
	body                  string
}

func send(t *testing.T, method, url, path, body string) reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(gatewaytest.Ctx(t), method, url+path, rd)
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
	r := reply{status: resp.StatusCode, upstream: resp.Header.Get(envoysim.UpstreamHeader), pod: resp.Header.Get("x-inference-pod"), body: string(b)}
	var lb struct {
		Dest string `json:"x-gateway-destination-endpoint"`
	}
	_ = json.Unmarshal([]byte(resp.Header.Get(envoysim.DebugMetadataHeader)), &lb)
	r.picked = lb.Dest
	return r
}

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
	var r reply
	gatewaytest.WaitFor(t, "a first answer from a model server", testTimeout, func() bool {
		r = send(t, http.MethodPost, base, "/v1/completions", completion("hello"))
		return r.status == 200
	})
	picks := map[string]int{}
	for i := range 10 {
		r = send(t, http.MethodPost, base, "/v1/completions", completion(fmt.Sprintf("hello %d", i)))
		if r.status != 200 || r.picked == "" || r.picked != r.upstream || servers[r.upstream] != r.pod {
			t.Fatalf("%d %q: picked %q, went to %q, %q answered", r.status, r.body, r.picked, r.upstream, r.pod)
		}
		picks[r.picked]++
	}
	t.Logf("picks %v", picks)

	stopPicker()
	switch mode {
	case inferencev1.EndpointPickerFailClose:
		if r = send(t, http.MethodPost, base, "/v1/completions", completion("after")); r.status < 500 || r.pod != "" {
			t.Fatalf("FailClose, picker down: %d from %q, want 5xx from the gateway", r.status, r.pod)
		}
	case inferencev1.EndpointPickerFailOpen:
		for range 4 {
			if r = send(t, http.MethodGet, base, "/v1/models", ""); r.status != 200 || servers[r.upstream] == "" || r.picked != "" {
				t.Fatalf("FailOpen, picker down, no body: %d from %q (picked %q), want 200 from a pool endpoint", r.status, r.upstream, r.picked)
			}
		}
		if r = send(t, http.MethodPost, base, "/v1/completions", completion("after")); r.status != 500 || r.pod != "" {
			t.Fatalf("FailOpen, picker down, a body: %d from %q, want Envoy's 500", r.status, r.pod)
		}
	}
}

// kgatewayListener is the name kgateway gives the Gateway's port-80
// listener.
const kgatewayListener = "listener~80"
