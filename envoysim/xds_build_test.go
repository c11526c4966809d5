package envoysim

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	grpcstatsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/grpc_stats/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	ringhashv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/envoysim/xdstest"
	"github.com/infergate/infergate/inference/wire"
	"github.com/infergate/infergate/internal/testcert"
)

// xbPool is the InferencePool both gateway shapes are rendered for.
var xbPool = xdstest.Pool{
	Endpoints:    []string{"127.0.0.1:8000", "127.0.0.1:8001"},
	EPP:          "127.0.0.1:9002",
	EPPTLS:       true,
	ListenerPort: 80,
}

// xbOther is the endpoint of the Envoy Gateway shape's second route.
const xbOther = "127.0.0.1:8002"

// xbResources puts a clone of each message into a fresh state, by name
// (endpoints by cluster_name), as the node keeps them.
func xbResources(t *testing.T, msgs ...proto.Message) *resources {
	t.Helper()
	r := &resources{
		listeners: map[string]*listenerv3.Listener{},
		routes:    map[string]*routev3.RouteConfiguration{},
		clusters:  map[string]*clusterv3.Cluster{},
		endpoints: map[string]*endpointv3.ClusterLoadAssignment{},
	}
	for _, m := range msgs {
		switch v := proto.Clone(m).(type) {
		case *listenerv3.Listener:
			r.listeners[v.GetName()] = v
		case *routev3.RouteConfiguration:
			r.routes[v.GetName()] = v
		case *clusterv3.Cluster:
			r.clusters[v.GetName()] = v
		case *endpointv3.ClusterLoadAssignment:
			r.endpoints[v.GetClusterName()] = v
		default:
			t.Fatalf("resource type %T", m)
		}
	}
	return r
}

// xbResolve knows the Envoy Gateway picker's host name; IP addresses
// resolve to themselves, as in Node.resolve.
func xbResolve(host string) (string, error) {
	if ip := net.ParseIP(host); ip != nil {
		return ip.String(), nil
	}
	if host == xdstest.EGEPPHost {
		return "127.0.0.1", nil
	}
	return "", fmt.Errorf("resolving %q: not in the test's resolve table", host)
}

// xbEnv is a build environment whose clients share nothing and whose
// channels (which never connect) are closed when the test ends.
func xbEnv(t *testing.T, resolve func(string) (string, error)) buildEnv {
	var (
		mu    sync.Mutex
		conns []io.Closer
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return buildEnv{
		resolve: func(host string) ([]string, error) {
			ip, err := resolve(host)
			if err != nil {
				return nil, err
			}
			return []string{ip}, nil
		},
		log:  logr.Discard(),
		node: xbNode,
		clientFor: func(cfg extprocfilter.FilterConfig) (*extprocfilter.Client, error) {
			conn, err := extprocfilter.Dial(cfg.Target, cfg.TLS, cfg.ClientCert)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			return extprocfilter.NewClientConn(cfg, conn)
		},
	}
}

// xbNode is the local node of build tests: a gateway pod as Istio's
// deployment controller runs it.
var xbNode = nodeInfo{
	id: "router~10.0.0.1~gw-istio-0.default~default.svc.cluster.local",
	metadata: func() *structpb.Struct {
		s, err := structpb.NewStruct(map[string]any{
			"NAME": "gw-istio-0", "NAMESPACE": "default", "CLUSTER_ID": "Kubernetes", "WORKLOAD_NAME": "gw-istio",
			"OWNER":         "kubernetes://apis/apps/v1/namespaces/default/deployments/gw-istio",
			"ISTIO_VERSION": "1.30.0",
			"LABELS": map[string]any{
				"service.istio.io/canonical-name": "gw-istio", "app": "gw", "version": "v1", "tier": "edge",
			},
		})
		if err != nil {
			panic(err)
		}
		return s
	}(),
}

// xbEditHCM rewrites the HTTP connection manager of l's only filter chain.
func xbEditHCM(t *testing.T, l *listenerv3.Listener, edit func(*hcmv3.HttpConnectionManager)) {
	t.Helper()
	f := l.GetFilterChains()[0].GetFilters()[0]
	hcm := &hcmv3.HttpConnectionManager{}
	if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	edit(hcm)
	f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: xdstest.Any(hcm)}
}

// xbEditExtProc rewrites every ext_proc filter of l.
func xbEditExtProc(t *testing.T, l *listenerv3.Listener, edit func(*extprocfilterv3.ExternalProcessor)) {
	t.Helper()
	xbEditHCM(t, l, func(hcm *hcmv3.HttpConnectionManager) {
		for _, hf := range hcm.GetHttpFilters() {
			if hf.GetTypedConfig().GetTypeUrl() != extProcType {
				continue
			}
			ep := &extprocfilterv3.ExternalProcessor{}
			if err := hf.GetTypedConfig().UnmarshalTo(ep); err != nil {
				t.Fatal(err)
			}
			edit(ep)
			hf.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: xdstest.Any(ep)}
		}
	})
}

// xbEditOverrides rewrites the ExtProcPerRoute overrides rt carries for filter.
func xbEditOverrides(t *testing.T, rt *routev3.Route, filter string, edit func(*extprocfilterv3.ExtProcOverrides)) {
	t.Helper()
	pr := &extprocfilterv3.ExtProcPerRoute{}
	if err := rt.GetTypedPerFilterConfig()[filter].UnmarshalTo(pr); err != nil {
		t.Fatal(err)
	}
	edit(pr.GetOverrides())
	rt.TypedPerFilterConfig[filter] = xdstest.Any(pr)
}

// Routes of the two shapes.
func xbIstioRoute(r *resources) *routev3.Route {
	return r.routes[xdstest.IstioRoutes].GetVirtualHosts()[0].GetRoutes()[1]
}

func xbEGPoolRoute(r *resources) *routev3.Route {
	return r.routes[xdstest.EGRoutes].GetVirtualHosts()[0].GetRoutes()[1]
}

func xbEGOtherRoute(r *resources) *routev3.Route {
	return r.routes[xdstest.EGRoutes].GetVirtualHosts()[0].GetRoutes()[0]
}

// xbRoute finds a built route by name.
func xbRoute(t *testing.T, tb *table, name string) *route {
	t.Helper()
	for _, vh := range tb.routes.vhosts {
		for _, r := range vh.routes {
			if r.name == name {
				return r
			}
		}
	}
	t.Fatalf("no route %q", name)
	return nil
}

// xbBuildOne builds r, which must hold one listener, and returns its table.
func xbBuildOne(t *testing.T, r *resources, env buildEnv) *table {
	t.Helper()
	b, err := build(r, env)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	bls := b.listeners
	if len(bls) != 1 || !bls[0].ready {
		t.Fatalf("built %d listeners (%+v), want one ready", len(bls), bls)
	}
	return bls[0].table
}

func xbHeaders(authority, path string, kv ...string) extprocfilter.Headers {
	h := extprocfilter.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: path}, {Key: ":authority", Value: authority}}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func xbGrpc(cluster string) *corev3.GrpcService {
	return &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster}}}
}

// xbClientPEM is a fresh client certificate of a fresh CA, PEM-encoded.
func xbClientPEM(t *testing.T) (chain, key []byte) {
	t.Helper()
	return pemPair(t, testcert.NewCA(t, "gateway CA").Client(t, "gateway"))
}

