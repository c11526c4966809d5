// Command extprocfloor serves the least an endpoint picker can do over
// ext_proc: read a request's headers and body, answer one fixed
// destination header, send the body back. Driven like a picker
// (bench/eppload --target), it shows what the transport alone costs on a
// machine and how long its latency tail is: with --transport grpc-go the
// floor under any picker built on grpc-go with its defaults, with
// --transport h2 under one on extproc/h2server (serveH2).
//
//	go run ./bench/extprocfloor --transport grpc-go --addr 127.0.0.1:19999 &
//	go run ./bench/eppload --target 127.0.0.1:19999 --pid $! --streams 32 --rate 0
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/infergate/infergate/inference/wire"
	"google.golang.org/grpc"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:19999", "address to serve ext_proc on, in plain text")
	transport := flag.String("transport", "grpc-go", "grpc-go, or h2 (extproc/h2server)")
	flag.Parse()
	serve := transportNamed(*transport)
	if serve == nil {
		fmt.Fprintf(os.Stderr, "extprocfloor: --transport %q is neither grpc-go nor h2\n", *transport)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "extprocfloor:", err)
		os.Exit(1)
	}
	fmt.Printf("extprocfloor: serving ext_proc on %s over %s\n", ln.Addr(), *transport)
	if err := serve(ctx, ln); err != nil {
		fmt.Fprintln(os.Stderr, "extprocfloor:", err)
		os.Exit(1)
	}
}

// transportNamed is the transport of that name, serving the floor
// processor on a listener until the context ends; nil for none.
func transportNamed(name string) func(context.Context, net.Listener) error {
	switch name {
	case "grpc-go":
		return serveGRPC
	case "h2":
		return serveH2
	}
	return nil
}

// serveGRPC serves the floor processor on grpc-go.
func serveGRPC(ctx context.Context, ln net.Listener) error {
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, floor{answer: pickAnswer()})
	stop := context.AfterFunc(ctx, gs.Stop)
	defer stop()
	err := gs.Serve(ln)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// pickAnswer is the headers response, one destination as a picker's.
func pickAnswer() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: wire.DestinationEndpointKey, RawValue: []byte("10.0.0.1:8000")}}}}}}}}
}

// bodyAnswer sends a request's body back, whole, as its last chunk.
func bodyAnswer(body []byte) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: true}}}}}}}
}

// floor answers every request the same way.
type floor struct {
	extprocv3.UnimplementedExternalProcessorServer
	// answer is the headers response, one destination as a picker's; it
	// is only read.
	answer *extprocv3.ProcessingResponse
}

func (f floor) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	var body []byte
	for done := false; !done; {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if b := m.GetRequestBody(); b != nil {
			body = append(body, b.GetBody()...)
			done = b.GetEndOfStream()
		}
	}
	if err := st.Send(f.answer); err != nil {
		return err
	}
	if err := st.Send(bodyAnswer(body)); err != nil {
		return err
	}
	// The proxy ends the stream once its request is done.
	for {
		if _, err := st.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
