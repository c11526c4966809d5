package sim

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestEchoContract: the answers the upstream conformance suite reads from
// its echo-basic model servers, over real HTTP.
func TestEchoContract(t *testing.T) {
	ts := start(t, Config{Name: "primary-inference-model-server-abc", Echo: &Echo{Namespace: "inference-conformance-app-backend"}})
	for _, tc := range []struct {
		name, method, path, body string
		header                   map[string]string
		status                   int
		wantHeaders              map[string]string
	}{
		{name: "a completion is echoed", method: "POST", path: "/v1/completions",
			body:   `{"model":"conformance-fake-model","prompt":"Write as if you were a critic: San Francisco"}`,
			header: map[string]string{"X-Echo-Set-Header": "x-conformance-test-served-endpoint:10.0.0.1:3000"}, status: 200,
			wantHeaders: map[string]string{"x-conformance-test-served-endpoint": "10.0.0.1:3000"}},
		{name: "two headers in one value", method: "GET", path: "/anything?x=1",
			header: map[string]string{"X-Echo-Set-Header": "a:1, b:2"}, status: 200, wantHeaders: map[string]string{"a": "1", "b": "2"}},
		{name: "health", method: "GET", path: "/health", status: 200},
		{name: "status path", method: "GET", path: "/status/503", status: 503},
		{name: "bad status path", method: "GET", path: "/status/abc", status: 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, ts.url+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Host = "primary.example.com"
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			for k, v := range tc.wantHeaders {
				if got := resp.Header.Values(k); len(got) != 1 || got[0] != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if tc.status != 200 || tc.path == "/health" {
				return
			}
			var echo map[string]any
			if err := json.Unmarshal(body, &echo); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, body)
			}
			if echo["path"] != tc.path || echo["method"] != tc.method || echo["host"] != "primary.example.com" || echo["proto"] != "HTTP/1.1" ||
				echo["pod"] != "primary-inference-model-server-abc" || echo["namespace"] != "inference-conformance-app-backend" || echo["httpPort"] != ts.port {
				t.Fatalf("echo %v", echo)
			}
			headers, _ := echo["headers"].(map[string]any)
			if hs, _ := headers["X-Echo-Set-Header"].([]any); len(hs) != 1 {
				t.Fatalf("request headers not echoed: %v", headers)
			}
		})
	}
}