func TestBuildNACKsWhatItDoesNotReproduce(t *testing.T) {
	istio := xdstest.Istio(xbPool)
	eg := xdstest.EnvoyGateway(xbPool, xbOther)
	env := xbEnv(t, xbResolve)

	// Both shapes, untouched, build.
	t.Run("good Istio shape", func(t *testing.T) {
		b, err := build(xbResources(t, istio...), env)
		if err != nil {
			t.Fatalf("build: %v", err)
		}
		bls, rds, eds := b.listeners, b.rds, b.eds
		wantEDS := []string{xdstest.IstioEPPCluster, xdstest.IstioPoolSvc}
		slices.Sort(eds)
		slices.Sort(wantEDS)
		if len(bls) != 1 || !bls[0].ready || bls[0].name != xdstest.IstioListener || bls[0].port != 80 ||
			!slices.Equal(rds, []string{xdstest.IstioRoutes}) || !slices.Equal(eds, wantEDS) {
			t.Fatalf("listeners %+v, rds %q, eds %q", bls, rds, eds)
		}
		tb := bls[0].table
		if got := tb.clusters[xdstest.IstioPoolSvc].endpoints; !slices.Equal(got, xbPool.Endpoints) {
			t.Errorf("pool endpoints %q", got)
		}
		// The listener-level filter names a cluster that does not exist.
		if c := tb.filters[0].client; c == nil || c.Config().Target != "cluster:dummy" {
			t.Errorf("listener-level client %+v", c)
		}
		rt := tb.match(xbHeaders("gw.example", "/v1/chat/completions"), 0)
		if rt == nil || rt.name != "default.llm-route.0" {
			t.Fatalf("matched %+v", rt)
		}
		cfg := rt.filters[0].Config()
		if cfg.Target != xbPool.EPP || !cfg.TLS || cfg.FailureModeAllow ||
			cfg.ProcessingMode.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			t.Errorf("route client %+v", cfg)
		}
	})
	t.Run("good Envoy Gateway shape", func(t *testing.T) {
		b, err := build(xbResources(t, eg...), env)
		if err != nil {
			t.Fatalf("build: %v", err)
		}
		bls, rds, eds := b.listeners, b.rds, b.eds
		if len(bls) != 1 || !bls[0].ready || bls[0].name != xdstest.EGListener ||
			!slices.Equal(rds, []string{xdstest.EGRoutes}) || len(eds) != 0 {
			t.Fatalf("listeners %+v, rds %q, eds %q", bls, rds, eds)
		}
		tb := bls[0].table
		if !tb.filters[0].disabled {
			t.Error("the filter Envoy Gateway adds disabled is not")
		}
		if rt := tb.match(xbHeaders("gw.example:8080", "/other/x"), 0); rt == nil || tb.inChain(rt, 0) || rt.clusters[0].name != xdstest.EGOtherCluster {
			t.Errorf("other route %+v", rt)
		}
		rt := tb.match(xbHeaders("gw.example:8080", "/v1/chat/completions"), 0)
		if rt == nil || rt.name != xdstest.EGRouteName || rt.filters[0] == nil {
			t.Fatalf("matched %+v", rt)
		}
		if cfg := rt.filters[0].Config(); cfg.Target != "127.0.0.1:9002" || !cfg.TLS {
			t.Errorf("route client %+v", cfg)
		}
	})

	cases := []struct {
		name   string
		shape  []proto.Message
		mutate func(t *testing.T, r *resources)
		want   []string // substrings of the error: what is refused, and where
	}{
		// Clusters and endpoints.
		{
			name: "a TCP health check", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				r.clusters[xdstest.IstioPoolSvc].HealthChecks = []*corev3.HealthCheck{{
					Timeout: durationpb.New(time.Second), Interval: durationpb.New(5 * time.Second),
					UnhealthyThreshold: wrapperspb.UInt32(2), HealthyThreshold: wrapperspb.UInt32(1),
					HealthChecker: &corev3.HealthCheck_TcpHealthCheck_{TcpHealthCheck: &corev3.HealthCheck_TcpHealthCheck{}},
				}}
			},
			want: []string{"tcp_health_check", `cluster "` + xdstest.IstioPoolSvc + `"`},
		},
		{
			name: "ORIGINAL_DST upstream_port_override", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				r.clusters[xdstest.EGRouteCluster].GetOriginalDstLbConfig().UpstreamPortOverride = wrapperspb.UInt32(8000)
			},
			want: []string{"upstream_port_override", `cluster "` + xdstest.EGRouteCluster + `"`},
		},
		{
			name: "lb_policy RING_HASH", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				r.clusters[xdstest.EGOtherCluster].LbPolicy = clusterv3.Cluster_RING_HASH
			},
			want: []string{"lb_policy RING_HASH", `cluster "` + xdstest.EGOtherCluster + `"`},
		},
		{
			name: "load_balancing_policy with only ring_hash", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				r.clusters[xdstest.EGOtherCluster].LoadBalancingPolicy = &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
					TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "envoy.load_balancing_policies.ring_hash", TypedConfig: xdstest.Any(&ringhashv3.RingHash{})},
				}}}
			},
			want: []string{"load_balancing_policy", "RingHash is not implemented"},
		},
		{
			name: "cluster transport socket validation_context trusted_ca", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				r.clusters[xdstest.EGEPPCluster].TransportSocket = &corev3.TransportSocket{
					Name: "envoy.transport_sockets.tls",
					ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: xdstest.Any(&tlsv3.UpstreamTlsContext{
						CommonTlsContext: &tlsv3.CommonTlsContext{ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{
							ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: "/etc/ca.pem"}}},
						}},
					})},
				}
			},
			want: []string{"validation_context", `cluster "` + xdstest.EGEPPCluster + `"`},
		},
		{
			name: "cluster tls_certificates chain that is not PEM", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				_, key := xbClientPEM(t)
				r.clusters[xdstest.EGEPPCluster].TransportSocket = tlsSocket(inlineCert([]byte("not a certificate"), key))
			},
			want: []string{"tls_certificates[0]: certificate_chain and private_key", `cluster "` + xdstest.EGEPPCluster + `"`},
		},
		{
			name: "cluster tls_certificates key of another certificate", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				chain, _ := xbClientPEM(t)
				_, other := xbClientPEM(t)
				r.clusters[xdstest.EGEPPCluster].TransportSocket = tlsSocket(inlineCert(chain, other))
			},
			want: []string{"tls_certificates[0]: certificate_chain and private_key", "does not match", `cluster "` + xdstest.EGEPPCluster + `"`},
		},
		{
			name: "cluster tls_certificates file missing", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				r.clusters[xdstest.EGEPPCluster].TransportSocket = tlsSocket(fileCert("/nonexistent/infergate/tls.crt", "/nonexistent/infergate/tls.key"))
			},
			want: []string{"tls_certificates[0].certificate_chain.filename", "/nonexistent/infergate/tls.crt", `cluster "` + xdstest.EGEPPCluster + `"`},
		},
		{
			name: "cluster tls_certificates without private_key", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				chain, _ := xbClientPEM(t)
				tc := inlineCert(chain, nil)
				tc.PrivateKey = nil
				r.clusters[xdstest.EGEPPCluster].TransportSocket = tlsSocket(tc)
			},
			want: []string{"tls_certificates[0]: certificate_chain and private_key are both required", `cluster "` + xdstest.EGEPPCluster + `"`},
		},
		{
			name: "cluster two tls_certificates", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				chain, key := xbClientPEM(t)
				r.clusters[xdstest.IstioEPPCluster].TransportSocket = tlsSocket(inlineCert(chain, key), inlineCert(chain, key))
			},
			want: []string{"tls_certificates: 2 certificates", `cluster "` + xdstest.IstioEPPCluster + `"`},
		},
		{
			name: "cluster tls_certificate_provider_instance", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				ts := tlsSocket()
				ts.ConfigType = &corev3.TransportSocket_TypedConfig{TypedConfig: xdstest.Any(&tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
					TlsCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: "certs"},
				}})}
				r.clusters[xdstest.EGEPPCluster].TransportSocket = ts
			},
			want: []string{"CommonTlsContext.tls_certificate_provider_instance", `cluster "` + xdstest.EGEPPCluster + `"`},
		},
		{
			name: "cluster TLS tls_params TLS 1.0", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				r.clusters[xdstest.IstioEPPCluster].TransportSocket = tlsContext(&tlsv3.CommonTlsContext{TlsParams: &tlsv3.TlsParameters{
					TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_0,
				}})
			},
			want: []string{"tls_maximum_protocol_version TLSv1_0", `cluster "` + xdstest.IstioEPPCluster + `"`},
		},
		{
			name: "cluster transport_socket_matcher", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				setEmpty(r.clusters[xdstest.IstioPoolSvc], "transport_socket_matcher")
			},
			want: []string{"transport_socket_matcher", `cluster "` + xdstest.IstioPoolSvc + `"`},
		},
		{
			name: "cluster upstream network filter", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				r.clusters[xdstest.IstioPoolSvc].Filters = []*clusterv3.Filter{{Name: "envoy.filters.network.x", TypedConfig: &anypb.Any{TypeUrl: "type.googleapis.com/x.v3.X"}}}
			},
			want: []string{`filters[0] "envoy.filters.network.x"`, "x.v3.X is not implemented", `cluster "` + xdstest.IstioPoolSvc + `"`},
		},
		{
			name: "cluster Istio TCP metadata exchange on h2", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				r.clusters[xdstest.IstioEPPCluster].Filters = []*clusterv3.Filter{{Name: "istio.metadata_exchange", TypedConfig: xdstest.TypedStruct(istioMXTCPType, map[string]any{"protocol": "h2"})}}
			},
			want: []string{`MetadataExchange.protocol "h2"`, `cluster "` + xdstest.IstioEPPCluster + `"`},
		},
		{
			name: "cluster TlsCertificate password", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				chain, key := xbClientPEM(t)
				tc := inlineCert(chain, key)
				tc.Password = &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "secret"}}
				r.clusters[xdstest.EGEPPCluster].TransportSocket = tlsSocket(tc)
			},
			want: []string{"TlsCertificate.password", `cluster "` + xdstest.EGEPPCluster + `"`},
		},
		{
			name: "cluster TlsCertificate watched_directory", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				tc := fileCert("/certs/tls.crt", "/certs/tls.key")
				tc.WatchedDirectory = &corev3.WatchedDirectory{Path: "/certs"}
				r.clusters[xdstest.EGEPPCluster].TransportSocket = tlsSocket(tc)
			},
			want: []string{"TlsCertificate.watched_directory", `cluster "` + xdstest.EGEPPCluster + `"`},
		},
		{
			name: "cluster private_key from environment_variable", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				chain, _ := xbClientPEM(t)
				tc := inlineCert(chain, nil)
				tc.PrivateKey = &corev3.DataSource{Specifier: &corev3.DataSource_EnvironmentVariable{EnvironmentVariable: "TLS_KEY"}}
				r.clusters[xdstest.EGEPPCluster].TransportSocket = tlsSocket(tc)
			},
			want: []string{"tls_certificates[0].private_key", "DataSource.environment_variable", `cluster "` + xdstest.EGEPPCluster + `"`},
		},
		{
			name: "load assignment policy.drop_overloads", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				r.endpoints[xdstest.IstioPoolSvc].Policy = &endpointv3.ClusterLoadAssignment_Policy{DropOverloads: []*endpointv3.ClusterLoadAssignment_Policy_DropOverload{{
					Category: "throttle", DropPercentage: &typev3.FractionalPercent{Numerator: 10},
				}}}
			},
			want: []string{"drop_overloads", `cluster "` + xdstest.IstioPoolSvc + `"`},
		},
		// Listeners and the HTTP connection manager.
		{
			name: "two filter chains", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				l := r.listeners[xdstest.IstioListener]
				l.FilterChains = append(l.FilterChains, proto.Clone(l.FilterChains[0]).(*listenerv3.FilterChain))
			},
			want: []string{"filter_chains", "got 2", `listener "` + xdstest.IstioListener + `"`},
		},
		{
			name: "filter chain transport_socket", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				r.listeners[xdstest.EGListener].FilterChains[0].TransportSocket = &corev3.TransportSocket{
					Name:       "envoy.transport_sockets.tls",
					ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: xdstest.Any(&tlsv3.DownstreamTlsContext{})},
				}
			},
			want: []string{"transport_socket", "filter_chains[0]", `listener "` + xdstest.EGListener + `"`},
		},
		{
			name: "listener filter original_dst", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				r.listeners[xdstest.IstioListener].ListenerFilters = []*listenerv3.ListenerFilter{{
					Name: "envoy.filters.listener.original_dst",
					ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: &anypb.Any{
						TypeUrl: "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst",
					}},
				}}
			},
			want: []string{"listener_filters[0]", "original_dst"},
		},
		{
			name: "HCM codec_type HTTP2", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEditHCM(t, r.listeners[xdstest.EGListener], func(h *hcmv3.HttpConnectionManager) {
					h.CodecType = hcmv3.HttpConnectionManager_HTTP2
				})
			},
			want: []string{"codec_type HTTP2", `listener "` + xdstest.EGListener + `"`},
		},
		{
			name: "HTTP filter of an unknown type (lua)", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditHCM(t, r.listeners[xdstest.IstioListener], func(h *hcmv3.HttpConnectionManager) {
					lua := &hcmv3.HttpFilter{Name: "envoy.filters.http.lua", ConfigType: &hcmv3.HttpFilter_TypedConfig{
						TypedConfig: &anypb.Any{TypeUrl: "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"},
					}}
					h.HttpFilters = slices.Insert(h.HttpFilters, 1, lua)
				})
			},
			want: []string{"envoy.extensions.filters.http.lua.v3.Lua", `http_filters[1] "envoy.filters.http.lua"`},
		},
		{
			name: "router not last", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditHCM(t, r.listeners[xdstest.IstioListener], func(h *hcmv3.HttpConnectionManager) {
					slices.Reverse(h.HttpFilters)
				})
			},
			want: []string{"after the router", `http_filters[1] "` + xdstest.IstioFilter + `"`},
		},
		{
			name: "no router", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEditHCM(t, r.listeners[xdstest.EGListener], func(h *hcmv3.HttpConnectionManager) {
					h.HttpFilters = h.HttpFilters[:len(h.HttpFilters)-1]
				})
			},
			want: []string{"no envoy.filters.http.router"},
		},

		// The ext_proc filter.
		{
			name: "ext_proc grpc_service google_grpc", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.IstioListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.GrpcService.TargetSpecifier = &corev3.GrpcService_GoogleGrpc_{GoogleGrpc: &corev3.GrpcService_GoogleGrpc{TargetUri: xbPool.EPP, StatPrefix: "epp"}}
				})
			},
			want: []string{"google_grpc", `http_filters[0] "` + xdstest.IstioFilter + `"`},
		},
		{
			name: "ext_proc mutation_rules.allow_all_routing", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.EGListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.MutationRules = &mutationrulesv3.HeaderMutationRules{AllowAllRouting: wrapperspb.Bool(true)}
				})
			},
			want: []string{"mutation_rules", xdstest.EGFilter},
		},
		{
			name: "ext_proc request_body_mode STREAMED on an enabled filter", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.IstioListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.ProcessingMode.RequestBodyMode = extprocfilterv3.ProcessingMode_STREAMED
				})
			},
			want: []string{"request_body_mode STREAMED", xdstest.IstioFilter},
		},
		{
			name: "ext_proc request_body_mode STREAMED on a filter enabled per route", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.EGListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.ProcessingMode.RequestBodyMode = extprocfilterv3.ProcessingMode_STREAMED
				})
			},
			want: []string{"request_body_mode STREAMED", xdstest.EGFilter, `listener "` + xdstest.EGListener + `"`},
		},
		{
			name: "ext_proc observability_mode", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.EGListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.ObservabilityMode = true
				})
			},
			want: []string{"observability_mode"},
		},
		{
			name: "ext_proc request_attributes", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.IstioListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.RequestAttributes = []string{"request.path"}
				})
			},
			want: []string{"request_attributes"},
		},
		{
			name: "ext_proc forward_rules", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.EGListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.ForwardRules = &extprocfilterv3.HeaderForwardingRules{AllowedHeaders: &matcherv3.ListStringMatcher{
						Patterns: []*matcherv3.StringMatcher{{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "x-"}}},
					}}
				})
			},
			want: []string{"forward_rules"},
		},
		{
			name: "ext_proc metadata_options typed namespaces", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.IstioListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.MetadataOptions.ForwardingNamespaces.Typed = []string{wire.LBNamespace}
				})
			},
			want: []string{"MetadataNamespaces.typed"},
		},
		{
			name: "ext_proc allow_mode_override outside FULL_DUPLEX_STREAMED", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.IstioListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.AllowModeOverride = true
				})
			},
			want: []string{"allow_mode_override"},
		},

		// Per-route filter config.
		{
			name: "ExtProcPerRoute overrides grpc_service google_grpc", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditOverrides(t, xbIstioRoute(r), xdstest.IstioFilter, func(ov *extprocfilterv3.ExtProcOverrides) {
					ov.GrpcService.TargetSpecifier = &corev3.GrpcService_GoogleGrpc_{GoogleGrpc: &corev3.GrpcService_GoogleGrpc{TargetUri: xbPool.EPP, StatPrefix: "epp"}}
				})
			},
			want: []string{"google_grpc", `typed_per_filter_config["` + xdstest.IstioFilter + `"]`},
		},
		{
			name: "ExtProcPerRoute overrides processing_mode STREAMED", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditOverrides(t, xbIstioRoute(r), xdstest.IstioFilter, func(ov *extprocfilterv3.ExtProcOverrides) {
					ov.ProcessingMode.RequestBodyMode = extprocfilterv3.ProcessingMode_STREAMED
				})
			},
			want: []string{"request_body_mode STREAMED"},
		},
		{
			name: "ExtProcPerRoute overrides request_attributes", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditOverrides(t, xbIstioRoute(r), xdstest.IstioFilter, func(ov *extprocfilterv3.ExtProcOverrides) {
					ov.RequestAttributes = []string{"request.path"}
				})
			},
			want: []string{"ExtProcOverrides.request_attributes", `"default.llm-route.0"`},
		},
		{
			name: "typed_per_filter_config of another type for the ext_proc filter", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).TypedPerFilterConfig[xdstest.IstioFilter] = xdstest.Any(&routerv3.Router{})
			},
			want: []string{"envoy.extensions.filters.http.router.v3.Router", `typed_per_filter_config["` + xdstest.IstioFilter + `"]`},
		},
		{
			name: "FilterConfig wrapping another type for the ext_proc filter", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEGPoolRoute(r).TypedPerFilterConfig[xdstest.EGFilter] = xdstest.Any(&routev3.FilterConfig{Config: xdstest.Any(&routerv3.Router{})})
			},
			want: []string{"envoy.extensions.filters.http.router.v3.Router", `typed_per_filter_config["` + xdstest.EGFilter + `"]`},
		},

		// Routes.
		{
			name: "route retry_policy per_try_timeout", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).GetRoute().RetryPolicy = &routev3.RetryPolicy{RetryOn: "connect-failure", PerTryTimeout: durationpb.New(time.Second)}
			},
			want: []string{"RetryPolicy.per_try_timeout", `listener "` + xdstest.IstioListener + `"`, `route configuration "` + xdstest.IstioRoutes + `"`, `routes[1] "default.llm-route.0".route.retry_policy`},
		},
		{
			name: "route retry_policy reset-before-request", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).GetRoute().RetryPolicy = &routev3.RetryPolicy{RetryOn: "connect-failure,reset-before-request"}
			},
			want: []string{"retry_on reset-before-request"},
		},
		{
			name: "route retry_policy_typed_config", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).GetRoute().RetryPolicyTypedConfig = &anypb.Any{TypeUrl: "type.googleapis.com/x.Retry"}
			},
			want: []string{"RouteAction.retry_policy_typed_config"},
		},
		{
			name: "virtual host retry_policy retry_priority", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				r.routes[xdstest.IstioRoutes].VirtualHosts[0].RetryPolicy = &routev3.RetryPolicy{RetryOn: "5xx",
					RetryPriority: &routev3.RetryPolicy_RetryPriority{Name: "envoy.retry_priorities.previous_priorities"}}
			},
			want: []string{"RetryPolicy.retry_priority", `virtual_hosts[0] "*:80".retry_policy`},
		},
		{
			name: "virtual host include_attempt_count_in_response", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				r.routes[xdstest.IstioRoutes].VirtualHosts[0].IncludeAttemptCountInResponse = true
			},
			want: []string{"VirtualHost.include_attempt_count_in_response"},
		},
		{
			name: "RouteAction grpc_timeout_offset", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).GetRoute().GrpcTimeoutOffset = durationpb.New(time.Second)
			},
			want: []string{"RouteAction.grpc_timeout_offset"},
		},
		{
			name: "HTTP fault filter that aborts", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditHCM(t, r.listeners[xdstest.IstioListener], func(h *hcmv3.HttpConnectionManager) {
					h.HttpFilters = slices.Insert(h.HttpFilters, 0, xdstest.HTTPFilter("envoy.filters.http.fault", &faultv3.HTTPFault{
						Abort: &faultv3.FaultAbort{ErrorType: &faultv3.FaultAbort_HttpStatus{HttpStatus: 503}},
					}, false))
				})
			},
			want: []string{"HTTPFault.abort", `http_filters[0] "envoy.filters.http.fault"`},
		},
		{
			name: "Istio metadata exchange baggage discovery", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditHCM(t, r.listeners[xdstest.IstioListener], func(h *hcmv3.HttpConnectionManager) {
					h.HttpFilters = slices.Insert(h.HttpFilters, 0, &hcmv3.HttpFilter{Name: "istio.metadata_exchange", ConfigType: &hcmv3.HttpFilter_TypedConfig{
						TypedConfig: xdstest.TypedStruct(peerMetadataType, map[string]any{"downstream_discovery": []any{map[string]any{"baggage": map[string]any{}}}}),
					}})
				})
			},
			want: []string{"discovery method baggage", `http_filters[0] "istio.metadata_exchange"`},
		},
		{
			name: "RouteMatch query_parameters", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEGPoolRoute(r).Match.QueryParameters = []*routev3.QueryParameterMatcher{{
					Name: "debug", QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_PresentMatch{PresentMatch: true},
				}}
			},
			want: []string{"query_parameters", `"` + xdstest.EGRouteName + `".match`},
		},
		{
			name: "RouteMatch runtime_fraction with an unknown denominator", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).Match.RuntimeFraction = &corev3.RuntimeFractionalPercent{
					DefaultValue: &typev3.FractionalPercent{Numerator: 50, Denominator: 7}, RuntimeKey: "canary",
				}
			},
			want: []string{"runtime_fraction", "denominator"},
		},
		{
			name: "RouteMatch grpc", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).Match.Grpc = &routev3.RouteMatch_GrpcRouteMatchOptions{}
			},
			want: []string{"RouteMatch.grpc"},
		},
		{
			name: "RouteAction auto_host_rewrite true", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEGPoolRoute(r).GetRoute().HostRewriteSpecifier = &routev3.RouteAction_AutoHostRewrite{AutoHostRewrite: wrapperspb.Bool(true)}
			},
			want: []string{"auto_host_rewrite", `"` + xdstest.EGRouteName + `".route`},
		},
		{
			name: "RouteAction include_vh_rate_limits true", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEGPoolRoute(r).GetRoute().IncludeVhRateLimits = wrapperspb.Bool(true)
			},
			want: []string{"include_vh_rate_limits"},
		},
		{
			name: "redirect action", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).Action = &routev3.Route_Redirect{Redirect: &routev3.RedirectAction{
					PathRewriteSpecifier: &routev3.RedirectAction_PathRedirect{PathRedirect: "/v2"},
				}}
			},
			want: []string{"redirect"},
		},
		{
			name: "route request_headers_to_add", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).RequestHeadersToAdd = []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-a", Value: "1"}}}
			},
			want: []string{"request_headers_to_add", `routes[1] "default.llm-route.0"`},
		},
		{
			name: "virtual host request_headers_to_add", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				r.routes[xdstest.EGRoutes].VirtualHosts[0].RequestHeadersToAdd = []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-a", Value: "1"}}}
			},
			want: []string{"VirtualHost.request_headers_to_add"},
		},
		{
			name: "cluster_header cluster specifier", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEGOtherRoute(r).GetRoute().ClusterSpecifier = &routev3.RouteAction_ClusterHeader{ClusterHeader: "x-cluster"}
			},
			want: []string{"cluster_header"},
		},
		{
			name: "weighted cluster with a FilterConfig", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEGOtherRoute(r).GetRoute().ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{
					Clusters: []*routev3.WeightedCluster_ClusterWeight{{
						Name: xdstest.EGOtherCluster, Weight: wrapperspb.UInt32(1),
						TypedPerFilterConfig: map[string]*anypb.Any{xdstest.EGFilter: xdstest.Any(&routev3.FilterConfig{Disabled: true})},
					}},
				}}
			},
			want: []string{"weighted_clusters.clusters[0].typed_per_filter_config", "FilterConfig on a weighted cluster"},
		},
		{
			name: "route to a cluster with upstream TLS", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				r.clusters[xdstest.EGOtherCluster].TransportSocket = xdstest.AcceptAnyTLS()
			},
			want: []string{"upstream TLS", `cluster "` + xdstest.EGOtherCluster + `"`, `listener "` + xdstest.EGListener + `"`},
		},
		{
			name: "direct_response body file missing", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).Action = &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
					Status: 200, Body: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: "/nonexistent/infergate/body.txt"}},
				}}
			},
			want: []string{"direct_response.body.filename", "/nonexistent/infergate/body.txt", `routes[1] "default.llm-route.0"`},
		},
		{
			name: "direct_response body environment_variable", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).Action = &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
					Status: 200, Body: &corev3.DataSource{Specifier: &corev3.DataSource_EnvironmentVariable{EnvironmentVariable: "BODY"}},
				}}
			},
			want: []string{"direct_response.body", "DataSource.environment_variable"},
		},
		{
			name: "safe_regex that does not compile", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbIstioRoute(r).Match.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "/v1/("}}
			},
			want: []string{"match.safe_regex"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := xbResources(t, tc.shape...)
			tc.mutate(t, r)
			_, err := build(r, env)
			if err == nil {
				t.Fatalf("build accepted it; want an error containing %q", tc.want)
			}
			t.Log(err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\n does not contain %q", err, w)
				}
			}
		})
	}
}

