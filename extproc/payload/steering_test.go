package payload_test

import (
	"testing"
)

// TestClientCannotSteerUpstream sends the headers that pick or narrow the
// upstream endpoint from the client, on a request with a body, one the
// policy rewrites, one without a body: none reaches the upstream (the
// picker after this processor would obey them), other headers do.
func TestClientCannotSteerUpstream(t *testing.T) {
	steering := []string{"x-gateway-destination-endpoint", "x-gateway-destination-endpoint-subset",
		"x-gateway-destination-endpoint-served", "x-gateway-destination-endpoint-anything", "test-epp-endpoint-selection"}
	var sent []string
	for _, h := range steering {
		sent = append(sent, h, "10.9.9.9:8000")
	}
	sent = append(sent, "x-request-id", "r-1")
	r := newRig(t, []byte(`{"limits":{"maxTokens":100,"maxTokensAction":"clamp"}}`))
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
			res := r.request(t, tc.body, 0, sent...)
			if res.LocalReply != nil {
				t.Fatalf("answered %d", res.LocalReply.Status)
			}
			for _, h := range steering {
				if res.Headers.Has(h) {
					t.Errorf("client-sent %s reached the upstream", h)
				}
			}
			if res.Headers.Get("x-request-id") != "r-1" {
				t.Errorf("x-request-id lost: %v", res.Headers)
			}
		})
	}
}
