package extprocload

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeProcessor is an ext_proc server on grpc-go whose answer to a whole
// request (headers, then body messages up to end of stream) is answer's.
type fakeProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	answer func(st extprocv3.ExternalProcessor_ProcessServer, body []byte) error
	ended  chan error // each stream's end, as the server saw it
}

func (f *fakeProcessor) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	var body []byte
	for {
		m, err := st.Recv()
		if err != nil {
			f.ended <- err
			return err
		}
		if b := m.GetRequestBody(); b != nil {
			body = append(body, b.GetBody()...)
			if b.GetEndOfStream() {
				break
			}
		}
	}
	if err := f.answer(st, body); err != nil {
		f.ended <- err
		return err
	}
	// Wait for the driver's end of the stream, as a processor does.
	_, err := st.Recv()
	f.ended <- err
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// serveFake serves a fake processor on ln until the test ends or stop.
func serveFake(t *testing.T, ln net.Listener, answer func(extprocv3.ExternalProcessor_ProcessServer, []byte) error) (f *fakeProcessor, stop func()) {
	t.Helper()
	f = &fakeProcessor{answer: answer, ended: make(chan error, 100)}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, f)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return f, gs.Stop
}

// dialSmall makes one connection to addr, closed when the test ends, and
// a 1 KiB chat request to send over it.
func dialSmall(t *testing.T, addr string) (*Conn, Request) {
	t.Helper()
	conns, err := Dial(addr, false, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Close(conns) })
	req, err := Chat("m", 1024, 0)
	if err != nil {
		t.Fatal(err)
	}
	return conns[0], req
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// pick answers as a picker: a destination header, then the body back
// as one streamed message.
func pick(st extprocv3.ExternalProcessor_ProcessServer, body []byte) error {
	if err := st.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte("10.0.0.1:8000")}}}}}}}}); err != nil {
		return err
	}
	return st.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: true}}}}}}})
}

// TestOneAgainstFakeProcessors: the driver's answers and errors as a
// grpc-go server gives them: a request and an answer of many frames each
// (the request waits for window), a gRPC error status, a headers response
// that sets nothing; every stream is ended, seen from the server.
func TestOneAgainstFakeProcessors(t *testing.T) {
	big, err := Chat("m", 300_000, 0) // one message of 300 kB: past the first windows and frame size
	if err != nil {
		t.Fatal(err)
	}
	small, err := Chat("m", 1024, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		req     Request
		answer  func(extprocv3.ExternalProcessor_ProcessServer, []byte) error
		wantErr string // "": answered
	}{
		{"large request and answer", big, func(st extprocv3.ExternalProcessor_ProcessServer, body []byte) error {
			if !bytes.Equal(body, big.Chunks[0]) {
				return status.Error(codes.DataLoss, "the body arrived changed")
			}
			return pick(st, body)
		}, ""},
		{"gRPC error", small, func(extprocv3.ExternalProcessor_ProcessServer, []byte) error {
			return status.Error(codes.ResourceExhausted, "too busy")
		}, "gRPC status 8: too busy"},
		{"no headers set", small, func(st extprocv3.ExternalProcessor_ProcessServer, body []byte) error {
			if err := st.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}); err != nil {
				return err
			}
			return st.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: true}}}}}}})
		}, "no headers set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln := listen(t)
			f, _ := serveFake(t, ln, tc.answer)
			c, _ := dialSmall(t, ln.Addr().String())
			for range 3 {
				d, err := One(context.Background(), c, tc.req)
				switch {
				case tc.wantErr == "" && (err != nil || d <= 0):
					t.Fatalf("latency %v, error %v; want an answer", d, err)
				case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				select {
				case <-f.ended:
				case <-time.After(5 * time.Second):
					t.Fatal("the server's stream did not end")
				}
			}
		})
	}
}

// TestOneSilentProcessor: a request the processor never answers ends with
// its context, and the driver resets its stream.
func TestOneSilentProcessor(t *testing.T) {
	ln := listen(t)
	f, _ := serveFake(t, ln, func(st extprocv3.ExternalProcessor_ProcessServer, _ []byte) error {
		<-st.Context().Done()
		return st.Context().Err()
	})
	c, req := dialSmall(t, ln.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := One(ctx, c, req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the context's deadline", err)
	}
	select {
	case err := <-f.ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the server's stream ended with %v, want it cancelled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream was not reset")
	}
}

// TestConnReconnects: with no server listening a request fails at once;
// once one listens at the address, the same connection reaches it, and
// when it stops, requests fail instead of waiting.
func TestConnReconnects(t *testing.T) {
	ln := listen(t)
	addr := ln.Addr().String()
	_ = ln.Close()
	c, req := dialSmall(t, addr)
	if _, err := One(context.Background(), c, req); err == nil {
		t.Fatal("nothing listens: want an error")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	_, stop := serveFake(t, ln, pick)
	if _, err := One(context.Background(), c, req); err != nil {
		t.Fatalf("after the server started: %v", err)
	}
	stop()
	start := time.Now()
	if _, err := One(context.Background(), c, req); err == nil {
		t.Fatal("after the server stopped: want an error")
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("the request failed only after %v", time.Since(start))
	}
}
