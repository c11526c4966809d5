// Package loopback runs servers for tests on free 127.0.0.1 ports and
// stops them when the test ends.
package loopback

import (
	"context"
	"net"
	"testing"
)

// Serve listens on a free loopback port, runs serve on it until the test
// ends, then cancels its context and waits for it; an error from serve
// fails the test. It returns the bound address.
func Serve(tb testing.TB, serve func(ctx context.Context, ln net.Listener) error) string {
	tb.Helper()
	return ServeAt(tb, "127.0.0.1:0", serve)
}

// ServeAt is Serve on a given address, e.g. a pod IP in 127.0.0.0/8.
func ServeAt(tb testing.TB, addr string, serve func(ctx context.Context, ln net.Listener) error) string {
	tb.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("server on %s: %v", ln.Addr(), err)
		}
	})
	return ln.Addr().String()
}