func TestBuildAcceptsWhatItIgnores(t *testing.T) {
	istio := xdstest.Istio(xbPool)
	eg := xdstest.EnvoyGateway(xbPool, xbOther)
	env := xbEnv(t, xbResolve)
	cases := []struct {
		name   string
		shape  []proto.Message
		mutate func(t *testing.T, r *resources)
	}{
		{
			name: "HCM normalize_path, merge_slashes, use_remote_address, xff_num_trusted_hops", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEditHCM(t, r.listeners[xdstest.EGListener], func(h *hcmv3.HttpConnectionManager) {
					h.NormalizePath = wrapperspb.Bool(true)
					h.MergeSlashes = true
					h.UseRemoteAddress = wrapperspb.Bool(true)
					h.XffNumTrustedHops = 1
					h.CodecType = hcmv3.HttpConnectionManager_HTTP1
				})
			},
		},
		{
			name: "cluster circuit_breakers, outlier_detection", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				c := r.clusters[xdstest.IstioPoolSvc]
				c.CircuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{MaxConnections: wrapperspb.UInt32(1024)}}}
				c.OutlierDetection = &clusterv3.OutlierDetection{Consecutive_5Xx: wrapperspb.UInt32(5)}
			},
		},
		{
			name: "route decorator and response_headers_to_add", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				rt := xbIstioRoute(r)
				rt.Decorator = &routev3.Decorator{Operation: "llm"}
				rt.ResponseHeadersToAdd = []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-served-by", Value: "gw"}}}
			},
		},
		{
			name: "GrpcService timeout, ext_proc max_message_timeout and stat_prefix", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.EGListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.GrpcService.Timeout = durationpb.New(time.Minute)
					ep.MaxMessageTimeout = durationpb.New(time.Minute)
					ep.StatPrefix = "epp"
				})
			},
		},
		{
			name: "mutation_rules at Envoy's defaults", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.EGListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.MutationRules = &mutationrulesv3.HeaderMutationRules{AllowAllRouting: wrapperspb.Bool(false), DisallowAll: wrapperspb.Bool(false)}
				})
			},
		},
		{
			name: "allow_mode_override where both bodies are FULL_DUPLEX_STREAMED", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEditExtProc(t, r.listeners[xdstest.EGListener], func(ep *extprocfilterv3.ExternalProcessor) {
					ep.AllowModeOverride = true
				})
			},
		},
		{
			name: "ExtProcOverrides grpc_initial_metadata", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditOverrides(t, xbIstioRoute(r), xdstest.IstioFilter, func(ov *extprocfilterv3.ExtProcOverrides) {
					ov.GrpcInitialMetadata = []*corev3.HeaderValue{{Key: "x-tenant", Value: "a"}}
				})
			},
		},
		{
			name: "auto_host_rewrite false, case_sensitive true, include_vh_rate_limits false", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				rt := xbIstioRoute(r)
				rt.GetRoute().HostRewriteSpecifier = &routev3.RouteAction_AutoHostRewrite{AutoHostRewrite: wrapperspb.Bool(false)}
				rt.GetRoute().IncludeVhRateLimits = wrapperspb.Bool(false)
				rt.Match.CaseSensitive = wrapperspb.Bool(true)
			},
		},
		{
			name: "listener freebind false and stat_prefix", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				l := r.listeners[xdstest.IstioListener]
				l.Freebind = wrapperspb.Bool(false)
				l.StatPrefix = "gw"
			},
		},
		{
			name: "tls_inspector listener filter", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				r.listeners[xdstest.EGListener].ListenerFilters = []*listenerv3.ListenerFilter{{
					Name: "envoy.filters.listener.tls_inspector",
					ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: &anypb.Any{
						TypeUrl: "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
					}},
				}}
			},
		},
		{
			name: "HttpFilter is_optional", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				xbEditHCM(t, r.listeners[xdstest.EGListener], func(h *hcmv3.HttpConnectionManager) {
					h.HttpFilters[0].IsOptional = true
				})
			},
		},
		{
			name: "route configuration validate_clusters and response headers", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				rc := r.routes[xdstest.IstioRoutes]
				rc.ValidateClusters = wrapperspb.Bool(true)
				rc.ResponseHeadersToRemove = []string{"server"}
				rc.VirtualHosts[0].ResponseHeadersToAdd = []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-gw", Value: "1"}}}
			},
		},
		{
			name: "load assignment overprovisioning, locality and weights", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				cla := r.endpoints[xdstest.IstioPoolSvc]
				cla.Policy = &endpointv3.ClusterLoadAssignment_Policy{OverprovisioningFactor: wrapperspb.UInt32(140)}
				cla.Endpoints[0].Locality = &corev3.Locality{Region: "r", Zone: "z"}
				cla.Endpoints[0].LoadBalancingWeight = wrapperspb.UInt32(1)
				cla.Endpoints[0].LbEndpoints[0].LoadBalancingWeight = wrapperspb.UInt32(3)
			},
		},
		{
			name: "filter chain transport_socket_connect_timeout", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				r.listeners[xdstest.IstioListener].FilterChains[0].TransportSocketConnectTimeout = durationpb.New(15 * time.Second)
			},
		},
		{
			name: "pass-through HTTP filters: grpc_stats, istio.alpn, empty fault and CORS, istio.stats", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditHCM(t, r.listeners[xdstest.IstioListener], func(h *hcmv3.HttpConnectionManager) {
					raw := func(name, url string) *hcmv3.HttpFilter {
						return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: &anypb.Any{TypeUrl: url}}}
					}
					h.HttpFilters = slices.Insert(h.HttpFilters, 1,
						xdstest.HTTPFilter("envoy.filters.http.grpc_stats", &grpcstatsv3.FilterConfig{EmitFilterState: true}, false),
						raw("istio.alpn", "type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig"),
						xdstest.HTTPFilter("envoy.filters.http.fault", &faultv3.HTTPFault{}, false),
						xdstest.HTTPFilter("envoy.filters.http.cors", &corsv3.Cors{}, false),
						raw("istio.stats", "type.googleapis.com/stats.PluginConfig"),
					)
				})
			},
		},
		{
			name: "Istio's TCP metadata exchange on every cluster, Istio cluster metadata", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				for _, c := range r.clusters {
					c.Filters = []*clusterv3.Filter{{Name: "istio.metadata_exchange", TypedConfig: xdstest.TypedStruct(istioMXTCPType, map[string]any{
						"protocol": "istio-peer-exchange", "enable_discovery": true,
					})}}
					md, _ := structpb.NewStruct(map[string]any{"services": []any{map[string]any{"host": c.Name}}, "alpn_override": "false"})
					c.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": md}}
				}
			},
		},
		{
			name: "Istio metadata exchange shared_with_upstream and workload_discovery", shape: istio,
			mutate: func(t *testing.T, r *resources) {
				xbEditHCM(t, r.listeners[xdstest.IstioListener], func(h *hcmv3.HttpConnectionManager) {
					h.HttpFilters = slices.Insert(h.HttpFilters, 1, &hcmv3.HttpFilter{Name: "istio.metadata_exchange", ConfigType: &hcmv3.HttpFilter_TypedConfig{
						TypedConfig: xdstest.TypedStruct(peerMetadataType, map[string]any{
							"upstream_discovery": []any{map[string]any{"workload_discovery": map[string]any{}}}, "shared_with_upstream": true,
						}),
					}})
				})
			},
		},
		{
			name: "upstream TLS sni and an empty validation context on the picker's cluster", shape: eg,
			mutate: func(t *testing.T, r *resources) {
				r.clusters[xdstest.EGEPPCluster].TransportSocket = &corev3.TransportSocket{
					Name: "envoy.transport_sockets.tls",
					ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: xdstest.Any(&tlsv3.UpstreamTlsContext{
						Sni: xdstest.EGEPPHost,
						CommonTlsContext: &tlsv3.CommonTlsContext{
							AlpnProtocols:         []string{"h2"},
							ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{}},
						},
					})},
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := xbResources(t, tc.shape...)
			tc.mutate(t, r)
			tb := xbBuildOne(t, r, env)
			// The configuration still routes as before.
			rt := tb.match(xbHeaders("gw.example", "/v1/chat/completions"), 0)
			if rt == nil || rt.filters[0] == nil {
				t.Fatalf("the pool's route is %+v", rt)
			}
			if cfg := rt.filters[0].Config(); cfg.Target != xbPool.EPP || !cfg.TLS {
				t.Errorf("the pool's route calls %s (TLS %v)", cfg.Target, cfg.TLS)
			}
		})
	}
}

