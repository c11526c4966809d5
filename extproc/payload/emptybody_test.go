package payload_test

import (
	"context"
	"testing"
	"time"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// TestEmptyBodyIsBodiless: a request whose body turns out empty (an
// end-of-stream chunk with no data, as chunked "0\r\n\r\n" arrives) is
// answered like one without a body: it passes, minus any client copy of
// the processor's headers, whatever the policy. The Wasm plugin answers
// it the same way (wasm/payload TestEmptyBodyIsBodiless).
func TestEmptyBodyIsBodiless(t *testing.T) {
	r := newRig(t, []byte(`{"models":{"unknown":"reject","allow":["llama"]},"limits":{"maxBodyBytes":10}}`))
	spoof := extprocfilter.Headers{{Key: "x-infergate-masked", Value: "email"}, {Key: "x-gateway-model-name", Value: "evil"},
		{Key: "x-gateway-base-model-name", Value: "evil"}, {Key: "transfer-encoding", Value: "chunked"}}
	for _, tc := range []struct {
		name string
		req  extprocfilter.Request
	}{
		{"no body", extprocfilter.Request{Method: "POST", Path: "/v1/completions", Headers: spoof}},
		{"empty body", extprocfilter.Request{Path: "/v1/completions", Headers: spoof, Body: [][]byte{{}}}},
		{"empty body and trailers", extprocfilter.Request{Path: "/v1/completions", Headers: spoof, Body: [][]byte{{}},
			Trailers: extprocfilter.Headers{{Key: "x-trailer", Value: "1"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ex := r.client.Open(ctx)
			defer ex.Close()
			res, err := ex.RunRequest(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if res.LocalReply != nil {
				t.Fatalf("answered %d %s, want it passed", res.LocalReply.Status, res.LocalReply.Body)
			}
			for _, h := range []string{"x-infergate-masked", "x-gateway-model-name", "x-gateway-base-model-name"} {
				if res.Headers.Has(h) {
					t.Errorf("client-sent %s reached the upstream: %v", h, res.Headers)
				}
			}
			if len(res.Body) != 0 {
				t.Errorf("forwarded body %q", res.Body)
			}
		})
	}
}
