package envoysim

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/envoysim/xdstest"
	"github.com/infergate/infergate/internal/testcert"
)

// pemPair encodes a certificate testcert issued as the PEM chain and
// PKCS#8 key an UpstreamTlsContext carries.
func pemPair(t *testing.T, c tls.Certificate) (chain, key []byte) {
	t.Helper()
	for _, der := range c.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	k, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return chain, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: k})
}

// inlineCert is a TlsCertificate with chain and key inline_bytes.
func inlineCert(chain, key []byte) *tlsv3.TlsCertificate {
	return &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: chain}},
		PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: key}},
	}
}

// fileCert is a TlsCertificate naming chain and key files.
func fileCert(chainFile, keyFile string) *tlsv3.TlsCertificate {
	return &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: chainFile}},
		PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: keyFile}},
	}
}

// writePair writes chain and key to files in dir and returns their paths.
func writePair(t *testing.T, dir string, chain, key []byte) (chainFile, keyFile string) {
	t.Helper()
	chainFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for f, b := range map[string][]byte{chainFile: chain, keyFile: key} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return chainFile, keyFile
}

// tlsSocket is an UpstreamTlsContext as the integrations render one for a
// picker (ALPN h2, no validation) with tls_certificates certs.
func tlsSocket(certs ...*tlsv3.TlsCertificate) *corev3.TransportSocket {
	return &corev3.TransportSocket{
		Name: "envoy.transport_sockets.tls",
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: xdstest.Any(&tlsv3.UpstreamTlsContext{
			CommonTlsContext: &tlsv3.CommonTlsContext{AlpnProtocols: []string{"h2"}, TlsCertificates: certs},
		})},
	}
}

// withSocket sets c's transport socket.
func withSocket(c *clusterv3.Cluster, ts *corev3.TransportSocket) *clusterv3.Cluster {
	c.TransportSocket = ts
	return c
}

// peerName is the common name of the client certificate on c's connection.
func peerName(c *fakeproc.Conn) string {
	p, ok := peer.FromContext(c.Context())
	if !ok {
		return ""
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return ""
	}
	return ti.State.PeerCertificates[0].Subject.CommonName
}

// TestMutualTLSToProcessors: a processor that requires client certificates
// (--client-ca-file) serves an ext_proc filter whose cluster presents one
// of its CA's from tls_certificates (inline or files); without one, or
// with another CA's, the stream fails and the filter's failure mode
// decides. All clusters reach the same processor address in one update:
// channels are not shared between different certificates.
func TestMutualTLSToProcessors(t *testing.T) {
	gatewayCA, strangerCA := testcert.NewCA(t, "gateway CA"), testcert.NewCA(t, "someone else")
	gwChain, gwKey := pemPair(t, gatewayCA.Client(t, "gateway"))
	fileChain, fileKey := pemPair(t, gatewayCA.Client(t, "gateway-from-files"))
	chainFile, keyFile := writePair(t, t.TempDir(), fileChain, fileKey)
	strChain, strKey := pemPair(t, strangerCA.Client(t, "intruder"))

	// The processor tells the upstream which client certificate it saw.
	proc := fakeproc.StartMTLS(t, gatewayCA.Pool, func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			if req.GetRequestHeaders() != nil {
				if err := c.Send(fakeproc.HeadersResp(false, &extprocv3.CommonResponse{HeaderMutation: fakeproc.SetHeaders("x-client-cn", peerName(c))})); err != nil {
					return err
				}
			}
		}
	})
	up := fakeproc.StartUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "cn="+r.Header.Get("x-client-cn"))
	})

	cases := []struct {
		name       string
		socket     *corev3.TransportSocket
		failOpen   bool
		wantStatus int
		wantBody   string
	}{
		{name: "inline certificate", socket: tlsSocket(inlineCert(gwChain, gwKey)), wantStatus: 200, wantBody: "cn=gateway"},
		{name: "inline_string certificate", socket: tlsSocket(&tlsv3.TlsCertificate{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: string(gwChain)}},
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: string(gwKey)}},
		}), wantStatus: 200, wantBody: "cn=gateway"},
		{name: "certificate from files", socket: tlsSocket(fileCert(chainFile, keyFile)), wantStatus: 200, wantBody: "cn=gateway-from-files"},
		{name: "no certificate, failing closed", socket: tlsSocket(), wantStatus: 500},
		{name: "no certificate, failing open", socket: tlsSocket(), failOpen: true, wantStatus: 200, wantBody: "cn="},
		{name: "another CA's certificate, failing closed", socket: tlsSocket(inlineCert(strChain, strKey)), wantStatus: 500},
	}
	rs := []proto.Message{xdstest.CatchAllRoutes("r", "up"), xdstest.StaticCluster("up", up.Addr)}
	for i, tc := range cases {
		name := "proc-" + string(rune('a'+i))
		rs = append(rs,
			xdstest.Listener(name, uint32(8000+i), "r", xdstest.HTTPFilter("proc", xdstest.ExtProc(name, headersOnly(), tc.failOpen), false)),
			withSocket(xdstest.StaticCluster(name, proc.Addr), tc.socket))
	}
	srv := xdstest.Start(t)
	srv.Set(t, "1", rs...)
	n := testNode(t, srv)
	waitVersion(t, n, xdsclient.ClusterType, "1")
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(t, listenerURL(t, n, "proc-"+string(rune('a'+i)))+"/v1/completions")
			if resp.StatusCode != tc.wantStatus || (tc.wantBody != "" && body != tc.wantBody) {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, body, tc.wantStatus, tc.wantBody)
			}
		})
	}
}