func TestRouteMatching(t *testing.T) {
	path := func(p string) *routev3.RouteMatch {
		return &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: p}}
	}
	prefix := func(p string) *routev3.RouteMatch {
		return &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: p}}
	}
	separated := func(p string) *routev3.RouteMatch {
		return &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: p}}
	}
	regex := func(re string) *routev3.RouteMatch {
		return &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}}
	}
	caseSensitive := func(m *routev3.RouteMatch, cs bool) *routev3.RouteMatch {
		m.CaseSensitive = wrapperspb.Bool(cs)
		return m
	}
	insensitive := func(m *routev3.RouteMatch) *routev3.RouteMatch { return caseSensitive(m, false) }
	prefixWithHeaders := func(p string, hms ...*routev3.HeaderMatcher) *routev3.RouteMatch {
		m := prefix(p)
		m.Headers = hms
		return m
	}
	// withHeaders is a prefix "/" match with header matchers.
	withHeaders := func(hms ...*routev3.HeaderMatcher) *routev3.RouteMatch { return prefixWithHeaders("/", hms...) }
	str := func(name string, sm *matcherv3.StringMatcher) *routev3.HeaderMatcher {
		return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: sm}}
	}
	exact := func(name, v string) *routev3.HeaderMatcher {
		return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_ExactMatch{ExactMatch: v}}
	}
	present := func(name string, p bool) *routev3.HeaderMatcher {
		return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: p}}
	}
	invert := func(hm *routev3.HeaderMatcher) *routev3.HeaderMatcher {
		hm.InvertMatch = true
		return hm
	}
	req := func(p string, kv ...string) extprocfilter.Headers { return xbHeaders("gw.example", p, kv...) }

	cases := []struct {
		name  string
		match *routev3.RouteMatch
		h     extprocfilter.Headers
		want  bool
	}{
		{"prefix", prefix("/v1"), req("/v1/chat"), true},
		{"prefix other path", prefix("/v1"), req("/v2/chat"), false},
		{"prefix is case sensitive", prefix("/v1"), req("/V1/chat"), false},
		{"prefix not a segment boundary", prefix("/v1"), req("/v10"), true},
		{"prefix empty matches all", prefix(""), req("/anything"), true},
		{"path", path("/v1/models"), req("/v1/models"), true},
		{"path query string ignored", path("/v1/models"), req("/v1/models?limit=1"), true},
		{"path longer", path("/v1/models"), req("/v1/models/x"), false},
		{"path trailing slash", path("/v1/models"), req("/v1/models/"), false},
		{"path_separated_prefix exact", separated("/other"), req("/other"), true},
		{"path_separated_prefix segment", separated("/other"), req("/other/x"), true},
		{"path_separated_prefix with query", separated("/other"), req("/other?x=1"), true},
		{"path_separated_prefix not a segment", separated("/other"), req("/otherx"), false},
		{"path_separated_prefix shorter", separated("/other"), req("/oth"), false},
		{"safe_regex", regex("/v1/[a-z]+"), req("/v1/models"), true},
		{"safe_regex matches the whole path", regex("/v1/[a-z]+"), req("/api/v1/models"), false},
		{"safe_regex anchored at the end", regex("/v1"), req("/v1/models"), false},
		{"safe_regex query string excluded", regex("/v1/[a-z]+"), req("/v1/models?x=1"), true},
		{"case_sensitive false prefix", insensitive(prefix("/V1")), req("/v1/chat"), true},
		{"case_sensitive false path", insensitive(path("/A/b")), req("/a/B"), true},
		{"case_sensitive false path_separated_prefix", insensitive(separated("/Other")), req("/OTHER/x"), true},
		{"case_sensitive false path_separated_prefix not a segment", insensitive(separated("/Other")), req("/otherx"), false},
		{"case_sensitive false does not apply to safe_regex", insensitive(regex("/v1/.*")), req("/V1/x"), false},
		{"case_sensitive true", caseSensitive(prefix("/V1"), true), req("/v1"), false},

		{"header exact", withHeaders(exact("x-a", "1")), req("/", "x-a", "1"), true},
		{"header exact other value", withHeaders(exact("x-a", "1")), req("/", "x-a", "2"), false},
		{"header exact missing", withHeaders(exact("x-a", "1")), req("/"), false},
		{"header name case-insensitive", withHeaders(exact("X-A", "1")), req("/", "x-a", "1"), true},
		{"header exact value case-sensitive", withHeaders(exact("x-a", "Llama")), req("/", "x-a", "llama"), false},
		{"header prefix_match", withHeaders(&routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_PrefixMatch{PrefixMatch: "lla"}}), req("/", "x-a", "llama"), true},
		{"header suffix_match", withHeaders(&routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_SuffixMatch{SuffixMatch: "ama"}}), req("/", "x-a", "llama"), true},
		{"header suffix_match no", withHeaders(&routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_SuffixMatch{SuffixMatch: "lla"}}), req("/", "x-a", "llama"), false},
		{"header contains_match", withHeaders(&routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_ContainsMatch{ContainsMatch: "am"}}), req("/", "x-a", "llama"), true},
		{"header safe_regex_match", withHeaders(&routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_SafeRegexMatch{SafeRegexMatch: &matcherv3.RegexMatcher{Regex: "l+a.a"}}}), req("/", "x-a", "llama"), true},
		{"header safe_regex_match whole value", withHeaders(&routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_SafeRegexMatch{SafeRegexMatch: &matcherv3.RegexMatcher{Regex: "lam"}}}), req("/", "x-a", "llama"), false},
		{"string_match exact", withHeaders(str("x-a", &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "llama"}})), req("/", "x-a", "llama"), true},
		{"string_match exact case-sensitive", withHeaders(str("x-a", &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "Llama"}})), req("/", "x-a", "llama"), false},
		{"string_match exact ignore_case", withHeaders(str("x-a", &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "Llama"}, IgnoreCase: true})), req("/", "x-a", "LLAMA"), true},
		{"string_match prefix ignore_case", withHeaders(str("x-a", &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "LL"}, IgnoreCase: true})), req("/", "x-a", "llama"), true},
		{"string_match suffix ignore_case", withHeaders(str("x-a", &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: "MA"}, IgnoreCase: true})), req("/", "x-a", "llama"), true},
		{"string_match contains ignore_case", withHeaders(str("x-a", &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Contains{Contains: "AM"}, IgnoreCase: true})), req("/", "x-a", "llama"), true},
		{"string_match safe_regex", withHeaders(str("x-a", &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "ll.*"}}})), req("/", "x-a", "llama"), true},
		{"string_match safe_regex whole value", withHeaders(str("x-a", &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "ll"}}})), req("/", "x-a", "llama"), false},
		{"present_match true present", withHeaders(present("x-a", true)), req("/", "x-a", ""), true},
		{"present_match true absent", withHeaders(present("x-a", true)), req("/"), false},
		{"present_match false absent", withHeaders(present("x-a", false)), req("/"), true},
		{"present_match false present", withHeaders(present("x-a", false)), req("/", "x-a", "1"), false},
		{"no specifier means present", withHeaders(&routev3.HeaderMatcher{Name: "x-a"}), req("/", "x-a", "1"), true},
		{"no specifier absent", withHeaders(&routev3.HeaderMatcher{Name: "x-a"}), req("/"), false},
		{"invert_match other value", withHeaders(invert(exact("x-a", "1"))), req("/", "x-a", "2"), true},
		{"invert_match same value", withHeaders(invert(exact("x-a", "1"))), req("/", "x-a", "1"), false},
		{"invert_match missing header still fails", withHeaders(invert(exact("x-a", "1"))), req("/"), false},
		{"invert_match present_match absent", withHeaders(invert(present("x-a", true))), req("/"), true},
		{"invert_match present_match present", withHeaders(invert(present("x-a", true))), req("/", "x-a", "1"), false},
		{"repeated values joined by comma", withHeaders(exact("x-a", "a,b")), req("/", "x-a", "a", "x-a", "b"), true},
		{"repeated values not matched one by one", withHeaders(exact("x-a", "b")), req("/", "x-a", "a", "x-a", "b"), false},
		{"repeated values contains the separator", withHeaders(&routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_ContainsMatch{ContainsMatch: "a,b"}}), req("/", "x-a", "a", "x-a", "b"), true},
		{"all header matchers must hold", withHeaders(exact("x-a", "1"), exact("x-b", "2")), req("/", "x-a", "1", "x-b", "3"), false},
		{"all header matchers hold", withHeaders(exact("x-a", "1"), exact("x-b", "2")), req("/", "x-b", "2", "x-a", "1"), true},
		{"headers and path both checked", prefixWithHeaders("/v1", exact("x-a", "1")), req("/v2", "x-a", "1"), false},
		{"headers and path both hold", prefixWithHeaders("/v1", exact("x-a", "1")), req("/v1/x", "x-a", "1"), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := buildMatch("match", tc.match)
			if err != nil {
				t.Fatalf("buildMatch: %v", err)
			}
			if got := m.matches(tc.h, 0); got != tc.want {
				t.Errorf("matches(%v) = %v, want %v", tc.h, got, tc.want)
			}
		})
	}

	t.Run("errors name the matcher", func(t *testing.T) {
		for _, tc := range []struct {
			match *routev3.RouteMatch
			want  string
		}{
			{regex("("), "m.safe_regex"},
			{withHeaders(exact("x-a", "1"), &routev3.HeaderMatcher{Name: "x-b", HeaderMatchSpecifier: &routev3.HeaderMatcher_SafeRegexMatch{SafeRegexMatch: &matcherv3.RegexMatcher{Regex: "["}}}), "m.headers[1].safe_regex_match"},
			{withHeaders(&routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_RangeMatch{RangeMatch: &typev3.Int64Range{Start: 1, End: 2}}}), "m.headers[0]"},
			{withHeaders(&routev3.HeaderMatcher{Name: "x-a", TreatMissingHeaderAsEmpty: true, HeaderMatchSpecifier: &routev3.HeaderMatcher_ExactMatch{ExactMatch: ""}}), "treat_missing_header_as_empty"},
			{&routev3.RouteMatch{}, "path specifier"},
		} {
			if _, err := buildMatch("m", tc.match); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("buildMatch(%v) = %v, want an error containing %q", tc.match, err, tc.want)
			}
		}
	})
}

