package payload_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/extproc/payload"
)

// TestStreamUsageIsMetered: a streamed chat request that does not ask for
// its usage is sent on asking for it, its tokens are reported, and the
// client gets the stream it asked for (no usage chunk); a client that asked
// keeps its chunk; other APIs and non-streamed requests pass as sent.
func TestStreamUsageIsMetered(t *testing.T) {
	r := newUsageRig(t)
	const (
		first = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n"
		usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2,\"total_tokens\":13}}\n\n"
		done  = "data: [DONE]\n\n"
	)
	for _, c := range []struct {
		name, path, body string
		added            bool // stream_options.include_usage added
	}{
		{"chat, not asked", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, true},
		{"completions with a query, asked not to", "/v1/completions?x=1", `{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":false}}`, true},
		// The servers (uvicorn) decode the path before routing it.
		{"chat, path percent-encoded", "/v1/chat/completion%73", `{"model":"m","messages":[],"stream":true}`, true},
		{"completions, path percent-encoded", "/v1/%63ompletions?stream=1", `{"model":"m","prompt":"hi","stream":"true"}`, true},
		{"chat, asked", "/v1/chat/completions", `{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}`, false},
		{"not streamed", "/v1/chat/completions", `{"model":"m","messages":[]}`, false},
		{"Anthropic messages", "/v1/messages", `{"model":"m","messages":[],"stream":true,"max_tokens":5}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ex := r.client.Open(ctx)
			defer ex.Close()
			req, err := ex.RunRequest(extprocfilter.Request{Path: c.path, Body: [][]byte{[]byte(c.body)}})
			if err != nil {
				t.Fatal(err)
			}
			var sent struct {
				StreamOptions struct {
					IncludeUsage bool `json:"include_usage"`
				} `json:"stream_options"`
			}
			if err := json.Unmarshal(req.Body, &sent); err != nil {
				t.Fatalf("forwarded body is not JSON: %v\n%s", err, req.Body)
			}
			if c.added != (string(req.Body) != c.body) || (c.added && !sent.StreamOptions.IncludeUsage) {
				t.Fatalf("forwarded %s; include_usage added: want %t", req.Body, c.added)
			}
			if c.body[len(c.body)-2:] == "[]}" { // not streamed: no SSE to check
				return
			}
			res, err := ex.RunResponse(extprocfilter.Response{Headers: extprocfilter.Headers{{Key: "content-type", Value: "text/event-stream"}},
				Body: [][]byte{[]byte(first), []byte(usage[:30]), []byte(usage[30:] + done)}})
			if err != nil {
				t.Fatal(err)
			}
			want := first + usage + done
			if c.added {
				want = first + done
			}
			if string(res.Body) != want {
				t.Fatalf("client got %q, want %q", res.Body, want)
			}
			if got := res.DynamicMetadata[payload.MetadataNamespace].GetFields()["llm_total_token"].GetNumberValue(); got != 13 {
				t.Fatalf("llm_total_token %v, want 13", got)
			}
		})
	}
}
