package xdsclient

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/infergate/infergate/internal/testcert"
)

func TestTLS(t *testing.T) {
	ca := testcert.NewCA(t, "xds-test")
	cert, pool := ca.Server(t), ca.Pool
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	setSnapshot(t, cache, basicSnapshot(t, "1", 8001))
	srv := startXDS(t, "127.0.0.1:0", cache,
		grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))

	for _, tc := range []struct {
		name      string
		tls       *tls.Config
		wantReach bool
	}{
		{"verified TLS", &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, true},
		{"plaintext to a TLS server", nil, false},
		{"untrusted server certificate", &tls.Config{MinVersion: tls.VersionTLS12}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wait := 10 * time.Second
			if !tc.wantReach {
				wait = 500 * time.Millisecond
			}
			ctx := testCtx(t, wait)
			c := runClient(t, srv.addr, &fakeProxy{}, func(cfg *Config) { cfg.TLS = tc.tls })
			err := c.WaitVersion(ctx, ListenerType, "1")
			if tc.wantReach && err != nil {
				t.Fatal(err)
			}
			if !tc.wantReach && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("WaitVersion = %v, want no config over a failing channel", err)
			}
		})
	}
}

// TestBearerToken: with Config.Token the client sends the token as the
// authorization header on its streams, as Envoy Gateway's gateway-namespace
// mode wants its proxies' service-account tokens; a server that refuses the
// token sends nothing, and a token without TLS is a configuration error.
func TestBearerToken(t *testing.T) {
	ca := testcert.NewCA(t, "xds-test")
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	setSnapshot(t, cache, basicSnapshot(t, "1", 8001))
	checkToken := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer tok-1" {
			return status.Errorf(codes.Unauthenticated, "authorization %v", got)
		}
		return h(srv, ss)
	}
	srv := startXDS(t, "127.0.0.1:0", cache,
		grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{ca.Server(t)}, MinVersion: tls.VersionTLS12})),
		grpc.ChainStreamInterceptor(checkToken))
	for _, tc := range []struct {
		token     string
		wantReach bool
	}{{"tok-1", true}, {"tok-2", false}} {
		t.Run(tc.token, func(t *testing.T) {
			wait := 10 * time.Second
			if !tc.wantReach {
				wait = 500 * time.Millisecond
			}
			ctx := testCtx(t, wait)
			c := runClient(t, srv.addr, &fakeProxy{}, func(cfg *Config) {
				cfg.TLS = &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}
				cfg.Token = func(context.Context) (string, error) { return tc.token, nil }
			})
			err := c.WaitVersion(ctx, ListenerType, "1")
			if tc.wantReach && err != nil {
				t.Fatal(err)
			}
			if !tc.wantReach && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("WaitVersion = %v, want no config with a refused token", err)
			}
		})
	}
	h := HandlerFunc(func(context.Context, string, string, []*anypb.Any) error { return nil })
	_, err := New(Config{Server: srv.addr, NodeID: "n", Token: func(context.Context) (string, error) { return "x", nil }}, h)
	if err == nil || !strings.Contains(err.Error(), "needs TLS") {
		t.Fatalf("token without TLS: %v", err)
	}
}