// TestRouteMatchRuntimeFraction: a runtime_fraction route matches its
// default value's share of the requests its path matches, never a request
// its path does not, and the same way for one request every time; the
// runtime key is ignored (no runtime layer).
func TestRouteMatchRuntimeFraction(t *testing.T) {
	share := func(num uint32, den typev3.FractionalPercent_DenominatorType) *routev3.RouteMatch {
		return &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/v1"},
			RuntimeFraction: &corev3.RuntimeFractionalPercent{DefaultValue: &typev3.FractionalPercent{Numerator: num, Denominator: den}, RuntimeKey: "split"}}
	}
	const n = 4000
	for _, tc := range []struct {
		name     string
		match    *routev3.RouteMatch
		min, max int // matches out of n
	}{
		{"0 of 100", share(0, typev3.FractionalPercent_HUNDRED), 0, 0},
		{"100 of 100", share(100, typev3.FractionalPercent_HUNDRED), n, n},
		{"above the denominator is all", share(200, typev3.FractionalPercent_HUNDRED), n, n},
		{"70 of 100", share(70, typev3.FractionalPercent_HUNDRED), n * 66 / 100, n * 74 / 100},
		{"300000 of a million", share(300_000, typev3.FractionalPercent_MILLION), n * 26 / 100, n * 34 / 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := buildMatch("match", tc.match)
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for range n {
				rv := rand.Uint64()
				ok := m.matches(xbHeaders("gw.example", "/v1/x"), rv)
				if ok {
					got++
				}
				// Envoy draws from the stream id: a request matched again
				// after clear_route_cache matches the same way.
				if m.matches(xbHeaders("gw.example", "/v1/x"), rv) != ok {
					t.Fatalf("random value %d matched once and not again", rv)
				}
			}
			if got < tc.min || got > tc.max {
				t.Fatalf("%d of %d requests matched, want %d..%d", got, n, tc.min, tc.max)
			}
			if m.matches(xbHeaders("gw.example", "/v2"), 0) {
				t.Fatal("a fraction matched a path its prefix does not")
			}
		})
	}
}

