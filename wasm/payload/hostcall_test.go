package main

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/infergate/infergate/inference/wire"
	"github.com/infergate/infergate/wasm/wasmtest"
)

// TestHostCallFailureRefuses makes each host call the plugin changes or
// reads the request with fail in turn: the request never goes upstream
// (where the client's copies of the model headers, or an unmasked body,
// could still be in it) but is answered 500 processing-failed.
func TestHostCallFailureRefuses(t *testing.T) {
	var faulted atomic.Pointer[[]string] // host calls that fail; armed after Load
	h := load(t, []byte(`{"pii":[{"name":"email","detector":"email","action":"mask"}]}`), wasmtest.Options{
		Fault: func(call string) uint32 {
			if f := faulted.Load(); f != nil {
				for _, c := range *f {
					if c == call {
						return 10 // InternalFailure
					}
				}
			}
			return 0
		},
	})
	plain, masked := []byte(`{"model":"m","prompt":"x"}`), []byte(`{"model":"m","prompt":"a@example.com"}`)
	for _, tc := range []struct {
		name  string
		calls []string
		body  []byte // nil: no body; empty: an empty last chunk
	}{
		{"no body, removing headers", []string{"proxy_remove_header_map_value"}, nil},
		{"empty body, removing headers", []string{"proxy_remove_header_map_value"}, []byte{}},
		{"body, removing the masked marker", []string{"proxy_remove_header_map_value"}, plain},
		{"body, setting the model headers", []string{"proxy_replace_header_map_value"}, plain},
		{"body, reading it", []string{"proxy_get_buffer_bytes"}, plain},
		{"body, replacing the masked body", []string{"proxy_set_buffer_bytes"}, masked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			faulted.Store(&tc.calls)
			defer faulted.Store(nil)
			logged := len(h.Logs())
			s := send(t, h, tc.body)
			defer func() { _ = s.Done() }()
			if s.RequestComplete() {
				t.Fatalf("the request went upstream with headers %q", s.RequestHeaderMap())
			}
			lr := s.LocalResponse()
			if lr == nil {
				t.Fatal("no answer: the request would hang")
			}
			if lr.Status != 500 || headerMap(lr.Headers)[wire.DropReasonHeader] != "processing-failed" ||
				!strings.Contains(string(lr.Body), `"type":"processing-failed"`) {
				t.Errorf("answered %d %q %s; want 500 processing-failed", lr.Status, lr.Headers, lr.Body)
			}
			if logs := strings.Join(h.Logs()[logged:], "\n"); !strings.Contains(logs, "refusing the request") {
				t.Errorf("nothing logged:\n%s", logs)
			}
		})
	}

	// Nor when the answer cannot be sent either: the request stays held.
	calls := []string{"proxy_remove_header_map_value", "proxy_send_local_response"}
	faulted.Store(&calls)
	defer faulted.Store(nil)
	res, err := h.Do(context.Background(), wasmtest.Request{Headers: spoofHeaders})
	if !errors.Is(err, wasmtest.ErrStalled) {
		t.Errorf("with no way to answer: %+v, %v; want the request held (ErrStalled)", res, err)
	}
}

// send runs a request carrying the client's copies of the plugin's
// headers: without a body when body is nil, else body as one last chunk.
func send(t *testing.T, h *wasmtest.Host, body []byte) *wasmtest.Stream {
	t.Helper()
	s, err := h.NewStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hs := append([][2]string{{":method", "POST"}, {":path", "/v1/completions"}}, spoofHeaders...)
	if _, err := s.RequestHeaders(hs, body == nil); err != nil {
		t.Fatal(err)
	}
	if body != nil && s.LocalResponse() == nil {
		if _, err := s.RequestBody(body, true); err != nil {
			t.Fatal(err)
		}
	}
	return s
}
