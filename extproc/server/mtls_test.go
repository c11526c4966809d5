package server_test

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/credentials"

	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/internal/testcert"
)

// TestMutualTLS: with a client CA, only clients holding a certificate that
// CA signed are served; others fail at the handshake, before any request.
func TestMutualTLS(t *testing.T) { eachTransport(t, testMutualTLS) }

func testMutualTLS(t *testing.T, transport string) {
	gatewayCA, strangerCA := testcert.NewCA(t, "gateway CA"), testcert.NewCA(t, "someone else")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, gatewayCA.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, _, _ := start(t, transport, &recorder{}, server.Options{TLS: server.TLSOptions{Enabled: true, ClientCAFile: caFile}})

	for _, c := range []struct {
		name   string
		certs  []tls.Certificate
		served bool
	}{
		{"certificate from the gateway CA", []tls.Certificate{gatewayCA.Client(t, "gateway")}, true},
		{"no certificate", nil, false},
		{"certificate from another CA", []tls.Certificate{strangerCA.Client(t, "intruder")}, false},
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
