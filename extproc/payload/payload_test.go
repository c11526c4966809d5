package payload_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/extproc/payload"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/policy/policytest"
)

// rig is a payload processor on loopback with the Envoy stand-in client.
type rig struct {
	svc    *payload.Service
	client *extprocfilter.Client
	cfg    string
}

// newRig writes configJSON as the YAML file the processor reads (the
// vectors hold JSON; the file form is YAML) and starts the processor; nil
// is the empty policy, {}. Streamed requests are forwarded as sent, so the
// tests see the policy alone; newUsageRig turns usage metering on.
func newRig(t testing.TB, configJSON []byte) *rig {
	return startRig(t, configJSON, true)
}

// newUsageRig is newRig with the processor's default stream usage
// metering (stream_options.include_usage added).
func newUsageRig(t testing.TB) *rig { return startRig(t, nil, false) }

func startRig(t testing.TB, configJSON []byte, keepStreamOptions bool) *rig {
	t.Helper()
	return startRigWith(t, configJSON, func(c *payload.Config) { c.KeepStreamOptions = keepStreamOptions })
}

// startRigWith is startRig with the processor's Config changed by tune.
func startRigWith(t testing.TB, configJSON []byte, tune func(*payload.Config)) *rig {
	t.Helper()
	if configJSON == nil {
		configJSON = []byte("{}") // a null document is refused
	}
	path := filepath.Join(t.TempDir(), "payload.yaml")
	y, err := yaml.JSONToYAML(configJSON)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, y, 0o600); err != nil {
		t.Fatal(err)
	}
	return serve(t, path, tune)
}

// serve starts the processor on the policy file at path, its Config
// changed by tune, with the Envoy stand-in client; both stop with the test.
func serve(t testing.TB, path string, tune func(*payload.Config)) *rig {
	t.Helper()
	cfg := payload.Config{
		Server:     server.Options{GRPCAddr: "127.0.0.1:0", Limits: server.Limits{MaxRequestBodyBytes: 1 << 20}},
		ConfigFile: path, ConfigPoll: 10 * time.Millisecond, Logger: logr.Discard()}
	tune(&cfg)
	svc, err := payload.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	client, err := extprocfilter.NewClient(extprocfilter.FilterConfig{Name: "payload", Target: svc.GRPCAddr(), MessageTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("processor stopped with %v", err)
		}
	})
	return &rig{svc: svc, client: client, cfg: path}
}

