package main

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/infergate/infergate/wasm/wasmtest"
)

// TestClientCannotSteerUpstream sends the headers that pick or narrow the
// upstream endpoint from the client, on a request with a body, one the
// policy rewrites, one without a body: none reaches the upstream (the
// picker after this filter would obey them), other headers do.
func TestClientCannotSteerUpstream(t *testing.T) {
	steering := []string{"x-gateway-destination-endpoint", "x-gateway-destination-endpoint-subset",
		"x-gateway-destination-endpoint-served", "x-gateway-destination-endpoint-anything", "test-epp-endpoint-selection"}
	sent := [][2]string{{"x-request-id", "r-1"}}
	for _, h := range steering {
		sent = append(sent, [2]string{h, "10.9.9.9:8000"})
	}
	h := load(t, []byte(`{"limits":{"maxTokens":100,"maxTokensAction":"clamp"}}`), wasmtest.Options{})
	cases := []struct {
		name string
		body []byte
	}{
		{"forwarded", []byte(`{"model":"m","prompt":"x"}`)},
		{"rewritten", []byte(`{"model":"m","prompt":"x","max_tokens":1000}`)},
		{"bodiless", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := h.Do(context.Background(), wasmtest.Request{Path: "/v1/completions", Headers: sent, Body: tc.body})
			if err != nil {
				t.Fatal(err)
			}
			if res.Local != nil {
				t.Fatalf("answered %d %s", res.Local.Status, res.Local.Body)
			}
			got := headerMap(res.Headers)
			for _, name := range steering {
				if v, ok := got[name]; ok {
					t.Errorf("client-sent %s %q reached the upstream", name, v)
				}
			}
			if got["x-request-id"] != "r-1" {
				t.Errorf("x-request-id lost: %v", got)
			}
		})
	}
}

// TestStripFailureRefuses: when the plugin cannot read the request
// headers, it cannot tell which steering headers to drop, so it refuses
// the request rather than let them reach the picker.
func TestStripFailureRefuses(t *testing.T) {
	var armed atomic.Bool // after Load, which also reads no headers
	h := load(t, nil, wasmtest.Options{Fault: func(call string) uint32 {
		if armed.Load() && call == "proxy_get_header_map_pairs" {
			return 10 // InternalFailure
		}
		return 0
	}})
	armed.Store(true)
	for _, body := range [][]byte{nil, []byte(`{"model":"m","prompt":"x"}`)} {
		res, err := h.Do(context.Background(), wasmtest.Request{Path: "/v1/completions",
			Headers: [][2]string{{"x-gateway-destination-endpoint", "10.9.9.9:8000"}}, Body: body})
		if err != nil {
			t.Fatal(err)
		}
		if res.Local == nil || res.Local.Status != 500 {
			t.Errorf("body %q: forwarded with headers %q, want a 500 answer", body, res.Headers)
		}
	}
}

// TestNoConfigFailsStart: a plugin configuration that is JSON null would
// run without guardrails; it fails the start like an invalid one.
func TestNoConfigFailsStart(t *testing.T) {
	for _, cfg := range []string{"null", " null\n"} {
		t.Run(strings.TrimSpace(cfg), func(t *testing.T) {
			_, err := wasmtest.Load(context.Background(), build.get(t), wasmtest.Options{PluginConfig: []byte(cfg), CompilationCacheDir: cacheDir(t)})
			if err == nil {
				t.Fatal("a null configuration started")
			}
			if !strings.Contains(err.Error(), "empty or null") {
				t.Errorf("error %v does not say why (the guest logs it)", err)
			}
		})
	}
}
