package main

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/infergate/infergate/wasm/wasmtest"
)

// spoofHeaders are the plugin's own headers as a client might send them.
var spoofHeaders = [][2]string{{"x-infergate-masked", "email"}, {"x-gateway-model-name", "evil"}, {"x-gateway-base-model-name", "evil-base"}}

// strictConfig refuses every body the tests send that is not empty.
const strictConfig = `{"models":{"unknown":"reject","allow":["llama"]},"limits":{"maxBodyBytes":10}}`

func chunkedHeaders() [][2]string {
	return append([][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "wasmtest"}, {":path", "/v1/chat/completions"},
		{"transfer-encoding", "chunked"}}, spoofHeaders...)
}

// TestEmptyBodyIsBodiless: a request whose body turns out empty (chunked
// 0\r\n\r\n: the last body callback has no data; or trailers with no data
// before them) gets the answer a request without a body gets, as from the
// ext_proc processor (extproc/payload TestEmptyBodyIsBodiless): it passes,
// without the client's copies of the plugin's headers, whatever the
// policy. Before, reading the empty body failed and the request went on
// with the client's headers.
func TestEmptyBodyIsBodiless(t *testing.T) {
	h := load(t, []byte(strictConfig), wasmtest.Options{})
	ref, err := h.Do(context.Background(), wasmtest.Request{Method: "POST", Path: "/v1/chat/completions",
		Headers: [][2]string{{"transfer-encoding", "chunked"}, spoofHeaders[0], spoofHeaders[1], spoofHeaders[2]}})
	if err != nil {
		t.Fatal(err)
	}
	if ref.Local != nil || slices.ContainsFunc(ref.Headers, isOwnHeader) {
		t.Fatalf("without a body: local %+v, headers %q; want passed without the client's copies", ref.Local, ref.Headers)
	}
	logsBefore := len(h.Logs())
	for _, tc := range []struct {
		name   string
		events func(s *wasmtest.Stream) error
	}{
		{"empty last chunk", func(s *wasmtest.Stream) error { _, err := s.RequestBody(nil, true); return err }},
		{"empty chunks", func(s *wasmtest.Stream) error {
			if _, err := s.RequestBody(nil, false); err != nil {
				return err
			}
			_, err := s.RequestBody(nil, true)
			return err
		}},
		{"trailers only", func(s *wasmtest.Stream) error { _, err := s.RequestTrailers([][2]string{{"x-t", "1"}}); return err }},
		{"empty chunk and trailers", func(s *wasmtest.Stream) error {
			if _, err := s.RequestBody(nil, false); err != nil {
				return err
			}
			_, err := s.RequestTrailers([][2]string{{"x-t", "1"}})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := h.NewStream(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Done() }()
			if act, err := s.RequestHeaders(chunkedHeaders(), false); err != nil || act != wasmtest.ActionPause {
				t.Fatalf("headers: %v, %v; want Pause until the body is in", act, err)
			}
			if err := tc.events(s); err != nil {
				t.Fatal(err)
			}
			if lr := s.LocalResponse(); lr != nil {
				t.Fatalf("answered %d %s; want passed as without a body", lr.Status, lr.Body)
			}
			if !s.RequestComplete() {
				t.Fatal("the request did not go upstream")
			}
			if got := s.RequestHeaderMap(); !slices.Equal(got, ref.Headers) {
				t.Errorf("forwarded headers\n got %q\nwant %q (as without a body)", got, ref.Headers)
			}
			if b := s.ForwardedRequestBody(); len(b) != 0 {
				t.Errorf("forwarded body %q", b)
			}
		})
	}
	if logs := h.Logs()[logsBefore:]; len(logs) != 0 {
		t.Errorf("the plugin logged %q; an empty body is not an error", logs)
	}
}

func isOwnHeader(h [2]string) bool {
	for _, s := range spoofHeaders {
		if h[0] == s[0] {
			return true
		}
	}
	return false
}

// TestTrailersEndTheRequest: when trailers end a request with a body, the
// body callback never sees its end; the plugin decides at the trailers, as
// the ext_proc processor does, with the same answer as without trailers.
// Before, such a request went upstream undecided, unmasked, with the
// client's model headers.
func TestTrailersEndTheRequest(t *testing.T) {
	h := load(t, []byte(`{"models":{"unknown":"reject","bases":[{"name":"llama","adapters":["sql-lora"]}]},`+
		`"pii":[{"name":"email","detector":"email","action":"mask"}]}`), wasmtest.Options{})
	for _, body := range []string{
		`{"model":"sql-lora","prompt":"write to a@example.com"}`, // forwarded: headers set, body masked
		`{"model":"sql-lora","prompt":"no personal data"}`,       // forwarded unchanged
		`{"model":"gpt-4","prompt":"x"}`,                         // refused: unknown model
	} {
		t.Run(body, func(t *testing.T) {
			want, err := h.Do(context.Background(), wasmtest.Request{Path: "/v1/chat/completions", Body: []byte(body),
				Headers: [][2]string{{"transfer-encoding", "chunked"}, spoofHeaders[0], spoofHeaders[1], spoofHeaders[2]}})
			if err != nil {
				t.Fatal(err)
			}
			if want.Local == nil && headerMap(want.Headers)["x-gateway-base-model-name"] != "llama" {
				t.Fatalf("without trailers forwarded %q; want the plugin's model headers", want.Headers)
			}
			s, err := h.NewStream(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Done() }()
			if _, err := s.RequestHeaders(chunkedHeaders(), false); err != nil {
				t.Fatal(err)
			}
			for _, c := range []string{body[:10], body[10:]} {
				if _, err := s.RequestBody([]byte(c), false); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.RequestTrailers([][2]string{{"x-t", "1"}}); err != nil {
				t.Fatal(err)
			}
			if want.Local != nil {
				if lr := s.LocalResponse(); lr == nil || lr.Status != want.Local.Status || string(lr.Body) != string(want.Local.Body) {
					t.Fatalf("with trailers answered %+v, want %d %s", lr, want.Local.Status, want.Local.Body)
				}
				return
			}
			if lr := s.LocalResponse(); lr != nil || !s.RequestComplete() {
				t.Fatalf("with trailers: local %+v, complete %v; want forwarded", lr, s.RequestComplete())
			}
			if got := s.RequestHeaderMap(); !slices.Equal(got, want.Headers) {
				t.Errorf("forwarded headers\n got %q\nwant %q", got, want.Headers)
			}
			if got := s.ForwardedRequestBody(); string(got) != string(want.Body) {
				t.Errorf("forwarded body %q, want %q", got, want.Body)
			}
			if strings.Contains(string(s.ForwardedRequestBody()), "@") || s.RouteCacheCleared() != 1 {
				t.Errorf("body %q, clear_route_cache called %d times", s.ForwardedRequestBody(), s.RouteCacheCleared())
			}
		})
	}
}