func (r *rig) request(t testing.TB, body []byte, chunk int, headers ...string) *extprocfilter.Result {
	t.Helper()
	req := extprocfilter.Request{Path: "/v1/chat/completions", Headers: extprocfilter.Headers{{Key: "content-type", Value: "application/json"}, {Key: "content-length", Value: strconv.Itoa(len(body))}}}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Headers = append(req.Headers, extprocfilter.Header{Key: headers[i], Value: headers[i+1]})
	}
	for len(body) > 0 {
		n := len(body)
		if chunk > 0 {
			n = min(chunk, n)
		}
		req.Body = append(req.Body, body[:n])
		body = body[n:]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ex := r.client.Open(ctx)
	defer ex.Close()
	res, err := ex.RunRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func outcome(res *extprocfilter.Result) policytest.Outcome {
	if lr := res.LocalReply; lr != nil {
		return policytest.Outcome{Status: lr.Status, Headers: headerMap(lr.Headers), Body: lr.Body}
	}
	return policytest.Outcome{Status: 200, Headers: headerMap(res.Headers), Body: res.Body}
}

func headerMap(h extprocfilter.Headers) map[string]string {
	m := make(map[string]string, len(h))
	for _, kv := range h {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestVectors runs the shared vectors through the processor over real
// gRPC, whole and in small chunks.
func TestVectors(t *testing.T) {
	top := t
	rigs := map[string]*rig{}
	policytest.Run(t, func(t *testing.T, v *policytest.Vector, chunk int) policytest.Outcome {
		r := rigs[v.ConfigName]
		if r == nil {
			r = newRig(top, v.Config) // lives as long as the whole test
			rigs[v.ConfigName] = r
		}
		var headers []string
		for _, h := range v.HeaderPairs() {
			headers = append(headers, h[0], h[1])
		}
		res := r.request(t, v.Body, chunk, headers...)
		got := outcome(res)
		if got.Status != 200 {
			return got
		}
		if !res.ClearRouteCache {
			t.Error("clear_route_cache not set")
		}
		// The stand-in drops content-length in FULL_DUPLEX_STREAMED as
		// Envoy does; the processor must still have set it right.
		if cl, ok := contentLengthSet(res); string(v.ForwardedBody) != string(v.Body) && (!ok || cl != strconv.Itoa(len(got.Body))) {
			t.Errorf("content-length set to %q (%v) for a rewritten body of %d bytes", cl, ok, len(got.Body))
		}
		if md := res.DynamicMetadata[payload.MetadataNamespace].GetFields(); md["model"].GetStringValue() != got.Headers["x-gateway-model-name"] {
			t.Errorf("metadata model %v, header %q", md["model"], got.Headers["x-gateway-model-name"])
		}
		return got
	})
}

// contentLengthSet finds the content-length the processor set on the
// request headers, if it did.
func contentLengthSet(res *extprocfilter.Result) (string, bool) {
	for _, r := range res.Responses {
		for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == "content-length" {
				return string(h.GetHeader().GetRawValue()), true
			}
		}
	}
	return "", false
}

// TestClientCannotSetProcessorHeaders sends the processor's own headers
// from the client, with a body and without: none of the client's values
// reach the upstream.
func TestClientCannotSetProcessorHeaders(t *testing.T) {
	r := newRig(t, nil)
	spoof := []string{"x-infergate-masked", "email", "x-gateway-model-name", "evil", "x-gateway-base-model-name", "evil"}
	res := r.request(t, []byte(`{"model":"m","prompt":"x"}`), 0, spoof...)
	if res.Headers.Has("x-infergate-masked") || res.Headers.Get("x-gateway-model-name") != "m" || res.Headers.Get("x-gateway-base-model-name") != "m" {
		t.Errorf("with a body, client values survived: %v", res.Headers)
	}
	res = r.request(t, nil, 0, spoof...)
	for _, h := range []string{"x-infergate-masked", "x-gateway-model-name", "x-gateway-base-model-name"} {
		if res.Headers.Has(h) {
			t.Errorf("without a body, client-sent %s reached the upstream: %v", h, res.Headers)
		}
	}
}

// TestUsageReportedWithoutHoldingTheStream streams an SSE response through
// the processor: every chunk comes back as it went in (nothing held until
// the end) and the usage of the last event is emitted as metadata.
func TestUsageReportedWithoutHoldingTheStream(t *testing.T) {
	r := newRig(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ex := r.client.Open(ctx)
	defer ex.Close()
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`)
	if _, err := ex.RunRequest(extprocfilter.Request{Body: [][]byte{body}}); err != nil {
		t.Fatal(err)
	}
	events := [][]byte{
		[]byte("data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n"),
		[]byte("data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,"),
		[]byte("\"completion_tokens\":2,\"total_tokens\":13}}\n\ndata: [DONE]\n\n"),
	}
	res, err := ex.RunResponse(extprocfilter.Response{Headers: extprocfilter.Headers{{Key: "content-type", Value: "text/event-stream"}}, Body: events})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.BodyChunkSizes) != len(events) {
		t.Errorf("response came back in %d chunks %v, want the %d that went in", len(res.BodyChunkSizes), res.BodyChunkSizes, len(events))
	}
	md := res.DynamicMetadata[payload.MetadataNamespace].GetFields()
	for k, want := range map[string]float64{"llm_input_token": 11, "llm_output_token": 2, "llm_total_token": 13} {
		if got := md[k].GetNumberValue(); got != want {
			t.Errorf("%s = %v, want %v (metadata %v)", k, got, want, md)
		}
	}
}

// TestLargeAnswerUsageIsReported: a non-streamed answer over a mebibyte
// (a long completion, logprobs) is metered like a short one.
func TestLargeAnswerUsageIsReported(t *testing.T) {
	r := newRig(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ex := r.client.Open(ctx)
	defer ex.Close()
	if _, err := ex.RunRequest(extprocfilter.Request{Body: [][]byte{[]byte(`{"model":"m","prompt":"hi"}`)}}); err != nil {
		t.Fatal(err)
	}
	answer := []byte(`{"choices":[{"text":"` + strings.Repeat("word ", 600_000) + `"}],"usage":{"prompt_tokens":1,"completion_tokens":600000,"total_tokens":600001}}`)
	var chunks [][]byte
	for b := answer; len(b) > 0; b = b[min(len(b), 64<<10):] {
		chunks = append(chunks, b[:min(len(b), 64<<10)])
	}
	res, err := ex.RunResponse(extprocfilter.Response{Headers: extprocfilter.Headers{{Key: "content-type", Value: "application/json"}}, Body: chunks})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Body) != len(answer) {
		t.Errorf("client got %d bytes of the %d-byte answer", len(res.Body), len(answer))
	}
	if got := res.DynamicMetadata[payload.MetadataNamespace].GetFields()["llm_total_token"].GetNumberValue(); got != 600001 {
		t.Errorf("llm_total_token %v, want 600001", got)
	}
}

// gatedBody sends its first chunk at once and the rest when the gate opens,
// so a stream can be held open half sent.
type gatedBody struct {
	first, rest []byte
	gate        chan struct{}
	sent        chan struct{} // closed once the first chunk is handed over
	step        int
}

func (b *gatedBody) Next(ctx context.Context) (extprocfilter.Chunk, error) {
	b.step++
	switch b.step {
	case 1:
		close(b.sent)
		return extprocfilter.Chunk{Data: b.first}, nil
	case 2:
		select {
		case <-b.gate:
		case <-ctx.Done():
			return extprocfilter.Chunk{}, ctx.Err()
		}
		return extprocfilter.Chunk{Data: b.rest, EndOfStream: true}, nil
	}
	return extprocfilter.Chunk{}, io.EOF
}

func (b *gatedBody) Close() error { return nil }

// TestReloadKeepsOpenStreams changes the policy while a request is half
// sent: the open stream finishes under the policy it started with, the
// next one gets the new; a broken edit keeps the last good policy.
func TestReloadKeepsOpenStreams(t *testing.T) {
	r := newRig(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body := []byte(`{"model":"gpt-4","prompt":"x"}`)
	write := func(data string) {
		if err := os.WriteFile(r.cfg, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	open := r.client.Open(ctx)
	defer open.Close()
	gated := &gatedBody{first: body[:5], rest: body[5:], gate: make(chan struct{}), sent: make(chan struct{})}
	type answer struct {
		h   extprocfilter.Headers
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		h, b, err := open.Request(extprocfilter.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/completions"}}, gated)
		if err == nil {
			_, _, err = extprocfilter.ReadAll(ctx, b)
		}
		answered <- answer{h, err}
	}()
	<-gated.sent // the headers went first: the stream has its policy
	write("models:\n  allow: [llama-*]\n")
	waitFor(t, func() bool { return outcome(r.request(t, body, 0)).Status == 403 })
	close(gated.gate)
	a := <-answered
	if a.err != nil || a.h.Get("x-gateway-model-name") != "gpt-4" {
		t.Fatalf("the open stream did not finish under its first policy: %v %v", a.err, a.h)
	}
	for _, bad := range []string{"models:\n  allow: [\n", ""} { // broken; emptied
		write(bad)
		time.Sleep(100 * time.Millisecond)
		if got := outcome(r.request(t, body, 0)).Status; got != 403 {
			t.Errorf("after writing %q: status %d, want 403 from the last good policy", bad, got)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
