package envoysim

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/envoysim/xdstest"
)

// What Istio sends an inference gateway, beyond what the Istio shape
// tests: xdstest.IstioGateway is istiod's output field for field.

const igMesh = "127.0.0.1:6443"

// igResources is the Istio gateway shape for xbPool, edited.
func igResources(t *testing.T, edit func(r *resources)) *resources {
	t.Helper()
	r := xbResources(t, xdstest.IstioGateway(xbPool, igMesh)...)
	if edit != nil {
		edit(r)
	}
	return r
}

// TestIstioGatewayShape: istiod's whole output builds, and each field the
// stand-in interprets reads as Envoy reads it.
func TestIstioGatewayShape(t *testing.T) {
	tb := xbBuildOne(t, igResources(t, nil), xbEnv(t, xbResolve))
	if !tb.proxy100Continue || tb.bufferLimit != defaultBufferLimit {
		t.Errorf("proxy_100_continue %v, buffer limit %d", tb.proxy100Continue, tb.bufferLimit)
	}
	// The chain: Istio's metadata exchange, then the InferencePool
	// filter; grpc_stats, istio.alpn, fault and CORS pass through.
	if len(tb.filters) != 2 || tb.filters[0].peer == nil || tb.filters[1].name != xdstest.IstioFilter {
		t.Fatalf("filters %+v", tb.filters)
	}
	pm := tb.filters[0].peer
	if pm.downstreamDiscovery || !pm.upstreamDiscovery || !slices.Equal(pm.upstreamPropagation, []bool{false}) ||
		pm.downstreamPropagation != nil || pm.id != xbNode.id || pm.value == "" {
		t.Errorf("metadata exchange %+v", pm)
	}
	rt := tb.match(xbHeaders("gw.example", "/v1/chat/completions"), 0)
	if rt == nil || rt.name != xdstest.IstioRetryRouteName {
		t.Fatalf("matched %+v", rt)
	}
	wantOn := retryConnectFailure | retryRefusedStream | retryGrpcUnavailable | retryGrpcCancelled | retryRetriableStatusCodes
	if rp := rt.retry; rp == nil || rp.on != wantOn || rp.numRetries != 2 || !rp.previousHosts || rp.hostSelections != 5 ||
		rp.base != 25*time.Millisecond || rp.max != 250*time.Millisecond || len(rp.statusCodes) != 0 {
		t.Errorf("retry policy %+v", rt.retry)
	}
	if !rt.attemptCount || rt.clusterNotFound != http.StatusInternalServerError || rt.maxGrpcTimeout == nil || *rt.maxGrpcTimeout != 0 || rt.timeout != 0 {
		t.Errorf("route %+v", rt)
	}
	if cfg := rt.filters[1].Config(); cfg.Target != xbPool.EPP || !cfg.TLS {
		t.Errorf("the pool's route calls %s (TLS %v)", cfg.Target, cfg.TLS)
	}
	mesh := tb.clusters[xdstest.IstioMeshCluster]
	for _, got := range []hostTransport{mesh.transportFor(igMesh), mesh.unlisted} {
		if got.kind != plaintext || !strings.Contains(got.name, "tlsMode-disabled") {
			t.Errorf("mesh host without tlsMode: %+v, want tlsMode-disabled's raw_buffer", got)
		}
	}
	for _, ep := range xbPool.Endpoints {
		if got := tb.clusters[xdstest.IstioPoolSvc].transportFor(ep); got.kind != plaintext {
			t.Errorf("pool host %s: %+v", ep, got)
		}
	}
}

// TestTransportSocketMatches follows TransportSocketMatcherImpl::resolve:
// the first match whose criteria are all in the host's
// envoy.transport_socket_match metadata, else the first in its locality's,
// else transport_socket; criteria compare whole values.
func TestTransportSocketMatches(t *testing.T) {
	md := func(ns string, kv map[string]any) *corev3.Metadata {
		s, err := structpb.NewStruct(kv)
		if err != nil {
			t.Fatal(err)
		}
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{ns: s}}
	}
	tsm := func(kv map[string]any) *corev3.Metadata { return md(transportSocketMatchKey, kv) }
	criteria := func(kv map[string]any) *structpb.Struct {
		s, _ := structpb.NewStruct(kv)
		return s
	}
	istioMTLS := xdstest.IstioAutoMTLS("c")
	own := &clusterv3.Cluster{
		TransportSocket: xdstest.AcceptAnyTLS(),
		TransportSocketMatches: []*clusterv3.Cluster_TransportSocketMatch{
			istioMTLS[0],
			{Name: "v2", Match: criteria(map[string]any{"version": "v2", "zone": "a"}), TransportSocket: istioMTLS[1].TransportSocket},
			{Name: "weight", Match: criteria(map[string]any{"weight": 1}), TransportSocket: istioMTLS[1].TransportSocket},
		},
	}
	istio := &clusterv3.Cluster{TransportSocketMatches: istioMTLS}
	cases := []struct {
		name           string
		cluster        *clusterv3.Cluster
		host, locality *corev3.Metadata
		want           string // the socket's name
		kind           transportKind
	}{
		{"no metadata: transport_socket", own, nil, nil, "transport_socket", acceptAnyTLS},
		{"host tlsMode istio", own, tsm(map[string]any{"tlsMode": "istio"}), nil, "tlsMode-istio", secretNotSupplied},
		{"criteria a subset of the host's", own, tsm(map[string]any{"tlsMode": "istio", "other": "x"}), nil, "tlsMode-istio", secretNotSupplied},
		{"values compare exactly", own, tsm(map[string]any{"tlsMode": "ISTIO"}), nil, "transport_socket", acceptAnyTLS},
		{"every criterion needed", own, tsm(map[string]any{"version": "v2"}), nil, "transport_socket", acceptAnyTLS},
		{"two criteria", own, tsm(map[string]any{"version": "v2", "zone": "a"}), nil, `"v2"`, plaintext},
		{"numbers", own, tsm(map[string]any{"weight": 1.0}), nil, `"weight"`, plaintext},
		{"locality when the host matches none", own, nil, tsm(map[string]any{"tlsMode": "istio"}), "tlsMode-istio", secretNotSupplied},
		{"the host before its locality", own, tsm(map[string]any{"version": "v2", "zone": "a"}), tsm(map[string]any{"tlsMode": "istio"}), `"v2"`, plaintext},
		{"another namespace is not read", own, md("istio", map[string]any{"tlsMode": "istio"}), nil, "transport_socket", acceptAnyTLS},
		// Istio's empty match catches every host first: a locality's
		// tlsMode never applies.
		{"Istio: plain host", istio, nil, nil, "tlsMode-disabled", plaintext},
		{"Istio: host tlsMode istio", istio, tsm(map[string]any{"tlsMode": "istio"}), nil, "tlsMode-istio", secretNotSupplied},
		{"Istio: the empty match before the locality's", istio, nil, tsm(map[string]any{"tlsMode": "istio"}), "tlsMode-disabled", plaintext},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sel, err := clusterTransports(tc.cluster)
			if err != nil {
				t.Fatal(err)
			}
			got := sel.pick(tc.host, tc.locality)
			if !strings.Contains(got.name, tc.want) || got.kind != tc.kind {
				t.Fatalf("picked %+v, want %s of kind %d", got, tc.want, tc.kind)
			}
		})
	}
}

