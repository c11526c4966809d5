package envoygateway

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/infergate/infergate/internal/testcert"
)

// writePair writes a client certificate of ca as PEM files and returns
// their paths.
func writePair(t *testing.T, ca *testcert.CA, name string) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := ca.ClientPEM(t, name)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for file, data := range map[string][]byte{certFile: certPEM, keyFile: keyPEM} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

func TestLoadClientCert(t *testing.T) {
	ca := testcert.NewCA(t, "processors")
	certFile, keyFile := writePair(t, ca, "gateway")
	_, otherKey := writePair(t, ca, "other")
	for _, tc := range []struct {
		name, cert, key, wantErr string
	}{
		{"a pair", certFile, keyFile, ""},
		{"a key of another certificate", certFile, otherKey, "does not match"},
		{"a missing file", filepath.Join(t.TempDir(), "absent.crt"), keyFile, "absent.crt"},
		{"only a certificate", certFile, "", "both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, err := LoadClientCert(tc.cert, tc.key)
			if tc.wantErr == "" {
				if err != nil || len(cc.ChainPEM) == 0 || len(cc.KeyPEM) == 0 {
					t.Fatalf("LoadClientCert = %v, %v", cc, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
			}
		})
	}
}

// TestClientCertOnProcessorClusters: the certificate goes to the picker's
// and the payload processor's clusters, which Envoy validates; the
// extension's EDS service is reached without a cluster (google_grpc).
func TestClientCertOnProcessorClusters(t *testing.T) {
	p, l, rc, nc := poolTranslation(t, "10.0.0.1:8000")
	certFile, keyFile := writePair(t, testcert.NewCA(t, "processors"), "gateway")
	cc, err := LoadClientCert(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{EDS: &EDSServer{Address: "egext.infergate.svc:5005", TLS: true}, Payload: &Payload{Address: "payload.infergate.svc:9004", TLS: true}, ClientCert: cc}
	clusters, _, err := ModifyTranslation(context.Background(), []*clusterv3.Cluster{nc}, []*listenerv3.Listener{l}, []*routev3.RouteConfiguration{rc}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{EPPClusterName(p): true, PayloadClusterName: true}
	for _, c := range clusters[1:] {
		presents, ok := want[c.GetName()]
		if !ok {
			t.Fatalf("unexpected cluster %q", c.GetName())
		}
		delete(want, c.GetName())
		if err := c.Validate(); err != nil {
			t.Fatalf("cluster %q: Envoy's proto validation: %v", c.GetName(), err)
		}
		utc := &tlsv3.UpstreamTlsContext{}
		if err := c.GetTransportSocket().GetTypedConfig().UnmarshalTo(utc); err != nil {
			t.Fatalf("cluster %q: %v", c.GetName(), err)
		}
		certs := utc.GetCommonTlsContext().GetTlsCertificates()
		switch {
		case !presents && len(certs) != 0:
			t.Errorf("cluster %q presents a client certificate", c.GetName())
		case presents && (len(certs) != 1 || !bytes.Equal(certs[0].GetCertificateChain().GetInlineBytes(), cc.ChainPEM) ||
			!bytes.Equal(certs[0].GetPrivateKey().GetInlineBytes(), cc.KeyPEM)):
			t.Errorf("cluster %q tls_certificates %v, want the loaded pair", c.GetName(), certs)
		}
	}
	if len(want) != 0 {
		t.Errorf("clusters missing: %v", want)
	}
}
