package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/credentials"

	"github.com/infergate/infergate/extproc/server"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// client issues a client certificate, as a gateway would present.
func (ca *testCA) client(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestMutualTLS: with a client CA, only clients holding a certificate that
// CA signed are served; others fail at the handshake, before any request.
func TestMutualTLS(t *testing.T) {
	gatewayCA, strangerCA := newCA(t, "gateway CA"), newCA(t, "someone else")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, gatewayCA.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, _, _ := start(t, &recorder{}, server.Options{TLS: server.TLSOptions{Enabled: true, ClientCAFile: caFile}})

	for _, c := range []struct {
		name   string
		certs  []tls.Certificate
		served bool
	}{
		{"certificate from the gateway CA", []tls.Certificate{gatewayCA.client(t, "gateway")}, true},
		{"no certificate", nil, false},
		{"certificate from another CA", []tls.Certificate{strangerCA.client(t, "intruder")}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The server's certificate is self-signed: gateways skip its
			// verification, as they do for a picker.
			creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, Certificates: c.certs})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := extprocv3.NewExternalProcessorClient(dial(t, srv.GRPCAddr(), creds)).Process(ctx)
			if err == nil {
				if err = st.Send(reqHeaders(true, ":method", "GET")); err == nil {
					var resp *extprocv3.ProcessingResponse
					if resp, err = st.Recv(); err == nil && resp.GetRequestHeaders() == nil {
						t.Fatalf("unexpected answer %v", resp)
					}
				}
			}
			if served := err == nil; served != c.served {
				t.Fatalf("served %t (err %v), want %t", served, err, c.served)
			}
		})
	}
}

// TestBadTLSFilesStopStartUp: a certificate or CA file that cannot be used
// fails New with the file named, before any listener opens.
func TestBadTLSFilesStopStartUp(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		tls  server.TLSOptions
		want string
	}{
		{"CA file missing", server.TLSOptions{Enabled: true, ClientCAFile: filepath.Join(dir, "absent.pem")}, "absent.pem"},
		{"CA file not PEM", server.TLSOptions{Enabled: true, ClientCAFile: notPEM}, "ca.txt: no PEM certificate"},
		{"CA without TLS", server.TLSOptions{ClientCAFile: notPEM}, "needs TLS on"},
		{"cert without key", server.TLSOptions{Enabled: true, CertFile: filepath.Join(dir, "tls.crt")}, "together"},
		{"cert files missing", server.TLSOptions{Enabled: true, CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}, "tls.crt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := server.New(&recorder{}, server.Options{GRPCAddr: "127.0.0.1:0", TLS: c.tls})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want an error mentioning %q", err, c.want)
			}
		})
	}
}