// TestEDSStreamPresentsTheClientCertificate: the EDS stream to a cluster's
// own EDS server (eds_config api_config_source) uses that cluster's TLS and
// client certificate; a server that requires one it does not present
// leaves the EDS cluster warming.
func TestEDSStreamPresentsTheClientCertificate(t *testing.T) {
	ca := testcert.NewCA(t, "gateway CA")
	chain, key := pemPair(t, ca.Client(t, "gateway"))
	a := fakeproc.StartUpstream(t, nil)
	for _, tc := range []struct {
		name   string
		socket *corev3.TransportSocket
		serves bool
	}{
		{"with the certificate", tlsSocket(inlineCert(chain, key)), true},
		{"without a certificate", tlsSocket(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			side := xdstest.Start(t, grpc.Creds(credentials.NewTLS(&tls.Config{
				Certificates: []tls.Certificate{ca.Server(t)}, ClientCAs: ca.Pool,
				ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
			})))
			side.SetEndpoints(t, "1", xdstest.Assignment("pool", a.Addr))
			pool := xdstest.EDSClusterFrom("pool-cluster", "pool", "eds-server")
			srv := xdstest.Start(t)
			srv.SetExternalEDS(t, "1", xdstest.Listener("l", 80, "r"), xdstest.CatchAllRoutes("r", "pool-cluster"), pool)
			n := testNode(t, srv, withSocket(xdstest.StaticCluster("eds-server", side.Addr), tc.socket))
			waitVersion(t, n, xdsclient.ClusterType, "1")
			if !tc.serves {
				// Well within initial_fetch_timeout (15s), after which Envoy
				// would go on without the endpoints.
				time.Sleep(time.Second)
				if addr, ok := n.ListenerAddr("l"); ok {
					t.Fatalf("the listener serves at %s, though its cluster's EDS server refuses the stream", addr)
				}
				return
			}
			if _, body := get(t, listenerURL(t, n, "l")+"/"); body != "hello from "+a.Addr {
				t.Fatalf("got %q, want the pool's endpoint", body)
			}
		})
	}
}

