package xdsclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"testing"
	"time"

	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// selfSignedFor returns a server certificate for 127.0.0.1 and a pool that
// trusts it.
func selfSignedFor(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "xds-test"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, pool
}

func TestTLS(t *testing.T) {
	cert, pool := selfSignedFor(t)
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
