package xdstest

import (
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	grpcstatsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/grpc_stats/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	uuidv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/request_id/uuid/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	rawbufferv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	tracingv3 "github.com/envoyproxy/go-control-plane/envoy/type/tracing/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Names in the Istio gateway shape, besides the Istio shape's.
const (
	// IstioMeshCluster is a mesh Service's cluster: auto mTLS by
	// transport_socket_matches.
	IstioMeshCluster = "outbound|443||kubernetes.default.svc.cluster.local"
	// IstioPeerFilter is Istio's HTTP metadata exchange.
	IstioPeerFilter = "istio.metadata_exchange"
	// IstioRetryRouteName is the pool route of the Istio gateway shape.
	IstioRetryRouteName = "default.llm-route.0"
)

// IstioGateway is what istiod (pilot-discovery, as test/istio runs it)
// sends the Envoy of a Gateway API gateway whose HTTPRoute goes to an
// InferencePool, field for field, with loopback addresses: the Istio shape
// plus everything Istio adds around it. The listener's chain holds Istio's
// HTTP metadata exchange before the InferencePool ext_proc filter, then
// grpc_stats, istio.alpn, an empty fault filter, an empty CORS filter and
// the router; the connection manager tracing, use_remote_address,
// forward_client_cert_details, proxy_100_continue and the rest. The
// pool's route retries (connect-failure, refused-stream, unavailable,
// cancelled, retriable-status-codes, twice, previous_hosts) and counts
// attempts. Every cluster carries Istio's TCP metadata exchange filter
// and metadata; the mesh cluster (IstioMeshCluster, at mesh) chooses
// Istio mTLS or plaintext per endpoint by transport_socket_matches; the
// picker's cluster has the DestinationRule's TLS with tls_params. Load
// assignments carry Istio's workload metadata.
func IstioGateway(p Pool, mesh string) []proto.Message {
	msgs := Istio(p)
	var (
		listener *listenerv3.Listener
		routes   *routev3.RouteConfiguration
		clusters []*clusterv3.Cluster
		clas     []*endpointv3.ClusterLoadAssignment
	)
	for _, m := range msgs {
		switch v := m.(type) {
		case *listenerv3.Listener:
			listener = v
		case *routev3.RouteConfiguration:
			routes = v
		case *clusterv3.Cluster:
			clusters = append(clusters, v)
		case *endpointv3.ClusterLoadAssignment:
			clas = append(clas, v)
		}
	}

	// The listener and its connection manager.
	fc := listener.FilterChains[0]
	fc.TransportSocketConnectTimeout = durationpb.New(15 * time.Second)
	listener.TrafficDirection = corev3.TrafficDirection_OUTBOUND
	listener.MaxConnectionsToAcceptPerSocketEvent = wrapperspb.UInt32(1)
	hcm := &hcmv3.HttpConnectionManager{}
	if err := fc.Filters[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		panic("xdstest: " + err.Error())
	}
	hcm.StatPrefix = "outbound_0.0.0.0_80;"
	hcm.GetRds().GetConfigSource().InitialFetchTimeout = durationpb.New(0)
	filters := hcm.HttpFilters
	router := filters[len(filters)-1]
	hcm.HttpFilters = []*hcmv3.HttpFilter{{
		Name: IstioPeerFilter,
		ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: TypedStruct("type.googleapis.com/io.istio.http.peer_metadata.Config", map[string]any{
			"upstream_discovery":   []any{map[string]any{"istio_headers": map[string]any{}}, map[string]any{"workload_discovery": map[string]any{}}},
			"upstream_propagation": []any{map[string]any{"istio_headers": map[string]any{}}},
		})},
	}}
	hcm.HttpFilters = append(hcm.HttpFilters, filters[:len(filters)-1]...)
	hcm.HttpFilters = append(hcm.HttpFilters,
		HTTPFilter("envoy.filters.http.grpc_stats", &grpcstatsv3.FilterConfig{
			EmitFilterState:        true,
			PerMethodStatSpecifier: &grpcstatsv3.FilterConfig_StatsForAllMethods{StatsForAllMethods: wrapperspb.Bool(false)},
		}, false),
		&hcmv3.HttpFilter{Name: "istio.alpn", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: istioALPN()}},
		HTTPFilter("envoy.filters.http.fault", &faultv3.HTTPFault{}, false),
		HTTPFilter("envoy.filters.http.cors", &corsv3.Cors{}, false),
		router,
	)
	hcm.Tracing = &hcmv3.HttpConnectionManager_Tracing{
		ClientSampling:  &typev3.Percent{Value: 100},
		RandomSampling:  &typev3.Percent{Value: 1},
		OverallSampling: &typev3.Percent{Value: 100},
		CustomTags: []*tracingv3.CustomTag{{
			Tag:  "istio.namespace",
			Type: &tracingv3.CustomTag_Literal_{Literal: &tracingv3.CustomTag_Literal{Value: "default"}},
		}},
	}
	hcm.HttpProtocolOptions = &corev3.Http1ProtocolOptions{}
	hcm.ServerName = "istio-envoy"
	hcm.StreamIdleTimeout = durationpb.New(0)
	hcm.UseRemoteAddress = wrapperspb.Bool(true)
	hcm.ForwardClientCertDetails = hcmv3.HttpConnectionManager_SANITIZE_SET
	hcm.SetCurrentClientCertDetails = &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{
		Subject: wrapperspb.Bool(true), Cert: true, Dns: true, Uri: true,
	}
	hcm.Proxy_100Continue = true
	hcm.UpgradeConfigs = []*hcmv3.HttpConnectionManager_UpgradeConfig{{UpgradeType: "websocket"}}
	hcm.NormalizePath = wrapperspb.Bool(true)
	hcm.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_KEEP_UNCHANGED
	hcm.RequestIdExtension = &hcmv3.RequestIDExtension{TypedConfig: Any(&uuidv3.UuidRequestIdConfig{})}
	fc.Filters[0].ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: Any(hcm)}

	// The routes: Istio's default retry policy, attempt counts.
	routes.MaxDirectResponseBodySizeBytes = wrapperspb.UInt32(1 << 20)
	routes.IgnorePortInHostMatching = true
	vh := routes.VirtualHosts[0]
	vh.IncludeRequestAttemptCount = true
	for _, r := range vh.Routes {
		a := r.GetRoute()
		if a == nil {
			continue
		}
		r.Match.CaseSensitive = wrapperspb.Bool(true)
		r.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": mustStruct(map[string]any{
			"config": "/apis/networking.istio.io/v1/namespaces/default/virtual-service/default~gw~istio-autogenerated-k8s-gateway~http~*",
		})}}
		r.Decorator = &routev3.Decorator{Operation: "pool.default.svc.cluster.local:54321/*"}
		a.ClusterNotFoundResponseCode = routev3.RouteAction_INTERNAL_SERVER_ERROR
		a.MaxGrpcTimeout = durationpb.New(0)
		a.RetryPolicy = IstioRetryPolicy()
	}

	// The clusters.
	mx := &clusterv3.Filter{Name: "istio.metadata_exchange",
		TypedConfig: TypedStruct("type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange", map[string]any{
			"enable_discovery": true, "protocol": "istio-peer-exchange",
		}),
	}
	for _, c := range clusters {
		c.AltStatName = c.Name + ";"
		c.GetEdsClusterConfig().GetEdsConfig().InitialFetchTimeout = durationpb.New(0)
		c.CircuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
			MaxConnections: wrapperspb.UInt32(1<<32 - 1), MaxPendingRequests: wrapperspb.UInt32(1<<32 - 1),
			MaxRequests: wrapperspb.UInt32(1<<32 - 1), MaxRetries: wrapperspb.UInt32(1<<32 - 1),
		}}}
		c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{}}
		c.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": mustStruct(map[string]any{
			"services": []any{map[string]any{"host": c.Name, "name": c.Name, "namespace": "default"}},
		})}}
		c.Filters = []*clusterv3.Filter{mx}
		if c.Name == IstioEPPCluster {
			c.LbPolicy = clusterv3.Cluster_LEAST_REQUEST
			c.TypedExtensionProtocolOptions = map[string]*anypb.Any{
				"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": Any(&upstreamhttpv3.HttpProtocolOptions{
					UpstreamHttpProtocolOptions: &corev3.UpstreamHttpProtocolOptions{AutoSni: true},
					UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
						ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
					}},
				}),
			}
			if p.EPPTLS {
				c.TransportSocket = &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{
					TypedConfig: Any(&tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
						TlsParams: &tlsv3.TlsParameters{
							TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2,
							TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3,
						},
						ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{}},
						AlpnProtocols:         []string{"h2"},
					}}),
				}}
			}
		}
	}
	meshCluster := EDSCluster(IstioMeshCluster)
	meshCluster.LbPolicy = clusterv3.Cluster_LEAST_REQUEST
	meshCluster.GetEdsClusterConfig().GetEdsConfig().InitialFetchTimeout = durationpb.New(0)
	meshCluster.Filters = []*clusterv3.Filter{mx}
	meshCluster.TransportSocketMatches = IstioAutoMTLS(IstioMeshCluster)
	clusters = append(clusters, meshCluster, &clusterv3.Cluster{
		Name:                 "BlackHoleCluster",
		AltStatName:          "BlackHoleCluster;",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(10 * time.Second),
	})

	// The load assignments: Istio's workload metadata and weights.
	clas = append(clas, Assignment(IstioMeshCluster, mesh))
	for _, cla := range clas {
		for _, lle := range cla.Endpoints {
			lle.Locality = &corev3.Locality{}
			lle.LoadBalancingWeight = wrapperspb.UInt32(uint32(len(lle.LbEndpoints)))
			for _, le := range lle.LbEndpoints {
				le.HealthStatus = corev3.HealthStatus_HEALTHY
				le.LoadBalancingWeight = wrapperspb.UInt32(1)
				le.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": mustStruct(map[string]any{
					"workload": "pod;default;pool;;Kubernetes",
				})}}
			}
		}
	}

	out := []proto.Message{listener, routes}
	for _, c := range clusters {
		out = append(out, c)
	}
	for _, cla := range clas {
		out = append(out, cla)
	}
	return out
}

