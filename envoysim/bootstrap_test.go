package envoysim

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/envoysim/xdstest"
)

// freePort is a port nothing listens on (found by binding one and letting
// it go).
func freePort(t *testing.T) uint32 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint32(ln.Addr().(*net.TCPAddr).Port)
}

// inlineListener is a plaintext HTTP listener on 0.0.0.0:port carrying its
// route configuration inline, as a bootstrap does; the router is appended
// to filters.
func inlineListener(name string, port uint32, rc *routev3.RouteConfiguration, filters ...*hcmv3.HttpFilter) *listenerv3.Listener {
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix:     name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rc},
		HttpFilters:    append(filters, xdstest.HTTPFilter("envoy.filters.http.router", &routerv3.Router{}, false)),
	}
	return &listenerv3.Listener{
		Name: name,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "0.0.0.0", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
		}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name:       "envoy.filters.network.http_connection_manager",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: xdstest.Any(hcm)},
		}}}},
	}
}

// bootstrapOf is a bootstrap with a node (whose id and metadata only
// Istio's metadata exchange reads) and an admin address (ignored by the
// stand-in) and these static resources.
func bootstrapOf(listeners []*listenerv3.Listener, clusters ...*clusterv3.Cluster) *bootstrapv3.Bootstrap {
	return &bootstrapv3.Bootstrap{
		Node: &corev3.Node{Id: "standin", Cluster: "test"},
		Admin: &bootstrapv3.Admin{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 9901},
		}}}},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{Listeners: listeners, Clusters: clusters},
	}
}

func bootstrapConfig(bs *bootstrapv3.Bootstrap) NodeConfig {
	return NodeConfig{
		Bootstrap: bs,
		Timeouts:  Timeouts{Route: 10 * time.Second, Connect: time.Second, Shutdown: time.Second},
		Logger:    logr.Discard(),
	}
}