// TestClusterClientCertificate: the certificate of tls_certificates reaches
// the ext_proc filter's configuration from each DataSource form; a cluster
// without it dials TLS with none.
func TestClusterClientCertificate(t *testing.T) {
	ca := testcert.NewCA(t, "gateway CA")
	leaf := ca.Client(t, "gateway")
	chain, key := pemPair(t, leaf)
	chainFile, keyFile := writePair(t, t.TempDir(), chain, key)
	env := xbEnv(t, xbResolve)
	for _, tc := range []struct {
		name     string
		socket   *corev3.TransportSocket
		wantCert bool
	}{
		{"no tls_certificates", tlsSocket(), false},
		{"inline_bytes", tlsSocket(inlineCert(chain, key)), true},
		{"inline_string", tlsSocket(&tlsv3.TlsCertificate{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: string(chain)}},
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: string(key)}},
		}), true},
		{"filename", tlsSocket(fileCert(chainFile, keyFile)), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := xbResources(t, xdstest.EnvoyGateway(xbPool, xbOther)...)
			r.clusters[xdstest.EGEPPCluster].TransportSocket = tc.socket
			tb := xbBuildOne(t, r, env)
			cfg := xbRoute(t, tb, xdstest.EGRouteName).filters[0].Config()
			if !cfg.TLS || (cfg.ClientCert != nil) != tc.wantCert {
				t.Fatalf("TLS %v, client certificate %v; want TLS and a certificate %v", cfg.TLS, cfg.ClientCert != nil, tc.wantCert)
			}
			if tc.wantCert && !bytes.Equal(cfg.ClientCert.Certificate[0], leaf.Certificate[0]) {
				t.Error("the filter presents another certificate than the cluster's")
			}
		})
	}
}

// TestConnPoolKeysByCertificate: clusters at one address share a channel
// only with the same client certificate (the same bytes parsed by two
// updates count as the same).
func TestConnPoolKeysByCertificate(t *testing.T) {
	ca := testcert.NewCA(t, "gateway CA")
	a, b := ca.Client(t, "a"), ca.Client(t, "b")
	chain, key := pemPair(t, a)
	a2, err := tls.X509KeyPair(chain, key) // a, parsed again
	if err != nil {
		t.Fatal(err)
	}
	p := newConnPool(time.Minute)
	t.Cleanup(p.closeAll)
	conn := func(cert *tls.Certificate) any {
		t.Helper()
		if _, err := p.client(extprocfilter.FilterConfig{Name: "f", Target: "127.0.0.1:1", TLS: true, ClientCert: cert}); err != nil {
			t.Fatal(err)
		}
		return p.conns[connKey{"127.0.0.1:1", true, certID(cert), extprocfilter.SocketOptions{}}].conn
	}
	none, withA, withB, withA2 := conn(nil), conn(&a), conn(&b), conn(&a2)
	if len(p.conns) != 3 || none == withA || withA == withB || withA != withA2 {
		t.Fatalf("%d channels; none/a %v, a/b %v, a/a again %v", len(p.conns), none == withA, withA == withB, withA == withA2)
	}
}

// TestDirectResponseBodySources: a direct response's body is read from
// inline_string, inline_bytes or a file (read when the update is built).
func TestDirectResponseBodySources(t *testing.T) {
	file := filepath.Join(t.TempDir(), "body.txt")
	if err := os.WriteFile(file, []byte("from a file"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := xbEnv(t, xbResolve)
	for _, tc := range []struct {
		name string
		body *corev3.DataSource
		want string
	}{
		{"none", nil, ""},
		{"inline_string", &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "inline"}}, "inline"},
		{"inline_bytes", &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: []byte("bytes")}}, "bytes"},
		{"filename", &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: file}}, "from a file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := xdstest.CatchAllRoutes("r", "up")
			rt := rc.VirtualHosts[0].Routes[0]
			rt.Name = "direct"
			rt.Action = &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 200, Body: tc.body}}
			tb := xbBuildOne(t, xbResources(t, xdstest.Listener("l", 80, "r"), rc), env)
			if d := xbRoute(t, tb, "direct").direct; d == nil || d.body != tc.want {
				t.Fatalf("direct response %+v, want body %q", d, tc.want)
			}
		})
	}
}