func TestVirtualHostSelection(t *testing.T) {
	type vhost struct {
		name    string
		domains []string
	}
	routes := func(t *testing.T, ignorePort bool, vhs ...vhost) *routeConfig {
		t.Helper()
		rc := &routev3.RouteConfiguration{Name: "r", IgnorePortInHostMatching: ignorePort}
		for _, vh := range vhs {
			rc.VirtualHosts = append(rc.VirtualHosts, &routev3.VirtualHost{Name: vh.name, Domains: vh.domains})
		}
		out, err := (&hcmBuild{table: &table{}, env: xbEnv(t, xbResolve)}).routes(rc)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	precedence := []vhost{
		{"any", []string{"*"}},
		{"prefix a", []string{"a.*"}},
		{"prefix a.x", []string{"a.x.*"}},
		{"suffix x.com", []string{"*.x.com"}},
		{"suffix b.x.com", []string{"*.b.x.com"}},
		{"exact", []string{"a.x.com", "Mixed.Example.COM"}},
		{"suffix dash", []string{"*-bar.foo.com"}},
	}
	cases := []struct {
		name       string
		vhosts     []vhost
		ignorePort bool
		authority  string
		want       string // "" for none
	}{
		{"exact beats every wildcard", precedence, false, "a.x.com", "exact"},
		{"longest suffix wildcard", precedence, false, "c.b.x.com", "suffix b.x.com"},
		{"suffix wildcard", precedence, false, "c.x.com", "suffix x.com"},
		{"suffix wildcard beats prefix wildcard", precedence, false, "a.b.x.com", "suffix b.x.com"},
		{"longest prefix wildcard", precedence, false, "a.x.org", "prefix a.x"},
		{"prefix wildcard", precedence, false, "a.y.org", "prefix a"},
		{"star last", precedence, false, "z.org", "any"},
		{"a wildcard does not match the empty string", precedence, false, "-bar.foo.com", "any"},
		{"a wildcard matches one character", precedence, false, "b-bar.foo.com", "suffix dash"},
		{"suffix wildcard needs the dot", precedence, false, "x.com", "any"},
		{"authority is case-insensitive", precedence, false, "A.X.COM", "exact"},
		{"domains are case-insensitive", precedence, false, "mixed.example.com", "exact"},
		{"port kept: the exact domain does not match", precedence, false, "a.x.com:8080", "prefix a.x"},
		{"port stripped with ignore_port_in_host_matching", precedence, true, "a.x.com:8080", "exact"},
		{
			"a shorter suffix wildcard beats a longer prefix wildcard",
			[]vhost{{"prefix", []string{"api.example.*"}}, {"suffix", []string{"*.com"}}}, false, "api.example.com", "suffix",
		},
		{"port kept and no wildcard: no virtual host", []vhost{{"exact", []string{"a.com"}}}, false, "a.com:8080", ""},
		{"port stripped: the exact domain", []vhost{{"exact", []string{"a.com"}}}, true, "A.com:8080", "exact"},
		{"no port to strip", []vhost{{"exact", []string{"a.com"}}}, true, "a.com", "exact"},
		{"a domain with a port", []vhost{{"any", []string{"*"}}, {"port", []string{"a.com:8080"}}}, false, "a.com:8080", "port"},
		{"a domain with a port, other port", []vhost{{"any", []string{"*"}}, {"port", []string{"a.com:8080"}}}, false, "a.com:9090", "any"},
		{"no match", []vhost{{"exact", []string{"a.com"}}, {"suffix", []string{"*.b.com"}}}, false, "c.com", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vh := routes(t, tc.ignorePort, tc.vhosts...).virtualHost(tc.authority)
			got := ""
			if vh != nil {
				got = vh.name
			}
			if got != tc.want {
				t.Errorf("virtualHost(%q) = %q, want %q", tc.authority, got, tc.want)
			}
		})
	}
}

func TestClusterEndpoints(t *testing.T) {
	ep := func(host string, port uint32, hs corev3.HealthStatus) *endpointv3.LbEndpoint {
		return &endpointv3.LbEndpoint{
			HealthStatus: hs,
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
				Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}},
			}}},
		}
	}
	level := func(priority uint32, eps ...*endpointv3.LbEndpoint) *endpointv3.LocalityLbEndpoints {
		return &endpointv3.LocalityLbEndpoints{Priority: priority, LbEndpoints: eps}
	}
	cla := func(levels ...*endpointv3.LocalityLbEndpoints) *endpointv3.ClusterLoadAssignment {
		return &endpointv3.ClusterLoadAssignment{ClusterName: "c", Endpoints: levels}
	}
	var resolved []string
	env := xbEnv(t, func(host string) (string, error) {
		resolved = append(resolved, host)
		switch host {
		case "model-0.pool.svc":
			return "10.0.0.5", nil
		case "model-1.pool.svc":
			return "10.0.0.6", nil
		}
		return xbResolve(host)
	})
	const (
		healthy   = corev3.HealthStatus_HEALTHY
		unknown   = corev3.HealthStatus_UNKNOWN
		degraded  = corev3.HealthStatus_DEGRADED
		unhealthy = corev3.HealthStatus_UNHEALTHY
		draining  = corev3.HealthStatus_DRAINING
		timeout   = corev3.HealthStatus_TIMEOUT
	)
	cases := []struct {
		name    string
		cla     *endpointv3.ClusterLoadAssignment
		want    []string
		wantErr []string
	}{
		{name: "no load assignment", cla: nil, want: nil},
		{name: "no endpoints", cla: cla(), want: nil},
		{
			name: "one level, in order",
			cla:  cla(level(0, ep("10.0.0.2", 80, unknown), ep("10.0.0.1", 80, unknown))),
			want: []string{"10.0.0.2:80", "10.0.0.1:80"},
		},
		{
			name: "localities of one priority together",
			cla:  cla(level(0, ep("10.0.0.1", 80, healthy)), level(1, ep("10.0.0.9", 80, healthy)), level(0, ep("10.0.0.2", 80, healthy))),
			want: []string{"10.0.0.1:80", "10.0.0.2:80"},
		},
		{
			name: "the lowest priority level wins, whatever the order",
			cla:  cla(level(2, ep("10.0.0.3", 80, healthy)), level(1, ep("10.0.0.2", 80, healthy)), level(3, ep("10.0.0.4", 80, healthy))),
			want: []string{"10.0.0.2:80"},
		},
		{
			name: "a level whose hosts are all left out does not count",
			cla: cla(
				level(0, ep("10.0.0.1", 80, unhealthy), ep("10.0.0.2", 80, draining), ep("10.0.0.3", 80, timeout)),
				level(1, ep("10.0.0.4", 80, healthy)),
			),
			want: []string{"10.0.0.4:80"},
		},
		{
			name: "UNHEALTHY, DRAINING and TIMEOUT left out; HEALTHY, UNKNOWN and DEGRADED kept",
			cla: cla(level(0,
				ep("10.0.0.1", 80, healthy), ep("10.0.0.2", 80, unhealthy), ep("10.0.0.3", 80, unknown),
				ep("10.0.0.4", 80, draining), ep("10.0.0.5", 80, degraded), ep("10.0.0.6", 80, timeout),
			)),
			want: []string{"10.0.0.1:80", "10.0.0.3:80", "10.0.0.5:80"},
		},
		{
			name: "host names resolved through env.resolve",
			cla:  cla(level(0, ep("model-0.pool.svc", 8000, healthy), ep("10.0.0.7", 8000, healthy), ep("model-1.pool.svc", 8001, healthy))),
			want: []string{"10.0.0.5:8000", "10.0.0.7:8000", "10.0.0.6:8001"},
		},
		{
			name: "IPv6",
			cla:  cla(level(0, ep("::1", 8000, healthy))),
			want: []string{"[::1]:8000"},
		},
		{
			// As Envoy: a name that does not resolve is no host, not a NACK.
			name: "a host name the resolver does not know",
			cla:  cla(level(0, ep("10.0.0.1", 80, healthy)), level(0, ep("10.0.0.2", 80, healthy), ep("nope.pool.svc", 80, healthy))),
			want: []string{"10.0.0.1:80", "10.0.0.2:80"},
		},
		{
			name: "a pipe address",
			cla: cla(level(0, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: "/tmp/s"}}},
			}}})),
			wantErr: []string{"load_assignment.endpoints[0].lb_endpoints[0]", "pipe"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := clusterEndpoints(tc.cla, &transportSelector{}, env, 0)
			got := a.endpoints
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("endpoints %q, want %q", got, tc.want)
			}
		})
	}
	if !slices.Contains(resolved, "model-0.pool.svc") || !slices.Contains(resolved, "model-1.pool.svc") {
		t.Errorf("resolver asked for %q", resolved)
	}

	// buildCluster uses them for STATIC and EDS clusters alike.
	t.Run("STATIC and EDS clusters", func(t *testing.T) {
		eds := &resources{endpoints: map[string]*endpointv3.ClusterLoadAssignment{
			"svc": cla(level(1, ep("10.0.0.2", 80, healthy)), level(0, ep("10.0.0.1", 80, draining))),
		}}
		edsCluster := xdstest.EDSCluster("eds")
		edsCluster.EdsClusterConfig.ServiceName = "svc"
		cl, tgt, ref, err := buildCluster(edsCluster, eds, env)
		if err != nil || ref.name != "svc" || !slices.Equal(cl.endpoints, []string{"10.0.0.2:80"}) || tgt.addr != "10.0.0.2:80" {
			t.Errorf("EDS cluster: %+v %+v %+v %v", cl, tgt, ref, err)
		}
		missing := xdstest.EDSCluster("missing")
		cl, tgt, ref, err = buildCluster(missing, eds, env)
		if err != nil || ref.name != "missing" || len(cl.endpoints) != 0 || tgt.addr != "" {
			t.Errorf("EDS cluster without an assignment: %+v %+v %+v %v", cl, tgt, ref, err)
		}
		cl, tgt, ref, err = buildCluster(xdstest.StaticCluster("s", "10.0.0.3:80", "10.0.0.4:80"), eds, env)
		if err != nil || ref.name != "" || !slices.Equal(cl.endpoints, []string{"10.0.0.3:80", "10.0.0.4:80"}) || tgt.addr != "10.0.0.3:80" || tgt.tls {
			t.Errorf("STATIC cluster: %+v %+v %+v %v", cl, tgt, ref, err)
		}
		if cl.connectTimeout != 5*time.Second {
			t.Errorf("connect timeout %v, want Envoy's default 5s", cl.connectTimeout)
		}
	})
}

// Per-route filter config fixtures: one listener-level ext_proc filter
// "epp" calling epp-listener, and a cluster per level that may override it.
const (
	prFilter = "epp"
	prMode   = extprocfilterv3.ProcessingMode_SKIP
)

var prClusters = map[string]string{
	"epp-listener": "127.0.0.1:9101",
	"epp-rc":       "127.0.0.1:9102",
	"epp-vh":       "127.0.0.1:9103",
	"epp-route":    "127.0.0.1:9104",
	"epp-tls":      "127.0.0.1:9105", // with TLS
}

// prResources is a listener whose filter is disabled or not, and a route
// configuration whose route configuration, virtual host "vh" and route
// "target" carry the given typed_per_filter_config for the filter (nil:
// none). vh also has a route "plain" without one; virtual host "other-vh"
// (other.example) has a route "other" without one.
func prResources(t *testing.T, disabled, failOpen bool, rcCfg, vhCfg, routeCfg proto.Message) *resources {
	t.Helper()
	ep := xdstest.ExtProc("epp-listener", &extprocfilterv3.ProcessingMode{ResponseHeaderMode: prMode}, failOpen)
	ep.MessageTimeout = durationpb.New(2 * time.Second)
	ep.StatusOnError = &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable}
	ep.DisableImmediateResponse = true
	perFilter := func(m proto.Message) map[string]*anypb.Any {
		if m == nil {
			return nil
		}
		return map[string]*anypb.Any{prFilter: xdstest.Any(m)}
	}
	to := func(name, prefix string, cfg proto.Message) *routev3.Route {
		return &routev3.Route{
			Name:                 name,
			Match:                &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: prefix}},
			Action:               &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "model"}}},
			TypedPerFilterConfig: perFilter(cfg),
		}
	}
	rc := &routev3.RouteConfiguration{
		Name:                 "pr-routes",
		TypedPerFilterConfig: perFilter(rcCfg),
		VirtualHosts: []*routev3.VirtualHost{
			{Name: "vh", Domains: []string{"*"}, TypedPerFilterConfig: perFilter(vhCfg), Routes: []*routev3.Route{to("target", "/target", routeCfg), to("plain", "/", nil)}},
			{Name: "other-vh", Domains: []string{"other.example"}, Routes: []*routev3.Route{to("other", "/", nil)}},
		},
	}
	msgs := []proto.Message{
		xdstest.Listener("pr", 80, "pr-routes", xdstest.HTTPFilter(prFilter, ep, disabled)),
		rc, xdstest.StaticCluster("model", "127.0.0.1:8000"),
	}
	for name, addr := range prClusters {
		c := xdstest.StaticCluster(name, addr)
		if name == "epp-tls" {
			c.TransportSocket = xdstest.AcceptAnyTLS()
		}
		msgs = append(msgs, c)
	}
	return xbResources(t, msgs...)
}