// serveBootstrap runs a node of cfg and waits for listener to serve. stop
// ends Run and returns its error; the test's cleanup stops it otherwise.
func serveBootstrap(t *testing.T, cfg NodeConfig, listener string) (n *Node, base string, stop func() error) {
	t.Helper()
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	stopped, runErr := false, error(nil)
	stop = func() error {
		if !stopped {
			cancel()
			runErr, stopped = <-done, true
		}
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("node: %v", err)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if addr, ok := n.ListenerAddr(listener); ok {
			return n, "http://" + addr, stop
		}
		select {
		case err := <-done:
			stopped, runErr = true, err
			t.Fatalf("Run returned before listener %q served: %v", listener, err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("listener %q never served", listener)
		}
	}
}

// bootstrapError is the error NewNode or Run gives for cfg, which must
// come before any listener serves.
func bootstrapError(t *testing.T, cfg NodeConfig) error {
	t.Helper()
	n, err := NewNode(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Run(ctx); err != nil {
		return err
	}
	t.Fatal("Run served the bootstrap until the timeout")
	return nil
}

// TestBootstrapServesTraffic: a bootstrap built in Go, with a listener on
// its own port whose inline routes send a request through an ext_proc
// filter (a fake payload processor that sets the model header and clears
// the route cache) to the STATIC cluster the header selects. Run ends
// with ctx and drains the listener.
func TestBootstrapServesTraffic(t *testing.T) {
	payload := fakeproc.Start(t, modelHeaderProcessor)
	llama, other := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	bs := bootstrapOf(
		[]*listenerv3.Listener{inlineListener("main", freePort(t), modelRoutes(),
			xdstest.HTTPFilter("payload", xdstest.ExtProc("payload", headersOnly(), false), false))},
		xdstest.StaticCluster("payload", payload.Addr),
		xdstest.StaticCluster("llama", llama.Addr), xdstest.StaticCluster("default", other.Addr))
	if err := bs.Validate(); err != nil {
		t.Fatal(err)
	}
	n, base, stop := serveBootstrap(t, bootstrapConfig(bs), "main")
	if n.XDS() != nil {
		t.Fatal("a bootstrap node has an xDS client")
	}
	port := bs.GetStaticResources().GetListeners()[0].GetAddress().GetSocketAddress().GetPortValue()
	if want := fmt.Sprintf("http://127.0.0.1:%d", port); base != want {
		t.Fatalf("listener bound at %s, want the bootstrap's port on 127.0.0.1 (%s)", base, want)
	}
	resp, body := get(t, base+"/v1/chat/completions")
	if resp.StatusCode != 200 || body != "hello from "+llama.Addr {
		t.Fatalf("got %d %q, want the answer of %s (the route the processor's header selects)", resp.StatusCode, body, llama.Addr)
	}
	if len(payload.Messages()) == 0 {
		t.Fatal("the processor was never called")
	}
	if err := n.Apply(context.Background(), xdsclient.ClusterType, "1", nil); err == nil {
		t.Fatal("a bootstrap node took an xDS update")
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), time.Second); err == nil {
		c.Close()
		t.Fatal("the listener still accepts connections after Run returned")
	}
}

// bootstrapYAML is a plain-Envoy bootstrap as a generator writes it:
// node and admin, an access log, the ext_proc cluster with HTTP/2 protocol
// options, and STATIC, STRICT_DNS and ORIGINAL_DST clusters.
const bootstrapYAML = `
node:
  id: standin
  cluster: test
admin:
  address:
    socket_address: {address: 127.0.0.1, port_value: 9901}
static_resources:
  listeners:
  - name: main
    address:
      socket_address: {address: 0.0.0.0, port_value: %[1]d}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: main
          access_log:
          - name: envoy.access_loggers.stdout
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog
          route_config:
            name: main
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: /od}
                route: {cluster: dst}
              - match:
                  prefix: /
                  headers:
                  - name: x-gateway-model-name
                    string_match: {exact: llama}
                route: {cluster: llama, timeout: 30s}
              - match: {prefix: /}
                route: {cluster: default}
          http_filters:
          - name: payload
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service:
                envoy_grpc: {cluster_name: payload}
              processing_mode:
                response_header_mode: SKIP
              message_timeout: 10s
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: payload
    type: STATIC
    connect_timeout: 5s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {}
    load_assignment:
      cluster_name: payload
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: %[2]d}
  - name: llama
    type: STRICT_DNS
    connect_timeout: 5s
    load_assignment:
      cluster_name: llama
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: llama.test, port_value: %[3]d}
  - name: default
    type: STATIC
    load_assignment:
      cluster_name: default
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: %[4]d}
  - name: dst
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    original_dst_lb_config:
      use_http_header: true
`

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if _, err := fmt.Sscan(p, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBootstrapFromYAML: the same shape written as YAML and loaded with
// LoadBootstrap; the STRICT_DNS host resolves through NodeConfig.Resolve
// and the ORIGINAL_DST cluster takes its host from the request header.
func TestBootstrapFromYAML(t *testing.T) {
	payload := fakeproc.Start(t, modelHeaderProcessor)
	llama, other, dst := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	port := freePort(t)
	path := writeFile(t, "envoy.yaml", fmt.Sprintf(bootstrapYAML, port, portOf(t, payload.Addr), portOf(t, llama.Addr), portOf(t, other.Addr)))
	bs, err := LoadBootstrap(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := bootstrapConfig(bs)
	cfg.Resolve, cfg.ResolveOnly = map[string]string{"llama.test": "127.0.0.1"}, true
	_, base, _ := serveBootstrap(t, cfg, "main")
	if want := fmt.Sprintf("http://127.0.0.1:%d", port); base != want {
		t.Fatalf("listener bound at %s, want %s", base, want)
	}
	if resp, body := get(t, base+"/v1/completions"); resp.StatusCode != 200 || body != "hello from "+llama.Addr {
		t.Fatalf("STRICT_DNS route: %d %q, want the answer of %s", resp.StatusCode, body, llama.Addr)
	}
	if resp, body := get(t, base+"/od", "x-envoy-original-dst-host", dst.Addr); resp.StatusCode != 200 || body != "hello from "+dst.Addr {
		t.Fatalf("ORIGINAL_DST route: %d %q, want the answer of %s", resp.StatusCode, body, dst.Addr)
	}
	if got := len(payload.Messages()); got < 2 {
		t.Fatalf("the processor got %d messages for 2 requests", got)
	}

	// The same bootstrap as JSON loads to the same message.
	js, err := protojson.Marshal(bs)
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadBootstrap(writeFile(t, "envoy.json", string(js)))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(again, bs) {
		t.Fatal("the JSON form loads differently from the YAML form")
	}
}

// TestBootstrapErrors: what the stand-in cannot serve from a bootstrap
// fails start-up with the reason; a resource it would NACK over xDS fails
// with the NACK's message.
func TestBootstrapErrors(t *testing.T) {
	up := fakeproc.StartUpstream(t, nil)
	ok := func() *bootstrapv3.Bootstrap {
		return bootstrapOf([]*listenerv3.Listener{inlineListener("l", freePort(t), xdstest.CatchAllRoutes("r", "up"))},
			xdstest.StaticCluster("up", up.Addr))
	}
	maglev := xdstest.StaticCluster("up", up.Addr)
	maglev.LbPolicy = clusterv3.Cluster_MAGLEV
	_, nack := build(&resources{clusters: map[string]*clusterv3.Cluster{"up": maglev}}, buildEnv{
		resolve: func(h string) ([]string, error) { return []string{h}, nil }, log: logr.Discard(),
	})
	if nack == nil {
		t.Fatal("MAGLEV is not NACKed over xDS")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()

	for _, tc := range []struct {
		name   string
		change func(bs *bootstrapv3.Bootstrap)
		xds    bool // NodeConfig.XDS set too
		want   string
	}{
		{name: "dynamic_resources", want: "dynamic_resources: use --xds-server", change: func(bs *bootstrapv3.Bootstrap) {
			bs.DynamicResources = &bootstrapv3.Bootstrap_DynamicResources{AdsConfig: &corev3.ApiConfigSource{ApiType: corev3.ApiConfigSource_GRPC}}
		}},
		{name: "unknown bootstrap field", want: "bootstrap: Bootstrap.layered_runtime not implemented by the stand-in", change: func(bs *bootstrapv3.Bootstrap) {
			bs.LayeredRuntime = &bootstrapv3.LayeredRuntime{}
		}},
		{name: "secrets", want: "static_resources.secrets: secrets are not implemented", change: func(bs *bootstrapv3.Bootstrap) {
			bs.StaticResources.Secrets = []*tlsv3.Secret{{Name: "s"}}
		}},
		{name: "EDS cluster", want: `cluster "pool": type EDS: a static bootstrap has no ADS stream to fetch endpoints from`, change: func(bs *bootstrapv3.Bootstrap) {
			bs.StaticResources.Clusters = append(bs.StaticResources.Clusters, xdstest.EDSCluster("pool"))
		}},
		{name: "RDS listener", want: `listener "rds": http_connection_manager: rds: a static bootstrap has no ADS stream to fetch routes from`, change: func(bs *bootstrapv3.Bootstrap) {
			bs.StaticResources.Listeners = append(bs.StaticResources.Listeners, xdstest.Listener("rds", freePort(t), "r"))
		}},
		{name: "the xDS NACK", want: nack.Error(), change: func(bs *bootstrapv3.Bootstrap) {
			bs.StaticResources.Clusters = []*clusterv3.Cluster{maglev}
		}},
		{name: "duplicate cluster", want: `cluster "up" is defined twice`, change: func(bs *bootstrapv3.Bootstrap) {
			bs.StaticResources.Clusters = append(bs.StaticResources.Clusters, xdstest.StaticCluster("up", up.Addr))
		}},
		{name: "port in use", want: "binding port", change: func(bs *bootstrapv3.Bootstrap) {
			l := bs.StaticResources.Listeners[0]
			l.GetAddress().GetSocketAddress().PortSpecifier = &corev3.SocketAddress_PortValue{PortValue: uint32(taken.Addr().(*net.TCPAddr).Port)}
		}},
		{name: "with an xDS server", xds: true, want: "exclusive", change: func(*bootstrapv3.Bootstrap) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := ok()
			tc.change(bs)
			cfg := bootstrapConfig(bs)
			if tc.xds {
				cfg.XDS = xdsclient.Config{Server: "127.0.0.1:1", NodeID: "n"}
			}
			err := bootstrapError(t, cfg)
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestLoadBootstrapNamesTheFile: a missing file, YAML that does not parse,
// a field the Bootstrap message does not have and a bootstrap that fails
// Envoy's proto validation each fail with the file named.
func TestLoadBootstrapNamesTheFile(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.yaml")
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing", missing, "no such file"},
		{"bad YAML", writeFile(t, "broken.yaml", "static_resources: [\n"), "YAML"},
		{"unknown field", writeFile(t, "unknown.yaml", "static_resources:\n  listenerz: []\n"), "listenerz"},
		{"unknown type", writeFile(t, "type.yaml", "static_resources:\n  listeners:\n  - name: l\n    listener_filters:\n    - name: x\n      typed_config:\n        \"@type\": type.googleapis.com/no.such.Type\n"), "no.such.Type"},
		{"invalid", writeFile(t, "invalid.yaml", "static_resources:\n  clusters:\n  - name: c\n    connect_timeout: -1s\n"), "ConnectTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadBootstrap(tc.path)
			if err == nil || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %s and %q", err, tc.path, tc.want)
			}
		})
	}
}
