package extprocload

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/extproc/payload"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/internal/grpcwire"
)

// TestChat: the body is valid JSON of exactly the size asked for, cut
// into the chunks asked for, or refused when too small.
func TestChat(t *testing.T) {
	for _, tc := range []struct {
		size, chunk, chunks int
	}{
		{1024, 0, 1},
		{65536, 16384, 4},
		{65537, 16384, 5},
		{300, 1000, 1},
	} {
		b, err := Chat("m", tc.size, tc.chunk)
		if err != nil {
			t.Fatalf("size %d: %v", tc.size, err)
		}
		whole := bytes.Join(b.Chunks, nil)
		if len(whole) != tc.size || len(b.Chunks) != tc.chunks || b.Size() != tc.size {
			t.Errorf("size %d chunk %d: %d bytes in %d chunks, want %d in %d", tc.size, tc.chunk, len(whole), len(b.Chunks), tc.size, tc.chunks)
		}
		// What is sent: the headers with the content-length, then a body
		// message per chunk, end of stream on the last only.
		sent := make([]*extprocv3.ProcessingRequest, len(b.wire))
		for i, w := range b.wire {
			msg, rest, ok, err := grpcwire.Split(w)
			sent[i] = &extprocv3.ProcessingRequest{}
			if err != nil || !ok || len(rest) != 0 || proto.Unmarshal(msg, sent[i]) != nil {
				t.Fatalf("size %d: message %d is not one whole gRPC message (%v)", tc.size, i, err)
			}
		}
		if len(sent) != tc.chunks+1 {
			t.Fatalf("size %d: %d messages, want %d", tc.size, len(sent), tc.chunks+1)
		}
		for i, m := range sent[1:] {
			if rb := m.GetRequestBody(); !bytes.Equal(rb.GetBody(), b.Chunks[i]) || rb.GetEndOfStream() != (i == len(sent)-2) {
				t.Errorf("size %d: body message %d does not carry chunk %d, end of stream only on the last", tc.size, i, i)
			}
		}
		var cl string
		for _, h := range sent[0].GetRequestHeaders().GetHeaders().GetHeaders() {
			if h.GetKey() == "content-length" {
				cl = string(h.GetRawValue())
			}
		}
		if cl != strconv.Itoa(tc.size) {
			t.Errorf("size %d: content-length %q", tc.size, cl)
		}
		var v struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal(whole, &v); err != nil || v.Model != "m" {
			t.Errorf("size %d: not a chat request for m: %v", tc.size, err)
		}
	}
	if _, err := Chat("m", 150, 0); err == nil {
		t.Error("a 150-byte chat request: want an error")
	}
}

// TestClosedAgainstPayloadProcessor drives infergate's payload processor,
// in plain text and over TLS: every request of an allowed model is
// answered with its model headers and its body, in 64 KiB bodies cut into
// 16 KiB chunks (more than a stream's first window: the driver waits for
// the server's window updates); a model the policy refuses is an
// immediate response, so a run of only those fails with that answer.
func TestClosedAgainstPayloadProcessor(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) { closedAgainstPayloadProcessor(t, useTLS) })
	}
}

func closedAgainstPayloadProcessor(t *testing.T, useTLS bool) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "payload.yaml")
	if err := os.WriteFile(cfg, []byte("models:\n  allow: [m]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	svc, err := payload.New(payload.Config{Server: server.Options{GRPCAddr: "127.0.0.1:0", TLS: server.TLSOptions{Enabled: useTLS}}, ConfigFile: cfg, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("processor stopped with %v", err)
		}
	})
	conns, err := Dial(svc.GRPCAddr(), useTLS, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Close(conns) })

	allowed, err := Chat("m", 65536, 16384)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Closed(ctx, conns, allowed, 4, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Latencies) == 0 || r.Errors != 0 || r.Rate() <= 0 || r.Quantile(0.99) <= 0 {
		t.Errorf("allowed model: %d answered, %d errors (first %v), %.0f/s", len(r.Latencies), r.Errors, r.First, r.Rate())
	}

	refused, err := Chat("other", 1024, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Closed(ctx, conns, refused, 2, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "immediate response 4") {
		t.Errorf("refused model: want every request failing with the processor's 4xx, got %v", err)
	}
}