func prOverrides(ov *extprocfilterv3.ExtProcOverrides) *extprocfilterv3.ExtProcPerRoute {
	return &extprocfilterv3.ExtProcPerRoute{Override: &extprocfilterv3.ExtProcPerRoute_Overrides{Overrides: ov}}
}

func TestPerRouteFilterConfig(t *testing.T) {
	env := xbEnv(t, xbResolve)
	fcDisabled := &routev3.FilterConfig{Disabled: true}
	prDisabled := &extprocfilterv3.ExtProcPerRoute{Override: &extprocfilterv3.ExtProcPerRoute_Disabled{Disabled: true}}
	grpcTo := func(cluster string) *extprocfilterv3.ExtProcPerRoute {
		return prOverrides(&extprocfilterv3.ExtProcOverrides{GrpcService: xbGrpc(cluster)})
	}
	listener, rc, vh, rt := prClusters["epp-listener"], prClusters["epp-rc"], prClusters["epp-vh"], prClusters["epp-route"]

	// checkListenerSettings: settings no override touched are the listener's.
	checkListenerSettings := func(t *testing.T, cfg extprocfilter.FilterConfig) {
		t.Helper()
		if cfg.Name != prFilter || cfg.MessageTimeout != 2*time.Second || cfg.StatusOnError != 503 || !cfg.DisableImmediateResponse {
			t.Errorf("name %q, message timeout %v, status on error %d, disable_immediate_response %v: not the listener's",
				cfg.Name, cfg.MessageTimeout, cfg.StatusOnError, cfg.DisableImmediateResponse)
		}
	}
	cases := []struct {
		name     string
		disabled bool // HttpFilter.disabled
		failOpen bool // the listener's failure_mode_allow
		rc       proto.Message
		vh       proto.Message
		route    proto.Message
		// want is the target each route's client calls ("" for no client).
		want  map[string]string
		check func(t *testing.T, target extprocfilter.FilterConfig)
	}{
		{
			name: "no per-route config: the listener's client on every route",
			want: map[string]string{"target": listener, "plain": listener, "other": listener},
		},
		{
			name:  "(a) FilterConfig disabled on the route",
			route: fcDisabled,
			want:  map[string]string{"target": "", "plain": listener, "other": listener},
		},
		{
			name: "(a) FilterConfig disabled on the virtual host",
			vh:   fcDisabled,
			want: map[string]string{"target": "", "plain": "", "other": listener},
		},
		{
			name:     "(b) FilterConfig wrapping empty overrides enables a listener-disabled filter with the listener's config",
			disabled: true,
			route:    &routev3.FilterConfig{Config: xdstest.Any(prOverrides(&extprocfilterv3.ExtProcOverrides{}))},
			want:     map[string]string{"target": listener, "plain": "", "other": ""},
			check: func(t *testing.T, cfg extprocfilter.FilterConfig) {
				checkListenerSettings(t, cfg)
				if cfg.FailureModeAllow || cfg.TLS || cfg.ProcessingMode.GetResponseHeaderMode() != prMode ||
					!slices.Equal(cfg.MetadataOptions.Receiving, []string{wire.LBNamespace}) {
					t.Errorf("not the listener's config: %+v", cfg)
				}
			},
		},
		{
			name:     "(b) ExtProcPerRoute overrides enable a listener-disabled filter",
			disabled: true,
			route:    prOverrides(&extprocfilterv3.ExtProcOverrides{}),
			want:     map[string]string{"target": listener, "plain": "", "other": ""},
			check:    checkListenerSettings,
		},
		{
			name:  "(c) ExtProcPerRoute disabled",
			route: prDisabled,
			want:  map[string]string{"target": "", "plain": listener, "other": listener},
		},
		{
			name:     "(c) ExtProcPerRoute disabled on a listener-disabled filter",
			disabled: true,
			route:    prDisabled,
			want:     map[string]string{"target": "", "plain": "", "other": ""},
		},
		{
			name:  "(d) failure_mode_allow overridden to true",
			route: prOverrides(&extprocfilterv3.ExtProcOverrides{FailureModeAllow: wrapperspb.Bool(true)}),
			want:  map[string]string{"target": listener, "plain": listener},
			check: func(t *testing.T, cfg extprocfilter.FilterConfig) {
				checkListenerSettings(t, cfg)
				if !cfg.FailureModeAllow {
					t.Error("failure_mode_allow not overridden")
				}
			},
		},
		{
			name:     "(d) failure_mode_allow overridden to false",
			failOpen: true,
			route:    prOverrides(&extprocfilterv3.ExtProcOverrides{FailureModeAllow: wrapperspb.Bool(false)}),
			want:     map[string]string{"target": listener, "plain": listener},
			check: func(t *testing.T, cfg extprocfilter.FilterConfig) {
				if cfg.FailureModeAllow {
					t.Error("failure_mode_allow: false not applied")
				}
			},
		},
		{
			name:  "(d) processing_mode overridden",
			route: prOverrides(&extprocfilterv3.ExtProcOverrides{ProcessingMode: xdstest.DuplexMode()}),
			want:  map[string]string{"target": listener, "plain": listener},
			check: func(t *testing.T, cfg extprocfilter.FilterConfig) {
				checkListenerSettings(t, cfg)
				if !proto.Equal(cfg.ProcessingMode, xdstest.DuplexMode()) {
					t.Errorf("processing mode %v", cfg.ProcessingMode)
				}
			},
		},
		{
			name:  "(d) grpc_service overridden to another cluster, with TLS",
			route: grpcTo("epp-tls"),
			want:  map[string]string{"target": prClusters["epp-tls"], "plain": listener},
			check: func(t *testing.T, cfg extprocfilter.FilterConfig) {
				checkListenerSettings(t, cfg)
				if !cfg.TLS || cfg.ProcessingMode.GetResponseHeaderMode() != prMode {
					t.Errorf("config %+v", cfg)
				}
			},
		},
		{
			name:  "(d) grpc_service overridden to a cluster that does not exist",
			route: grpcTo("nope"),
			want:  map[string]string{"target": "cluster:nope", "plain": listener},
		},
		{
			name: "(d) metadata_options overridden",
			route: prOverrides(&extprocfilterv3.ExtProcOverrides{MetadataOptions: &extprocfilterv3.MetadataOptions{
				ForwardingNamespaces: &extprocfilterv3.MetadataOptions_MetadataNamespaces{Untyped: []string{"fwd"}},
				ReceivingNamespaces:  &extprocfilterv3.MetadataOptions_MetadataNamespaces{Untyped: []string{"recv-a", "recv-b"}},
			}}),
			want: map[string]string{"target": listener, "plain": listener},
			check: func(t *testing.T, cfg extprocfilter.FilterConfig) {
				checkListenerSettings(t, cfg)
				if mo := cfg.MetadataOptions; mo == nil || !slices.Equal(mo.Forwarding, []string{"fwd"}) || !slices.Equal(mo.Receiving, []string{"recv-a", "recv-b"}) {
					t.Errorf("metadata options %+v", mo)
				}
			},
		},
		{
			name:  "(e) route beats virtual host beats route configuration",
			rc:    grpcTo("epp-rc"),
			vh:    grpcTo("epp-vh"),
			route: grpcTo("epp-route"),
			want:  map[string]string{"target": rt, "plain": vh, "other": rc},
		},
		{
			name:     "(e) the route's FilterConfig disabled beats the virtual host's enabling",
			disabled: true,
			vh:       grpcTo("epp-vh"),
			route:    fcDisabled,
			want:     map[string]string{"target": "", "plain": vh, "other": ""},
		},
		{
			name:     "(e) the virtual host's disabled beats the route configuration's enabling",
			disabled: true,
			rc:       grpcTo("epp-rc"),
			vh:       prDisabled,
			want:     map[string]string{"target": "", "plain": "", "other": rc},
		},
		{
			name:  "(e) the route's overrides beat the virtual host's disabled",
			vh:    prDisabled,
			route: grpcTo("epp-route"),
			want:  map[string]string{"target": rt, "plain": "", "other": listener},
		},
		{
			name:     "(f) a listener-disabled filter without per-route config stays off",
			disabled: true,
			want:     map[string]string{"target": "", "plain": "", "other": ""},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb := xbBuildOne(t, prResources(t, tc.disabled, tc.failOpen, tc.rc, tc.vh, tc.route), env)
			if len(tb.filters) != 1 {
				t.Fatalf("%d filters", len(tb.filters))
			}
			// The listener-level client never changes with per-route config.
			lc := tb.filters[0].client
			if tb.filters[0].disabled != tc.disabled {
				t.Errorf("HttpFilter.disabled %v, want %v", tb.filters[0].disabled, tc.disabled)
			}
			if lc == nil {
				t.Fatal("no listener-level client")
			}
			cfg := lc.Config()
			checkListenerSettings(t, cfg)
			if cfg.Target != listener || cfg.TLS || cfg.FailureModeAllow != tc.failOpen ||
				cfg.ProcessingMode.GetResponseHeaderMode() != prMode ||
				cfg.ProcessingMode.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_NONE ||
				!slices.Equal(cfg.MetadataOptions.Forwarding, []string{wire.LBNamespace}) ||
				!slices.Equal(cfg.MetadataOptions.Receiving, []string{wire.LBNamespace}) {
				t.Errorf("listener-level client changed: %+v", cfg)
			}
			for name, want := range tc.want {
				// What a request starting on the route calls: nothing when
				// the filter is not in its chain or ExtProcPerRoute disables it.
				r := xbRoute(t, tb, name)
				c := r.filters[0]
				got := ""
				if c != nil && tb.inChain(r, 0) {
					got = c.Config().Target
				}
				if got != want {
					t.Errorf("route %q calls %q, want %q", name, got, want)
				}
				// A route without any per-route config shares the listener's client.
				if name == "other" && tc.rc == nil && c != lc {
					t.Errorf("route %q has its own client", name)
				}
			}
			if tc.check != nil {
				if c := xbRoute(t, tb, "target").filters[0]; c != nil {
					tc.check(t, c.Config())
				}
			}
		})
	}
}