// IstioRetryPolicy is the retry policy Istio gives every HTTP route.
func IstioRetryPolicy() *routev3.RetryPolicy {
	return &routev3.RetryPolicy{
		RetryOn:    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
		NumRetries: wrapperspb.UInt32(2),
		RetryHostPredicate: []*routev3.RetryPolicy_RetryHostPredicate{{
			Name:       "envoy.retry_host_predicates.previous_hosts",
			ConfigType: &routev3.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: Any(&previoushostsv3.PreviousHostsPredicate{})},
		}},
		HostSelectionRetryMaxAttempts: 5,
	}
}

// IstioAutoMTLS is Istio's auto mTLS: endpoints whose
// envoy.transport_socket_match metadata says tlsMode: istio get Istio's
// mTLS, certificates and trust from SDS (the istio-agent); every other
// endpoint plaintext.
func IstioAutoMTLS(cluster string) []*clusterv3.Cluster_TransportSocketMatch {
	sds := func(name string) *tlsv3.SdsSecretConfig {
		return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &corev3.ConfigSource{
			ResourceApiVersion:  corev3.ApiVersion_V3,
			InitialFetchTimeout: durationpb.New(0),
			ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
				ApiType: corev3.ApiConfigSource_GRPC, TransportApiVersion: corev3.ApiVersion_V3, SetNodeOnFirstMessageOnly: true,
				GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "sds-grpc"}}}},
			}},
		}}
	}
	return []*clusterv3.Cluster_TransportSocketMatch{
		{
			Name:  "tlsMode-istio",
			Match: mustStruct(map[string]any{"tlsMode": "istio"}),
			TransportSocket: &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{
				TypedConfig: Any(&tlsv3.UpstreamTlsContext{
					CommonTlsContext: &tlsv3.CommonTlsContext{
						TlsParams: &tlsv3.TlsParameters{
							TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2,
							TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3,
						},
						TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sds("default")},
						ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
							DefaultValidationContext:         &tlsv3.CertificateValidationContext{},
							ValidationContextSdsSecretConfig: sds("ROOTCA"),
						}},
						AlpnProtocols: []string{"istio-peer-exchange", "istio"},
					},
					Sni: "outbound_.443_._." + cluster,
				}),
			}},
		},
		{
			Name:  "tlsMode-disabled",
			Match: &structpb.Struct{},
			TransportSocket: &corev3.TransportSocket{Name: "envoy.transport_sockets.raw_buffer", ConfigType: &corev3.TransportSocket_TypedConfig{
				TypedConfig: Any(&rawbufferv3.RawBuffer{}),
			}},
		},
	}
}

