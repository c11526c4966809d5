package xdsclient

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

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