// TestTransportSocketsInBuild: per-host sockets reach the router and the
// processors' clients; what the stand-in cannot reproduce is NACKed.
func TestTransportSocketsInBuild(t *testing.T) {
	env := xbEnv(t, xbResolve)
	markFirst := func(r *resources, cluster string) {
		xdstest.IstioMTLSEndpoint(r.endpoints[cluster].Endpoints[0].LbEndpoints[0])
	}
	t.Run("pool host with Istio mTLS", func(t *testing.T) {
		tb := xbBuildOne(t, igResources(t, func(r *resources) {
			r.clusters[xdstest.IstioPoolSvc].TransportSocketMatches = xdstest.IstioAutoMTLS(xdstest.IstioPoolSvc)
			markFirst(r, xdstest.IstioPoolSvc)
		}), env)
		pool := tb.clusters[xdstest.IstioPoolSvc]
		if pool.transportFor(xbPool.Endpoints[0]).kind != secretNotSupplied || pool.transportFor(xbPool.Endpoints[1]).kind != plaintext {
			t.Fatalf("transports %+v", pool.transports)
		}
	})
	t.Run("picker host with Istio mTLS: its client cannot connect", func(t *testing.T) {
		tb := xbBuildOne(t, igResources(t, func(r *resources) {
			c := r.clusters[xdstest.IstioEPPCluster]
			c.TransportSocket = nil
			c.TransportSocketMatches = xdstest.IstioAutoMTLS(xdstest.IstioEPPCluster)
			markFirst(r, xdstest.IstioEPPCluster)
		}), env)
		rt := tb.match(xbHeaders("gw.example", "/v1/chat/completions"), 0)
		if cfg := rt.filters[1].Config(); cfg.Target != secretNotSuppliedTarget {
			t.Fatalf("client %+v", cfg)
		}
	})
	nack := []struct {
		name string
		edit func(r *resources)
		want []string
	}{
		{
			name: "routed host selecting inline TLS",
			edit: func(r *resources) {
				m := xdstest.IstioAutoMTLS(xdstest.IstioPoolSvc)
				m[0].TransportSocket = xdstest.AcceptAnyTLS()
				r.clusters[xdstest.IstioPoolSvc].TransportSocketMatches = m
				markFirst(r, xdstest.IstioPoolSvc)
			},
			want: []string{"reaches " + xbPool.Endpoints[0], "over TLS", `transport_socket_matches[0] "tlsMode-istio"`},
		},
		{
			name: "transport_socket_matcher",
			edit: func(r *resources) {
				setEmpty(r.clusters[xdstest.IstioMeshCluster], "transport_socket_matcher")
			},
			want: []string{"transport_socket_matcher"},
		},
		{
			name: "match without a transport_socket",
			edit: func(r *resources) {
				r.clusters[xdstest.IstioMeshCluster].TransportSocketMatches[1].TransportSocket = nil
			},
			want: []string{`transport_socket_matches[1] "tlsMode-disabled": transport_socket is required`},
		},
		{
			name: "match of another socket type",
			edit: func(r *resources) {
				r.clusters[xdstest.IstioMeshCluster].TransportSocketMatches[1].TransportSocket = &corev3.TransportSocket{
					Name: "proxy_protocol", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: &anypb.Any{
						TypeUrl: "type.googleapis.com/envoy.extensions.transport_sockets.proxy_protocol.v3.ProxyProtocolUpstreamTransport",
					}},
				}
			},
			want: []string{"ProxyProtocolUpstreamTransport is not implemented"},
		},
		{
			name: "tls_params below TLS 1.2",
			edit: func(r *resources) {
				r.clusters[xdstest.IstioEPPCluster].TransportSocket = tlsContext(&tlsv3.CommonTlsContext{TlsParams: &tlsv3.TlsParameters{
					TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_0,
				}})
			},
			want: []string{"tls_minimum_protocol_version TLSv1_0"},
		},
		{
			name: "tls_params cipher_suites",
			edit: func(r *resources) {
				r.clusters[xdstest.IstioEPPCluster].TransportSocket = tlsContext(&tlsv3.CommonTlsContext{TlsParams: &tlsv3.TlsParameters{
					CipherSuites: []string{"ECDHE-RSA-AES128-GCM-SHA256"},
				}})
			},
			want: []string{"TlsParameters.cipher_suites"},
		},
	}
	for _, tc := range nack {
		t.Run("NACK "+tc.name, func(t *testing.T) {
			_, err := build(igResources(t, tc.edit), env)
			if err == nil {
				t.Fatalf("accepted; want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\n does not contain %q", err, w)
				}
			}
		})
	}
	t.Run("inline TLS match no routed host selects", func(t *testing.T) {
		xbBuildOne(t, igResources(t, func(r *resources) {
			m := xdstest.IstioAutoMTLS(xdstest.IstioPoolSvc)
			m[0].TransportSocket = xdstest.AcceptAnyTLS()
			r.clusters[xdstest.IstioPoolSvc].TransportSocketMatches = m
		}), env)
	})
}

func tlsContext(ctc *tlsv3.CommonTlsContext) *corev3.TransportSocket {
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{
		TypedConfig: xdstest.Any(&tlsv3.UpstreamTlsContext{CommonTlsContext: ctc}),
	}}
}