// IstioMTLSEndpoint marks a load assignment's endpoints as Istio's
// (a sidecar's pod): tlsMode istio in envoy.transport_socket_match.
func IstioMTLSEndpoint(le *endpointv3.LbEndpoint) {
	if le.Metadata == nil {
		le.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	}
	le.Metadata.FilterMetadata["envoy.transport_socket_match"] = mustStruct(map[string]any{"tlsMode": "istio"})
}

// TypedStruct is a udpa.type.v1.TypedStruct of typeURL with value,
// encoded by hand (the type's Go package is not a dependency here).
func TypedStruct(typeURL string, value map[string]any) *anypb.Any {
	v, err := proto.Marshal(mustStruct(value))
	if err != nil {
		panic("xdstest: " + err.Error())
	}
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, typeURL)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, v)
	return &anypb.Any{TypeUrl: "type.googleapis.com/udpa.type.v1.TypedStruct", Value: b}
}

// istioALPN is istio.alpn's config as Istio sends it: per upstream HTTP
// version (HTTP10, HTTP11, HTTP2) the ALPN list for Istio mTLS.
func istioALPN() *anypb.Any {
	var b []byte
	for i, alpn := range [][]string{{"istio-http/1.0", "istio", "http/1.0"}, {"istio-http/1.1", "istio", "http/1.1"}, {"istio-h2", "istio", "h2"}} {
		var o []byte
		if i > 0 {
			o = protowire.AppendTag(o, 1, protowire.VarintType)
			o = protowire.AppendVarint(o, uint64(i))
		}
		for _, a := range alpn {
			o = protowire.AppendTag(o, 2, protowire.BytesType)
			o = protowire.AppendString(o, a)
		}
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, o)
	}
	return &anypb.Any{TypeUrl: "type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig", Value: b}
}

func mustStruct(m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic("xdstest: " + err.Error())
	}
	return s
}