// TestRoundRobinStartsAtRandom: each build of a cluster starts round robin
// at a random endpoint, as Envoy seeds a new load balancer, so a fallback
// does not send every first request to the first endpoint. 30 builds of a
// three-endpoint cluster all starting at one endpoint would happen with
// probability 3^-29.
func TestRoundRobinStartsAtRandom(t *testing.T) {
	env := xbEnv(t, xbResolve)
	firsts := map[string]bool{}
	for range 30 {
		cl, _, _, err := buildCluster(xdstest.StaticCluster("s", "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"), &resources{}, env)
		if err != nil {
			t.Fatal(err)
		}
		first, err := cl.roundRobin()
		if err != nil {
			t.Fatal(err)
		}
		second, _ := cl.roundRobin()
		third, _ := cl.roundRobin()
		if first[0] == second[0] || second[0] == third[0] || first[0] == third[0] {
			t.Fatalf("round robin took %v %v %v: not a rotation", first, second, third)
		}
		firsts[first[0]] = true
	}
	if len(firsts) < 2 {
		t.Errorf("30 builds all started round robin at %v", firsts)
	}
}

func TestHostChoice(t *testing.T) {
	env := xbEnv(t, xbResolve)
	const (
		a, b, c = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
		outside = "10.9.9.9:8000"
	)
	mkCluster := func(t *testing.T, cl *clusterv3.Cluster, eds map[string]*endpointv3.ClusterLoadAssignment) *cluster {
		t.Helper()
		out, _, _, err := buildCluster(cl, &resources{endpoints: eds}, env)
		if err != nil {
			t.Fatal(err)
		}
		// Round robin from the first endpoint, so the cases can list the
		// order (a built cluster starts at a random one:
		// TestRoundRobinStartsAtRandom).
		out.next.Store(0)
		return out
	}
	odCluster := func(oc *clusterv3.Cluster_OriginalDstLbConfig) func(t *testing.T) *cluster {
		return func(t *testing.T) *cluster {
			return mkCluster(t, &clusterv3.Cluster{
				Name:                 "od",
				ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
				LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
				LbConfig:             &clusterv3.Cluster_OriginalDstLbConfig_{OriginalDstLbConfig: oc},
			}, nil)
		}
	}
	byHeader := odCluster(&clusterv3.Cluster_OriginalDstLbConfig{UseHttpHeader: true, HttpHeaderName: "X-Dst"})
	byDefaultHeader := odCluster(&clusterv3.Cluster_OriginalDstLbConfig{UseHttpHeader: true})
	noHeader := odCluster(&clusterv3.Cluster_OriginalDstLbConfig{})
	byMetadata := odCluster(&clusterv3.Cluster_OriginalDstLbConfig{MetadataKey: xdstest.LBKey("dst")})
	withEndpoints := func(t *testing.T) *cluster {
		// Flag mode: an ORIGINAL_DST cluster with fallback endpoints.
		return &cluster{name: "od", originalDst: &originalDst{header: "x-dst"}, endpoints: []string{c}}
	}
	// overrideHost is the Istio shape's pool cluster with a header source
	// after the metadata one.
	overrideHost := func(walk, any bool) func(t *testing.T) *cluster {
		return func(t *testing.T) *cluster {
			pool := xdstest.EDSCluster("pool")
			pool.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
			pool.LoadBalancingPolicy = &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
				TypedExtensionConfig: &corev3.TypedExtensionConfig{
					Name: "envoy.load_balancing_policies.override_host",
					TypedConfig: xdstest.Any(&overridehostv3.OverrideHost{
						OverrideHostSources: []*overridehostv3.OverrideHost_OverrideHostSource{
							{Metadata: xdstest.LBKey(wire.DestinationEndpointKey)},
							{Header: "X-Dst"},
						},
						SelectedHostKey: xdstest.LBKey(wire.ServedEndpointKey),
						FallbackPolicy: &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
							TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "envoy.load_balancing_policies.round_robin", TypedConfig: xdstest.Any(&roundrobinv3.RoundRobin{})},
						}}},
					}),
				},
			}}}
			cl := mkCluster(t, pool, map[string]*endpointv3.ClusterLoadAssignment{"pool": xdstest.Assignment("pool", a, b, c)})
			cl.walkList, cl.anyHost = walk, any
			return cl
		}
	}
	md := func(key, value string) map[string]*structpb.Struct {
		return map[string]*structpb.Struct{wire.LBNamespace: {Fields: map[string]*structpb.Value{key: structpb.NewStringValue(value)}}}
	}
	dest := func(v string) map[string]*structpb.Struct { return md(wire.DestinationEndpointKey, v) }
	h := func(kv ...string) extprocfilter.Headers {
		return xbHeaders("gw.example", "/v1/chat/completions", kv...)
	}

	cases := []struct {
		name    string
		cluster func(t *testing.T) *cluster
		h       extprocfilter.Headers
		md      map[string]*structpb.Struct
		want    [][]string // hosts of successive picks
		wantErr bool       // errors.Is errNoHealthyUpstream
	}{
		{name: "ORIGINAL_DST header", cluster: byHeader, h: h("x-dst", a), want: [][]string{{a}}},
		{name: "ORIGINAL_DST header, first instance only", cluster: byHeader, h: h("x-dst", b, "x-dst", a), want: [][]string{{b}, {b}}},
		{name: "ORIGINAL_DST header IPv6", cluster: byHeader, h: h("x-dst", "[::1]:8000"), want: [][]string{{"[::1]:8000"}}},
		{name: "ORIGINAL_DST header any host, not only endpoints", cluster: byHeader, h: h("x-dst", outside), want: [][]string{{outside}}},
		{name: "ORIGINAL_DST header unparsable", cluster: byHeader, h: h("x-dst", "pod-a:8000"), wantErr: true},
		{name: "ORIGINAL_DST header with a comma list", cluster: byHeader, h: h("x-dst", a+","+b), wantErr: true},
		{name: "ORIGINAL_DST header absent", cluster: byHeader, h: h(), wantErr: true},
		{name: "ORIGINAL_DST header absent, metadata not read", cluster: byHeader, h: h(), md: dest(a), wantErr: true},
		{name: "ORIGINAL_DST header absent with endpoints", cluster: withEndpoints, h: h(), want: [][]string{{c}}},
		{name: "ORIGINAL_DST default header name", cluster: byDefaultHeader, h: h("x-envoy-original-dst-host", a, "x-dst", b), want: [][]string{{a}}},
		{name: "ORIGINAL_DST use_http_header false", cluster: noHeader, h: h("x-envoy-original-dst-host", a), wantErr: true},
		{name: "ORIGINAL_DST metadata_key", cluster: byMetadata, md: md("dst", b), h: h(), want: [][]string{{b}}},
		{name: "ORIGINAL_DST metadata_key absent", cluster: byMetadata, md: md("other", b), h: h("x-envoy-original-dst-host", a), wantErr: true},
		{name: "ORIGINAL_DST metadata_key unparsable", cluster: byMetadata, md: md("dst", "pod-b"), h: h(), wantErr: true},

		{name: "override_host metadata", cluster: overrideHost(false, false), md: dest(b), h: h(), want: [][]string{{b}, {b}}},
		{name: "override_host header when no metadata", cluster: overrideHost(false, false), h: h("x-dst", c), want: [][]string{{c}}},
		{name: "override_host metadata before header", cluster: overrideHost(false, false), md: dest(b), h: h("x-dst", c), want: [][]string{{b}}},
		{name: "override_host metadata outside the cluster: the header", cluster: overrideHost(false, false), md: dest(outside), h: h("x-dst", c), want: [][]string{{c}}},
		{name: "override_host nothing usable: round robin", cluster: overrideHost(false, false), md: dest(outside), h: h("x-dst", "pod-c"), want: [][]string{{a}, {b}, {c}, {a}}},
		{name: "override_host no source: round robin", cluster: overrideHost(false, false), h: h(), want: [][]string{{a}, {b}}},
		{name: "override_host comma list: the first host", cluster: overrideHost(false, false), md: dest(c + "," + a), h: h(), want: [][]string{{c}}},
		{name: "override_host comma list: unusable entries skipped", cluster: overrideHost(false, false), md: dest(outside + ", pod-x:80 , " + b + "," + a), h: h(), want: [][]string{{b}}},
		{name: "override_host comma list walked", cluster: overrideHost(true, false), md: dest(c + "," + outside + "," + a), h: h(), want: [][]string{{c, a}}},
		{name: "override_host any host (flag mode)", cluster: overrideHost(false, true), md: dest(outside), h: h(), want: [][]string{{outside}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cl := tc.cluster(t)
			if tc.wantErr {
				got, err := cl.targets(tc.h, tc.md)
				if !errors.Is(err, errNoHealthyUpstream) {
					t.Errorf("targets = %q, %v; want an error wrapping %v", got, err, errNoHealthyUpstream)
				}
				return
			}
			for i, want := range tc.want {
				got, err := cl.targets(tc.h, tc.md)
				if err != nil || !slices.Equal(got, want) {
					t.Errorf("pick %d: targets = %q, %v; want %q", i, got, err, want)
				}
			}
		})
	}

	t.Run("selected_host_key", func(t *testing.T) {
		sel := overrideHost(false, false)(t).override.selected
		if sel == nil || sel.namespace != wire.LBNamespace || !slices.Equal(sel.path, []string{wire.ServedEndpointKey}) {
			t.Fatalf("selected_host_key %+v", sel)
		}
		m := dest(a)
		sel.set(m, b)
		if got := sel.value(m).GetStringValue(); got != b {
			t.Errorf("lookup after set = %q", got)
		}
		f := m[wire.LBNamespace].GetFields()
		if f[wire.ServedEndpointKey].GetStringValue() != b || f[wire.DestinationEndpointKey].GetStringValue() != a {
			t.Errorf("namespace after set: %v", m[wire.LBNamespace])
		}
		sel.set(m, c)
		if got := sel.value(m).GetStringValue(); got != c {
			t.Errorf("lookup after a second set = %q", got)
		}
		// A namespace that does not exist yet, and a nested path.
		nested := &metadataKey{namespace: "ns", path: []string{"outer", "inner"}}
		m = map[string]*structpb.Struct{}
		if got := nested.value(m).GetStringValue(); got != "" {
			t.Errorf("lookup in empty metadata = %q", got)
		}
		nested.set(m, a)
		if got := nested.value(m).GetStringValue(); got != a {
			t.Errorf("nested lookup after set = %q", got)
		}
		if got := m["ns"].GetFields()["outer"].GetStructValue().GetFields()["inner"].GetStringValue(); got != a {
			t.Errorf("nested value %q in %v", got, m["ns"])
		}
	})

	t.Run("metadataKeyOf", func(t *testing.T) {
		k, err := metadataKeyOf("k", &metadatav3.MetadataKey{Key: "ns", Path: []*metadatav3.MetadataKey_PathSegment{
			{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: "a"}}, {Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: "b"}},
		}})
		if err != nil || k.namespace != "ns" || !slices.Equal(k.path, []string{"a", "b"}) {
			t.Errorf("metadataKeyOf = %+v, %v", k, err)
		}
		if _, err := metadataKeyOf("k", &metadatav3.MetadataKey{Key: "ns"}); err == nil || !strings.Contains(err.Error(), "k: want a key and a path") {
			t.Errorf("a key without a path: %v", err)
		}
	})
}