// TestClusterFilters: Istio's TCP metadata exchange is accepted where it
// stays inert on the stand-in's connections; nothing else is.
func TestClusterFilters(t *testing.T) {
	env := xbEnv(t, xbResolve)
	mx := func(v map[string]any) *clusterv3.Filter {
		return &clusterv3.Filter{Name: "istio.metadata_exchange", TypedConfig: xdstest.TypedStruct(istioMXTCPType, v)}
	}
	for _, tc := range []struct {
		name string
		f    *clusterv3.Filter
		want string // "" accepted
	}{
		{"Istio's", mx(map[string]any{"protocol": "istio-peer-exchange", "enable_discovery": true}), ""},
		{"protocol h2, which gRPC over TLS negotiates", mx(map[string]any{"protocol": "h2"}), `protocol "h2"`},
		{"no protocol: plaintext connections would run it", mx(map[string]any{}), `protocol ""`},
		{"another field", mx(map[string]any{"protocol": "istio-peer-exchange", "additional_labels": []any{"x"}}), "MetadataExchange.additional_labels"},
		{"another filter", &clusterv3.Filter{Name: "envoy.filters.upstream_network.x", TypedConfig: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y"}}, "x.Y is not implemented"},
		{"config_discovery", &clusterv3.Filter{Name: "x", ConfigDiscovery: &corev3.ExtensionConfigSource{}}, "Filter.config_discovery"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := igResources(t, func(r *resources) { r.clusters[xdstest.IstioEPPCluster].Filters = []*clusterv3.Filter{tc.f} })
			_, err := build(r, env)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestPassThroughFilters: Istio's filters that change nothing as
// configured are left out of the chain; configured to act, they are NACKed.
func TestPassThroughFilters(t *testing.T) {
	env := xbEnv(t, xbResolve)
	withFilter := func(hf *hcmv3.HttpFilter) func(r *resources) {
		return func(r *resources) {
			xbEditHCM(t, r.listeners[xdstest.IstioListener], func(h *hcmv3.HttpConnectionManager) {
				h.HttpFilters = slices.Insert(h.HttpFilters, 0, hf)
			})
		}
	}
	raw := func(name, url string) *hcmv3.HttpFilter {
		return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: &anypb.Any{TypeUrl: url}}}
	}
	ts := func(name, url string, v map[string]any) *hcmv3.HttpFilter {
		return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: xdstest.TypedStruct(url, v)}}
	}
	abort := &faultv3.HTTPFault{Abort: &faultv3.FaultAbort{
		ErrorType:  &faultv3.FaultAbort_HttpStatus{HttpStatus: 503},
		Percentage: &typev3.FractionalPercent{Numerator: 100},
	}}
	for _, tc := range []struct {
		name string
		edit func(r *resources)
		want string // "" accepted
	}{
		{"the gateway shape's own (grpc_stats, istio.alpn, fault, cors)", nil, ""},
		{"istio.stats", withFilter(raw("istio.stats", "type.googleapis.com/stats.PluginConfig")), ""},
		{"istio.stats in a TypedStruct", withFilter(ts("istio.stats", "type.googleapis.com/stats.PluginConfig", map[string]any{"disable_host_header_fallback": true})), ""},
		{"fault with an abort", withFilter(xdstest.HTTPFilter("fault2", abort, false)), "HTTPFault.abort"},
		{"fault max_active_faults", withFilter(xdstest.HTTPFilter("fault2", &faultv3.HTTPFault{MaxActiveFaults: wrapperspb.UInt32(1)}, false)), "HTTPFault.max_active_faults"},
		{"fault per-route config", func(r *resources) {
			xbIstioRoute(r).TypedPerFilterConfig["envoy.filters.http.fault"] = xdstest.Any(abort)
		}, `typed_per_filter_config["envoy.filters.http.fault"]`},
		{"cors in a TypedStruct with fields", withFilter(ts("cors2", "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors", map[string]any{"x": 1})), "TypedStruct config that sets fields"},
		{"wasm in a TypedStruct", withFilter(ts("wasm", "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm", map[string]any{})), "wasm.v3.Wasm (in a TypedStruct) is not implemented"},
		{"wasm", withFilter(raw("wasm", "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm")), "wasm.v3.Wasm is not implemented"},
		{"peer metadata outside a TypedStruct", withFilter(raw("mx", peerMetadataType)), "read from a TypedStruct only"},
		{"peer metadata per-route config", func(r *resources) {
			xbIstioRoute(r).TypedPerFilterConfig[xdstest.IstioPeerFilter] = xdstest.Any(&routev3.FilterConfig{Disabled: true})
		}, `typed_per_filter_config["istio.metadata_exchange"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := build(igResources(t, tc.edit), env)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestPeerMetadataValue: x-envoy-peer-metadata carries the node's
// workload metadata as istio/proxy encodes it.
func TestPeerMetadataValue(t *testing.T) {
	decode := func(t *testing.T, v string) map[string]any {
		t.Helper()
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			t.Fatal(err)
		}
		s := &structpb.Struct{}
		if err := proto.Unmarshal(b, s); err != nil {
			t.Fatal(err)
		}
		return s.AsMap()
	}
	v, err := peerMetadataValue(xbNode.metadata, map[string]bool{"tier": true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"NAME": "gw-istio-0", "NAMESPACE": "default", "WORKLOAD_NAME": "gw-istio", "CLUSTER_ID": "Kubernetes",
		"OWNER":  "kubernetes://apis/apps/v1/namespaces/default/deployments/gw-istio",
		"LABELS": map[string]any{"service.istio.io/canonical-name": "gw-istio", "app": "gw", "version": "v1", "tier": "edge"},
	}
	if got := decode(t, v); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("value %v\n want %v", got, want)
	}
	again, _ := peerMetadataValue(xbNode.metadata, map[string]bool{"tier": true})
	if again != v {
		t.Error("the encoding is not deterministic")
	}
	other, _ := structpb.NewStruct(map[string]any{
		"NAMESPACE": "ns", "WORKLOAD_NAME": "w", "OWNER": "kubernetes://apis/apps/v1/namespaces/ns/statefulsets/w",
		"LABELS": map[string]any{"app": "short", "app.kubernetes.io/name": "qualified", "version": "1", "tier": "x"},
	})
	v, _ = peerMetadataValue(other, nil)
	want = map[string]any{"NAMESPACE": "ns", "WORKLOAD_NAME": "w", "LABELS": map[string]any{"app": "qualified", "version": "1"}}
	if got := decode(t, v); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("value %v\n want %v (app.kubernetes.io/name first, no OWNER for a kind Istio does not know, no label not asked for)", got, want)
	}
}

// TestPeerMetadataFilter: what the filter does to requests and responses.
func TestPeerMetadataFilter(t *testing.T) {
	node := nodeInfo{id: "node-1"}
	cfg := func(t *testing.T, v map[string]any) *peerMetadataFilter {
		t.Helper()
		s, err := structpb.NewStruct(v)
		if err != nil {
			t.Fatal(err)
		}
		f, err := peerMetadataConfig("mx", s, node)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	istioHeaders := func(skip bool) []any {
		return []any{map[string]any{"istio_headers": map[string]any{"skip_external_clusters": skip}}}
	}
	client := xbHeaders("gw", "/", peerMetadataIDHeader, "client", peerMetadataHeader, "client-value", "x", "1")
	upstream := extprocfilter.Headers{{Key: ":status", Value: "200"}, {Key: peerMetadataIDHeader, Value: "up"}, {Key: peerMetadataHeader, Value: "up-value"}}
	plain, external, noMX := &cluster{}, &cluster{istioExternal: true}, &cluster{istioDisableMX: true}

	gw := cfg(t, map[string]any{
		"upstream_discovery":   []any{map[string]any{"istio_headers": map[string]any{}}, map[string]any{"workload_discovery": map[string]any{}}},
		"upstream_propagation": istioHeaders(false),
	})
	h, pc := gw.onRequest(client, "c", plain)
	if h.Get(peerMetadataIDHeader) != "node-1" || h.Get(peerMetadataHeader) != gw.value || len(h.Values(peerMetadataHeader)) != 1 || h.Get("x") != "1" {
		t.Errorf("upstream propagation: %v", h)
	}
	if client.Get(peerMetadataIDHeader) != "client" {
		t.Error("onRequest changed its input")
	}
	if h, _ := gw.onRequest(client, "c", noMX); h.Get(peerMetadataIDHeader) != "client" {
		t.Errorf("disable_mx cluster: %v", h)
	}
	if h, _ := gw.onRequest(client, "c", external); h.Get(peerMetadataIDHeader) != "node-1" {
		t.Errorf("external cluster without skip_external_clusters: %v", h)
	}
	if h, _ := gw.onRequest(client, "c", nil); h.Get(peerMetadataIDHeader) != "node-1" {
		t.Errorf("no cluster: %v", h)
	}
	if r := gw.onResponse(upstream, pc, "c", plain); r.Has(peerMetadataIDHeader) || r.Has(peerMetadataHeader) || r.Get(":status") != "200" {
		t.Errorf("upstream discovery leaves %v", r)
	}

	skip := cfg(t, map[string]any{"upstream_propagation": istioHeaders(true)})
	for name, c := range map[string]*cluster{"external": external, "PassthroughCluster": plain} {
		if h, _ := skip.onRequest(client, name, c); h.Get(peerMetadataIDHeader) != "client" {
			t.Errorf("skip_external_clusters, %s: %v", name, h)
		}
	}
	if r := skip.onResponse(upstream, peerCtx{}, "c", plain); r.Get(peerMetadataIDHeader) != "up" {
		t.Errorf("without upstream discovery the upstream's headers pass: %v", r)
	}

	sidecar := cfg(t, map[string]any{
		"downstream_discovery":   istioHeaders(false),
		"downstream_propagation": istioHeaders(false),
	})
	idOnly := xbHeaders("gw", "/", peerMetadataIDHeader, "client")
	h, pc = sidecar.onRequest(idOnly, "c", plain)
	if h.Has(peerMetadataIDHeader) || !pc.idReceived || pc.valueReceived {
		t.Errorf("downstream discovery: %v, %+v", h, pc)
	}
	r := sidecar.onResponse(extprocfilter.Headers{{Key: ":status", Value: "200"}}, pc, "c", plain)
	if r.Get(peerMetadataIDHeader) != "node-1" || r.Has(peerMetadataHeader) {
		t.Errorf("downstream propagation answers what the client sent: %v", r)
	}

	for _, bad := range []struct {
		v    map[string]any
		want string
	}{
		{map[string]any{"downstream_discovery": []any{map[string]any{"baggage": map[string]any{}}}}, "discovery method baggage"},
		{map[string]any{"upstream_propagation": []any{map[string]any{"baggage": map[string]any{}}}}, "propagation method baggage"},
		{map[string]any{"flush": true}, "Config.flush"},
		{map[string]any{"upstream_propagation": []any{map[string]any{}}}, "one method per entry"},
	} {
		s, _ := structpb.NewStruct(bad.v)
		if _, err := peerMetadataConfig("mx", s, node); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want %q", bad.v, err, bad.want)
		}
	}
	s, _ := structpb.NewStruct(map[string]any{"upstream_propagation": istioHeaders(false)})
	if _, err := peerMetadataConfig("mx", s, nodeInfo{}); err == nil || !strings.Contains(err.Error(), "has none") {
		t.Errorf("propagation without a node id: %v", err)
	}
}

// igNode serves the Istio gateway shape for pool through a node.
func igNode(t *testing.T, pool xdstest.Pool, edit func(r *resources)) string {
	t.Helper()
	r := xbResources(t, xdstest.IstioGateway(pool, pool.Endpoints[0])...)
	if edit != nil {
		edit(r)
	}
	var msgs []proto.Message
	for _, l := range r.listeners {
		msgs = append(msgs, l)
	}
	for _, rc := range r.routes {
		msgs = append(msgs, rc)
	}
	for _, c := range r.clusters {
		msgs = append(msgs, c)
	}
	for _, cla := range r.endpoints {
		msgs = append(msgs, cla)
	}
	srv := xdstest.Start(t)
	srv.Set(t, "1", msgs...)
	return listenerURL(t, testNode(t, srv), xdstest.IstioListener)
}

// TestIstioGatewayTraffic: requests through Istio's configuration: the
// route's retries (connection failures, a retriable gRPC status, with the
// body sent again), override_host's list then round robin with
// previous_hosts, attempt counts, the metadata exchange's headers, and
// Istio mTLS hosts failing as without their SDS secret.
func TestIstioGatewayTraffic(t *testing.T) {
	const reqBody = `{"model":"m","prompt":"a prompt that must reach the host that answers, whole"}`
	unavailable := func(extra ...string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("grpc-status", "14")
			for i := 0; i+1 < len(extra); i += 2 {
				w.Header().Set(extra[i], extra[i+1])
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}
	var a, b *fakeproc.Upstream
	peerHeaders := func(u **fakeproc.Upstream) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set(peerMetadataHeader, "from-upstream")
			w.Header().Set(peerMetadataIDHeader, "upstream-id")
			_, _ = fmt.Fprintf(w, "hello from %s", (*u).Addr)
		}
	}
	a, b = fakeproc.StartUpstream(t, peerHeaders(&a)), fakeproc.StartUpstream(t, peerHeaders(&b))
	dead := fakeproc.ClosedAddr(t)
	picker := func(dest string) string {
		return fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{MetadataDest: dest})).Addr
	}
	routeOf := func(r *resources) *routev3.Route { return xbIstioRoute(r) }
	check := func(t *testing.T, base string, wantStatus int, wantFrom *fakeproc.Upstream, wantAttempts string) *http.Response {
		t.Helper()
		resp, body := post(t, base, reqBody)
		if resp.StatusCode != wantStatus {
			t.Fatalf("%d %q, want %d", resp.StatusCode, body, wantStatus)
		}
		if wantFrom == nil {
			return resp
		}
		if body != "hello from "+wantFrom.Addr || resp.Header.Get(UpstreamHeader) != wantFrom.Addr {
			t.Fatalf("%q via %s, want %s", body, resp.Header.Get(UpstreamHeader), wantFrom.Addr)
		}
		h, got := wantFrom.Last()
		if string(got) != reqBody {
			t.Errorf("the host got body %q", got)
		}
		if h.Get("x-envoy-attempt-count") != wantAttempts {
			t.Errorf("x-envoy-attempt-count %q, want %s", h.Get("x-envoy-attempt-count"), wantAttempts)
		}
		if h.Get(peerMetadataIDHeader) != xdstest.NodeID || h.Get(peerMetadataHeader) == "" {
			t.Errorf("the metadata exchange's headers upstream: %v", h)
		}
		if resp.Header.Get(peerMetadataHeader) != "" || resp.Header.Get(peerMetadataIDHeader) != "" {
			t.Errorf("the upstream's metadata exchange headers reached the client: %v", resp.Header)
		}
		// The picker saw the host that served in selected_host_key.
		if got := resp.Header.Get("x-test-served"); got != wantFrom.Addr {
			t.Errorf("x-test-served %q, want %s", got, wantFrom.Addr)
		}
		return resp
	}

	t.Run("the pick honoured", func(t *testing.T) {
		base := igNode(t, xdstest.Pool{Endpoints: []string{a.Addr, b.Addr}, EPP: picker(b.Addr), ListenerPort: 80}, nil)
		check(t, base, 200, b, "1")
	})
	t.Run("connection failure retried on another host", func(t *testing.T) {
		// The pick is dead; the list has nothing else, so round robin picks,
		// skipping the host already attempted.
		base := igNode(t, xdstest.Pool{Endpoints: []string{dead, a.Addr}, EPP: picker(dead), ListenerPort: 80}, nil)
		check(t, base, 200, a, "2")
	})
	t.Run("retriable gRPC status retried with the body", func(t *testing.T) {
		u := fakeproc.StartUpstream(t, unavailable())
		base := igNode(t, xdstest.Pool{Endpoints: []string{u.Addr, b.Addr}, EPP: picker(u.Addr), ListenerPort: 80}, nil)
		check(t, base, 200, b, "2")
		if _, got := u.Last(); string(got) != reqBody || u.Count() != 1 {
			t.Errorf("the first host got %d requests, the last with body %q", u.Count(), got)
		}
	})
	t.Run("retries exhausted: the last response", func(t *testing.T) {
		u := fakeproc.StartUpstream(t, unavailable())
		base := igNode(t, xdstest.Pool{Endpoints: []string{u.Addr}, EPP: picker(u.Addr), ListenerPort: 80}, nil)
		resp := check(t, base, http.StatusServiceUnavailable, nil, "")
		if resp.Header.Get("grpc-status") != "14" || u.Count() != 3 {
			t.Errorf("grpc-status %q after %d attempts; want the upstream's answer after 3", resp.Header.Get("grpc-status"), u.Count())
		}
	})
	t.Run("x-envoy-ratelimited is not retried", func(t *testing.T) {
		u := fakeproc.StartUpstream(t, unavailable("x-envoy-ratelimited", "true"))
		base := igNode(t, xdstest.Pool{Endpoints: []string{u.Addr, b.Addr}, EPP: picker(u.Addr), ListenerPort: 80}, nil)
		check(t, base, http.StatusServiceUnavailable, nil, "")
		if u.Count() != 1 {
			t.Errorf("%d attempts", u.Count())
		}
	})
	t.Run("a body past the buffer limit is not retried", func(t *testing.T) {
		u := fakeproc.StartUpstream(t, unavailable())
		base := igNode(t, xdstest.Pool{Endpoints: []string{u.Addr, b.Addr}, EPP: picker(u.Addr), ListenerPort: 80}, func(r *resources) {
			routeOf(r).PerRequestBufferLimitBytes = wrapperspb.UInt32(8)
		})
		check(t, base, http.StatusServiceUnavailable, nil, "")
		if u.Count() != 1 {
			t.Errorf("%d attempts", u.Count())
		}
	})
	mtls := func(r *resources) {
		r.clusters[xdstest.IstioPoolSvc].TransportSocketMatches = xdstest.IstioAutoMTLS(xdstest.IstioPoolSvc)
		xdstest.IstioMTLSEndpoint(r.endpoints[xdstest.IstioPoolSvc].Endpoints[0].LbEndpoints[0])
	}
	t.Run("Istio mTLS host: the connection fails, the retry goes elsewhere", func(t *testing.T) {
		u := fakeproc.StartUpstream(t, nil)
		base := igNode(t, xdstest.Pool{Endpoints: []string{u.Addr, b.Addr}, EPP: picker(u.Addr), ListenerPort: 80}, mtls)
		check(t, base, 200, b, "2")
		if u.Count() != 0 {
			t.Errorf("the mTLS host got %d plaintext requests", u.Count())
		}
	})
	t.Run("Istio mTLS host without retries: 503", func(t *testing.T) {
		u := fakeproc.StartUpstream(t, nil)
		base := igNode(t, xdstest.Pool{Endpoints: []string{u.Addr, b.Addr}, EPP: picker(u.Addr), ListenerPort: 80}, func(r *resources) {
			mtls(r)
			routeOf(r).GetRoute().RetryPolicy = nil
		})
		resp, body := post(t, base, reqBody)
		if resp.StatusCode != 503 || !strings.Contains(body, "reset reason: connection failure, transport failure reason: TLS error: Secret is not supplied by SDS") {
			t.Fatalf("%d %q", resp.StatusCode, body)
		}
	})
	t.Run("cluster_not_found_response_code", func(t *testing.T) {
		base := igNode(t, xdstest.Pool{Endpoints: []string{a.Addr}, EPP: picker(a.Addr), ListenerPort: 80}, func(r *resources) {
			routeOf(r).GetRoute().ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: "nope"}
		})
		if resp, body := post(t, base, reqBody); resp.StatusCode != http.StatusInternalServerError || body != "" {
			t.Fatalf("%d %q, want Istio's 500", resp.StatusCode, body)
		}
	})
}

// TestRetryPolicyRules: RetryPolicy as RetryPolicyImpl and RetryStateImpl
// read it.
func TestRetryPolicyRules(t *testing.T) {
	t.Run("parse", func(t *testing.T) {
		rp, err := buildRetryPolicy("rp", &routev3.RetryPolicy{RetryOn: " 5xx ,unknown,, internal"})
		if err != nil {
			t.Fatal(err)
		}
		if rp.on != retry5xx|retryGrpcInternal || rp.numRetries != 1 || rp.hostSelections != 1 || rp.previousHosts ||
			rp.base != 25*time.Millisecond || rp.max != 250*time.Millisecond {
			t.Errorf("defaults %+v", rp)
		}
		rp, err = buildRetryPolicy("rp", &routev3.RetryPolicy{RetryOn: "retriable-status-codes", NumRetries: wrapperspb.UInt32(0),
			RetriableStatusCodes: []uint32{418}, RetryBackOff: &routev3.RetryPolicy_RetryBackOff{BaseInterval: durationMS(100), MaxInterval: durationMS(300)}})
		if err != nil || rp.numRetries != 0 || rp.base != 100*time.Millisecond || rp.max != 300*time.Millisecond || !slices.Equal(rp.statusCodes, []uint32{418}) {
			t.Errorf("%+v, %v", rp, err)
		}
	})
	for _, tc := range []struct {
		name string
		rp   *routev3.RetryPolicy
		want string
	}{
		{"reset-before-request", &routev3.RetryPolicy{RetryOn: "reset-before-request"}, "reset-before-request"},
		{"per_try_timeout", &routev3.RetryPolicy{RetryOn: "5xx", PerTryTimeout: durationMS(10)}, "RetryPolicy.per_try_timeout"},
		{"retry_priority", &routev3.RetryPolicy{RetryOn: "5xx", RetryPriority: &routev3.RetryPolicy_RetryPriority{Name: "previous_priorities"}}, "RetryPolicy.retry_priority"},
		{"retriable_headers", &routev3.RetryPolicy{RetryOn: "retriable-headers", RetriableHeaders: []*routev3.HeaderMatcher{{Name: "x"}}}, "RetryPolicy.retriable_headers"},
		{"another host predicate", &routev3.RetryPolicy{RetryOn: "5xx", RetryHostPredicate: []*routev3.RetryPolicy_RetryHostPredicate{{
			Name: "omit_canary_hosts", ConfigType: &routev3.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: &anypb.Any{TypeUrl: "type.googleapis.com/envoy.extensions.retry.host.omit_canary_hosts.v3.OmitCanaryHostsPredicate"}},
		}}}, "only previous_hosts"},
		{"max_interval below base_interval", &routev3.RetryPolicy{RetryOn: "5xx", RetryBackOff: &routev3.RetryPolicy_RetryBackOff{BaseInterval: durationMS(100), MaxInterval: durationMS(10)}}, "max_interval below"},
	} {
		t.Run("NACK "+tc.name, func(t *testing.T) {
			if _, err := buildRetryPolicy("rp", tc.rp); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want %q", err, tc.want)
			}
		})
	}
	t.Run("resets", func(t *testing.T) {
		for _, tc := range []struct {
			on                   retryOn
			connect, other, none bool // retried after a connect failure, after another reset
		}{
			{on: retryConnectFailure, connect: true},
			{on: retryReset, connect: true, other: true},
			{on: retry5xx, connect: true, other: true},
			{on: retryGatewayError, connect: true, other: true},
			{on: retryRefusedStream | retryGrpcUnavailable | retryRetriableStatusCodes},
		} {
			rp := &retryPolicy{on: tc.on}
			if rp.retriesReset(true) != tc.connect || rp.retriesReset(false) != tc.other {
				t.Errorf("%b: connect failure %v, reset %v", tc.on, rp.retriesReset(true), rp.retriesReset(false))
			}
		}
	})
	t.Run("responses", func(t *testing.T) {
		h := func(kv ...string) http.Header {
			out := http.Header{}
			for i := 0; i+1 < len(kv); i += 2 {
				out.Set(kv[i], kv[i+1])
			}
			return out
		}
		for _, tc := range []struct {
			on     retryOn
			codes  []uint32
			h      http.Header
			status int
			want   bool
		}{
			{retry5xx, nil, h(), 500, true},
			{retry5xx, nil, h(), 499, false},
			{retryGatewayError, nil, h(), 500, false},
			{retryGatewayError, nil, h(), 504, true},
			{retryRetriable4xx, nil, h(), 409, true},
			{retryRetriable4xx, nil, h(), 404, false},
			{retryRetriableStatusCodes, []uint32{418}, h(), 418, true},
			{retryRetriableStatusCodes, nil, h(), 418, false},
			{retryGrpcUnavailable, nil, h("grpc-status", "14"), 200, true},
			{retryGrpcUnavailable, nil, h("grpc-status", "1"), 200, false},
			{retryGrpcCancelled, nil, h("grpc-status", "1"), 200, true},
			{retryGrpcDeadlineExceeded, nil, h("grpc-status", "4"), 200, true},
			{retryGrpcResourceExhausted, nil, h("grpc-status", "8"), 200, true},
			{retryGrpcInternal, nil, h("grpc-status", "13"), 200, true},
			{retryGrpcUnavailable, nil, h("grpc-status", "x"), 503, false},
			{retry5xx, nil, h("x-envoy-ratelimited", "true"), 503, false},
			{retryEnvoyRateLimited, nil, h("x-envoy-ratelimited", "true"), 200, true},
			{retryConnectFailure | retryRefusedStream, nil, h(), 503, false},
		} {
			rp := &retryPolicy{on: tc.on, statusCodes: tc.codes}
			if got := rp.retriesResponse(tc.h, tc.status); got != tc.want {
				t.Errorf("%b %v %d: %v, want %v", tc.on, tc.h, tc.status, got, tc.want)
			}
		}
	})
	t.Run("backoff", func(t *testing.T) {
		rp := &retryPolicy{base: 10 * time.Millisecond, max: 100 * time.Millisecond}
		for range 200 {
			if d := rp.backoff(1); d < 0 || d >= 10*time.Millisecond {
				t.Fatalf("first back-off %v", d)
			}
			if d := rp.backoff(2); d < 0 || d >= 30*time.Millisecond {
				t.Fatalf("second back-off %v", d)
			}
			if d := rp.backoff(40); d < 0 || d > 100*time.Millisecond {
				t.Fatalf("back-off past the max %v", d)
			}
		}
	})
}

// TestHostPicker: override_host consumes its list one host per attempt,
// then falls back to round robin; previous_hosts makes round robin choose
// again, up to host_selection_retry_max_attempts times.
func TestHostPicker(t *testing.T) {
	const a, b, c, outside = "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.9.9.9:80"
	members := map[string]bool{a: true, b: true, c: true}
	override := &overrideHost{sources: []hostSource{{header: "x-a"}, {header: "x-b"}}}
	rp := &retryPolicy{previousHosts: true, hostSelections: 5}
	for _, tc := range []struct {
		name string
		rp   *retryPolicy
		h    extprocfilter.Headers
		want []string
	}{
		// Both sources' lists, in order, hosts outside the cluster skipped.
		{"lists of every source", rp, xbHeaders("gw", "/", "x-a", c+","+outside, "x-b", b), []string{c, b, a}},
		// Round robin after the list: a (index 0) was attempted, so b.
		{"round robin skips attempted hosts", rp, xbHeaders("gw", "/", "x-a", a), []string{a, b, c}},
		// Without the predicate round robin may choose an attempted host.
		{"without previous_hosts", &retryPolicy{hostSelections: 5}, xbHeaders("gw", "/", "x-a", a), []string{a, a, b}},
		{"no source", rp, xbHeaders("gw", "/"), []string{a, b, c}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := &cluster{endpoints: []string{a, b, c}, members: members, override: override}
			hp := newHostPicker(cl, tc.h, nil, nil)
			var got []string
			for i := range tc.want {
				h, err := hp.pick(tc.rp, i > 0)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, h)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("picked %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("all attempted: the last choice", func(t *testing.T) {
		cl := &cluster{endpoints: []string{a, b}, members: members}
		hp := newHostPicker(cl, xbHeaders("gw", "/"), nil, nil)
		var got []string
		for i := range 3 {
			h, _ := hp.pick(&retryPolicy{previousHosts: true, hostSelections: 1}, i > 0)
			got = append(got, h)
		}
		if !slices.Equal(got, []string{a, b, b}) {
			t.Fatalf("picked %q", got)
		}
	})
}

// TestReplayBody: each attempt reads what was sent, then the rest; past
// the limit the body cannot be replayed.
func TestReplayBody(t *testing.T) {
	read := func(t *testing.T, a *attemptReader, n int) string {
		t.Helper()
		buf := make([]byte, n)
		got := 0
		for got < n {
			k, err := a.Read(buf[got:])
			got += k
			if err != nil {
				break
			}
		}
		return string(buf[:got])
	}
	ctx := fakeproc.Ctx(t)
	rb := newReplayBody(extprocfilter.NewBodyReader(ctx, extprocfilter.BodyFromChunks([]byte("hello "), []byte("world"))), 64)
	first := rb.attempt()
	if got := read(t, first, 4); got != "hell" {
		t.Fatalf("first attempt %q", got)
	}
	second := rb.attempt()
	if _, err := first.Read(make([]byte, 4)); err != errAttemptAbandoned {
		t.Errorf("an abandoned attempt read on: %v", err)
	}
	if got := read(t, second, 32); got != "hello world" || !rb.replayable() {
		t.Fatalf("second attempt %q", got)
	}
	if got := read(t, rb.attempt(), 32); got != "hello world" {
		t.Fatalf("third attempt %q", got)
	}

	small := newReplayBody(extprocfilter.NewBodyReader(ctx, extprocfilter.BodyFromChunks([]byte("0123456789"))), 4)
	if got := read(t, small.attempt(), 32); got != "0123456789" || small.replayable() {
		t.Fatalf("past the limit: %q, replayable %v", got, small.replayable())
	}
}

// TestGrpcTimeout reads grpc-timeout as Grpc::Common::getGrpcTimeout does.
func TestGrpcTimeout(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"1H": time.Hour, "2M": 2 * time.Minute, "3S": 3 * time.Second, "50m": 50 * time.Millisecond,
		"1500u": 2 * time.Millisecond, "1n": time.Millisecond, "99999999S": 99999999 * time.Second,
	} {
		if got, ok := grpcTimeout(extprocfilter.Headers{{Key: "grpc-timeout", Value: v}}); !ok || got != want {
			t.Errorf("%s: %v %v, want %v", v, got, ok, want)
		}
	}
	for _, v := range []string{"", "5", "S", "123456789S", "5s", "-1S"} {
		if got, ok := grpcTimeout(extprocfilter.Headers{{Key: "grpc-timeout", Value: v}}); ok {
			t.Errorf("%q: %v, want none", v, got)
		}
	}
	for ct, want := range map[string]bool{"application/grpc": true, "application/grpc+proto": true, "application/grpc;x=1": true, "application/grpc-web": false, "application/json": false} {
		if got := isGrpcRequest(extprocfilter.Headers{{Key: "content-type", Value: ct}}); got != want {
			t.Errorf("%s: %v", ct, got)
		}
	}
}

// TestMaxGrpcTimeout: with max_grpc_timeout a gRPC request's timeout is
// its grpc-timeout header (none: no timeout) capped at the maximum unless
// it is 0; other requests keep the route's timeout.
func TestMaxGrpcTimeout(t *testing.T) {
	slow := fakeproc.StartUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(300 * time.Millisecond)
		_, _ = w.Write([]byte("late"))
	})
	routes := func(maxGrpc time.Duration) *routev3.RouteConfiguration {
		rc := xdstest.CatchAllRoutes("r", "up")
		a := rc.VirtualHosts[0].Routes[0].GetRoute()
		a.Timeout = durationMS(0)
		a.MaxGrpcTimeout = durationMS(maxGrpc.Milliseconds())
		return rc
	}
	grpc := []string{"content-type", "application/grpc"}
	for _, tc := range []struct {
		name    string
		maxGrpc time.Duration
		kv      []string
		want    int
	}{
		{"gRPC, grpc-timeout below the upstream's time", 0, append(grpc, "grpc-timeout", "50m"), 504},
		{"gRPC, no grpc-timeout, max 0: none", 0, grpc, 200},
		{"gRPC, no grpc-timeout, capped", 50 * time.Millisecond, grpc, 504},
		{"gRPC, grpc-timeout above the max: the max", 50 * time.Millisecond, append(grpc, "grpc-timeout", "10S"), 504},
		{"not gRPC: the route's timeout (0: none)", 50 * time.Millisecond, []string{"grpc-timeout", "50m"}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := xdstest.Start(t)
			srv.Set(t, "1", xdstest.Listener("l", 80, "r"), routes(tc.maxGrpc), xdstest.StaticCluster("up", slow.Addr))
			resp, body := get(t, listenerURL(t, testNode(t, srv), "l")+"/", tc.kv...)
			if resp.StatusCode != tc.want {
				t.Fatalf("%d %q, want %d", resp.StatusCode, body, tc.want)
			}
		})
	}
}

// TestProxy100Continue: without proxy_100_continue Envoy answers Expect:
// 100-continue itself and the upstream never sees the header; with it the
// header goes upstream.
func TestProxy100Continue(t *testing.T) {
	up := fakeproc.StartUpstream(t, nil)
	for _, proxy := range []bool{false, true} {
		t.Run(fmt.Sprint("proxy_100_continue ", proxy), func(t *testing.T) {
			l := xdstest.Listener("l", 80, "r")
			xbEditHCM(t, l, func(h *hcmv3.HttpConnectionManager) { h.Proxy_100Continue = proxy })
			srv := xdstest.Start(t)
			srv.Set(t, "1", l, xdstest.CatchAllRoutes("r", "up"), xdstest.StaticCluster("up", up.Addr))
			base := listenerURL(t, testNode(t, srv), "l")
			req, _ := http.NewRequestWithContext(fakeproc.Ctx(t), http.MethodPost, base+"/", strings.NewReader("body"))
			req.Header.Set("Expect", "100-continue")
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{ExpectContinueTimeout: 5 * time.Second}}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			h, body := up.Last()
			if resp.StatusCode != 200 || string(body) != "body" {
				t.Fatalf("%d, upstream got %q", resp.StatusCode, body)
			}
			if got := h.Get("Expect") != ""; got != proxy {
				t.Fatalf("upstream saw Expect: %v (%q)", got, h.Get("Expect"))
			}
		})
	}
}

// TestForwardClientCertDetails: on a connection without a client
// certificate Envoy removes a client's x-forwarded-client-cert unless
// forward_client_cert_details is ALWAYS_FORWARD_ONLY.
func TestForwardClientCertDetails(t *testing.T) {
	up := fakeproc.StartUpstream(t, nil)
	for mode, keep := range map[hcmv3.HttpConnectionManager_ForwardClientCertDetails]bool{
		hcmv3.HttpConnectionManager_SANITIZE:            false,
		hcmv3.HttpConnectionManager_SANITIZE_SET:        false, // Istio's
		hcmv3.HttpConnectionManager_FORWARD_ONLY:        false,
		hcmv3.HttpConnectionManager_APPEND_FORWARD:      false,
		hcmv3.HttpConnectionManager_ALWAYS_FORWARD_ONLY: true,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			l := xdstest.Listener("l", 80, "r")
			xbEditHCM(t, l, func(h *hcmv3.HttpConnectionManager) { h.ForwardClientCertDetails = mode })
			srv := xdstest.Start(t)
			srv.Set(t, "1", l, xdstest.CatchAllRoutes("r", "up"), xdstest.StaticCluster("up", up.Addr))
			get(t, listenerURL(t, testNode(t, srv), "l")+"/", "x-forwarded-client-cert", "By=spiffe://forged")
			if h, _ := up.Last(); (h.Get("x-forwarded-client-cert") != "") != keep {
				t.Fatalf("upstream got x-forwarded-client-cert %q", h.Get("x-forwarded-client-cert"))
			}
		})
	}
}

// TestBootstrapNodeIsTheLocalNode: from a static bootstrap, Istio's
// metadata exchange sends the bootstrap node's id and metadata.
func TestBootstrapNodeIsTheLocalNode(t *testing.T) {
	up := fakeproc.StartUpstream(t, nil)
	mx := &hcmv3.HttpFilter{Name: xdstest.IstioPeerFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: xdstest.TypedStruct(peerMetadataType, map[string]any{
		"upstream_propagation": []any{map[string]any{"istio_headers": map[string]any{}}},
	})}}
	bs := bootstrapOf([]*listenerv3.Listener{inlineListener("l", freePort(t), xdstest.CatchAllRoutes("r", "up"), mx)}, xdstest.StaticCluster("up", up.Addr))
	bs.Node.Metadata = xbNode.metadata
	_, base, _ := serveBootstrap(t, bootstrapConfig(bs), "l")
	get(t, base+"/")
	want, err := peerMetadataValue(xbNode.metadata, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := up.Last(); h.Get(peerMetadataIDHeader) != "standin" || h.Get(peerMetadataHeader) != want {
		t.Fatalf("upstream got id %q, value %q", h.Get(peerMetadataIDHeader), h.Get(peerMetadataHeader))
	}
}

// TestPartialRDSAndEDSResponses: a RouteConfiguration or ClusterLoadAssignment
// response may carry only what changed; the rest stays until no listener
// or cluster names it.
func TestPartialRDSAndEDSResponses(t *testing.T) {
	a, b := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	n, apply := offlineNode(t)
	rc := &routev3.RouteConfiguration{Name: "r", VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{
		{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/a"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "a"}}}},
		{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/b"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "b"}}}},
	}}}}
	apply(xdsclient.ClusterType, xdstest.EDSCluster("a"), xdstest.EDSCluster("b"))
	apply(xdsclient.ListenerType, xdstest.Listener("l", 80, "r"), xdstest.Listener("l2", 81, "r2"))
	apply(xdsclient.RouteType, rc)
	apply(xdsclient.RouteType, xdstest.CatchAllRoutes("r2", "b"))
	apply(xdsclient.EndpointType, xdstest.Assignment("a", a.Addr))
	apply(xdsclient.EndpointType, xdstest.Assignment("b", b.Addr))
	base := listenerURL(t, n, "l")
	for path, u := range map[string]*fakeproc.Upstream{"/a": a, "/b": b} {
		if resp, body := get(t, base+path); resp.StatusCode != 200 || body != "hello from "+u.Addr {
			t.Fatalf("%s: %d %q", path, resp.StatusCode, body)
		}
	}
	if resp, body := get(t, listenerURL(t, n, "l2")+"/"); resp.StatusCode != 200 || body != "hello from "+b.Addr {
		t.Fatalf("l2: %d %q", resp.StatusCode, body)
	}
	// A cluster that leaves CDS takes its load assignment along: back, it
	// warms again.
	apply(xdsclient.ClusterType, xdstest.EDSCluster("a"))
	n.mu.Lock()
	_, kept := n.res.endpoints["b"]
	n.mu.Unlock()
	if kept {
		t.Fatal("the load assignment of a cluster no longer in CDS was kept")
	}
}

func durationMS(ms int64) *durationpb.Duration {
	return durationpb.New(time.Duration(ms) * time.Millisecond)
}

// setEmpty sets a message field of m to an empty message, for fields
// whose Go types this package does not import.
func setEmpty(m proto.Message, field string) {
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(protoreflect.Name(field))
	r.Set(fd, protoreflect.ValueOfMessage(r.NewField(fd).Message()))
}
