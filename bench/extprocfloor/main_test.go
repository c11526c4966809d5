package main

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/extprocload"
)

// TestFloorAnswersAsAPicker: driven like a picker, the floor processor
// answers every request with a destination and the body (one of 100 kB
// too, in many frames), on either transport, and stops with its context.
func TestFloorAnswersAsAPicker(t *testing.T) {
	for _, name := range []string{"grpc-go", "h2"} {
		t.Run(name, func(t *testing.T) { answersAsAPicker(t, transportNamed(name)) })
	}
}

func answersAsAPicker(t *testing.T, serve func(context.Context, net.Listener) error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln) }()
	conns, err := extprocload.Dial(ln.Addr().String(), false, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer extprocload.Close(conns)
	req, err := extprocload.Chat("m", 1024, 0)
	if err != nil {
		t.Fatal(err)
	}
	big, err := extprocload.Chat("m", 100_000, 16384)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := extprocload.One(ctx, conns[0], big); err != nil {
		t.Fatalf("a 100 kB body: %v", err)
	}
	r, err := extprocload.Closed(ctx, conns, req, 4, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Latencies) == 0 || r.Errors != 0 {
		t.Errorf("%d answered, %d errors (first %v)", len(r.Latencies), r.Errors, r.First)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("stopped with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("did not stop with its context")
	}
}
