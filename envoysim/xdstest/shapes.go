package xdstest

import (
	"net"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/inference/wire"
)

// Pool describes one InferencePool as the gateways see it.
type Pool struct {
	// Endpoints are the model servers (ip:port).
	Endpoints []string
	// EPP is the endpoint picker's ip:port; EPPTLS dials it with TLS that
	// accepts any certificate.
	EPP    string
	EPPTLS bool
	// FailOpen is failureMode: FailOpen.
	FailOpen bool
	// ListenerPort is the port the control plane gives the listener.
	ListenerPort uint32
}

// Names in the Istio shape.
const (
	IstioListener   = "0.0.0.0_80"
	IstioRoutes     = "http.80"
	IstioFilter     = "envoy.filters.http.ext_proc"
	IstioPoolSvc    = "outbound|54321||pool-ip-0a1b2c3d.default.svc.cluster.local"
	IstioEPPCluster = "outbound|9002||pool-epp.default.svc.cluster.local"
	// IstioDirectPath is a route without the picker: a direct response.
	IstioDirectPath = "/healthz/ready"
)

// Istio is the shape Istio's native InferencePool support sends a gateway:
// one listener-level ext_proc filter named envoy.filters.http.ext_proc that
// does nothing (headers SKIP, a placeholder cluster, failing open), retargeted
// per route by ExtProcPerRoute overrides (the picker's cluster, all headers
// SEND, FULL_DUPLEX_STREAMED bodies, failure_mode_allow from the pool); the
// pool's Service as an EDS cluster whose override_host policy reads the
// pick from envoy.lb metadata, reports the served host in
// selected_host_key, and falls back to round robin.
func Istio(p Pool) []proto.Message {
	filter := &extprocv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "dummy"}},
			Timeout:         durationpb.New(10 * time.Second),
		},
		FailureModeAllow: true,
		ProcessingMode: &extprocv3.ProcessingMode{
			RequestHeaderMode:  extprocv3.ProcessingMode_SKIP,
			ResponseHeaderMode: extprocv3.ProcessingMode_SKIP,
		},
		MessageTimeout:  durationpb.New(1000 * time.Second),
		MetadataOptions: LBNamespaces(),
	}
	perRoute := &extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Overrides{Overrides: &extprocv3.ExtProcOverrides{
		ProcessingMode: DuplexMode(),
		GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: IstioEPPCluster}},
			Timeout:         durationpb.New(10 * time.Second),
		},
		FailureModeAllow: wrapperspb.Bool(p.FailOpen),
	}}}
	routes := &routev3.RouteConfiguration{
		Name:             IstioRoutes,
		ValidateClusters: wrapperspb.Bool(false),
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    "*:80",
			Domains: []string{"*"},
			Routes: []*routev3.Route{
				{
					Name:   "direct",
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: IstioDirectPath}},
					Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 200}},
				},
				{
					Name:  "default.llm-route.0",
					Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{
						ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: IstioPoolSvc},
						Timeout:          durationpb.New(0),
					}},
					TypedPerFilterConfig: map[string]*anypb.Any{IstioFilter: Any(perRoute)},
				},
			},
		}},
	}
	lbPolicy := &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
		TypedExtensionConfig: &corev3.TypedExtensionConfig{
			Name: "envoy.load_balancing_policies.override_host",
			TypedConfig: Any(&overridehostv3.OverrideHost{
				OverrideHostSources: []*overridehostv3.OverrideHost_OverrideHostSource{{Metadata: LBKey(wire.DestinationEndpointKey)}},
				SelectedHostKey:     LBKey(wire.ServedEndpointKey),
				FallbackPolicy: &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
					TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "envoy.load_balancing_policies.round_robin", TypedConfig: Any(&roundrobinv3.RoundRobin{})},
				}}},
			}),
		},
	}}}
	pool := EDSCluster(IstioPoolSvc)
	pool.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
	pool.LoadBalancingPolicy = lbPolicy
	epp := EDSCluster(IstioEPPCluster)
	if p.EPPTLS {
		// DestinationRule tls.mode SIMPLE with insecureSkipVerify.
		epp.TransportSocket = AcceptAnyTLS()
	}
	return []proto.Message{
		Listener(IstioListener, p.ListenerPort, IstioRoutes, HTTPFilter(IstioFilter, filter, false)),
		routes, pool, epp,
		Assignment(IstioPoolSvc, p.Endpoints...),
		Assignment(IstioEPPCluster, p.EPP),
	}
}

// Names in the Envoy Gateway shape.
const (
	EGListener      = "default/eg/http"
	EGRoutes        = "default/eg/http"
	EGFilter        = "envoy.filters.http.ext_proc/endpointpicker/pool_default_ext_proc"
	EGRouteCluster  = "httproute/default/llm-route/rule/0"
	EGEPPCluster    = "envoy.clusters.endpointpicker_pool_default_ext_proc"
	EGEPPHost       = "pool-epp.default.svc"
	EGOtherCluster  = "httproute/default/other/rule/0"
	EGOtherPrefix   = "/other"
	EGRouteName     = "httproute/default/llm-route/rule/0/match/0/*"
	egVirtualHost   = "default/eg/http/*"
	egConnectTimout = 10 * time.Second
)

// EnvoyGateway is the shape Envoy Gateway sends when an extension server
// resolves HTTPRoute → InferencePool: a disabled ext_proc filter per pool,
// enabled on the pool's routes by typed_per_filter_config; the route's
// cluster ORIGINAL_DST by the x-gateway-destination-endpoint header; the
// picker reached through a STRICT_DNS cluster with TLS that accepts any
// certificate, named EGEPPHost (resolve it to the picker's IP). A second
// route (EGOtherPrefix) goes to an ordinary STATIC cluster at other,
// without the picker.
func EnvoyGateway(p Pool, other string) []proto.Message {
	filter := &extprocv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: EGEPPCluster, Authority: EGEPPHost + ":9002"}},
			Timeout:         durationpb.New(10 * time.Second),
		},
		FailureModeAllow: p.FailOpen,
		ProcessingMode:   DuplexMode(),
		MessageTimeout:   durationpb.New(300 * time.Second),
		MetadataOptions:  LBNamespaces(),
	}
	enable := Any(&routev3.FilterConfig{Config: Any(&extprocv3.ExtProcPerRoute{
		Override: &extprocv3.ExtProcPerRoute_Overrides{Overrides: &extprocv3.ExtProcOverrides{}},
	})})
	routes := &routev3.RouteConfiguration{
		Name:                     EGRoutes,
		IgnorePortInHostMatching: true,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    egVirtualHost,
			Domains: []string{"*"},
			Routes: []*routev3.Route{
				{
					Name:  "httproute/default/other/rule/0/match/0/*",
					Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: EGOtherPrefix}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{
						ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: EGOtherCluster},
					}},
				},
				{
					Name:  EGRouteName,
					Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{
						ClusterSpecifier:     &routev3.RouteAction_Cluster{Cluster: EGRouteCluster},
						HostRewriteSpecifier: &routev3.RouteAction_AutoHostRewrite{AutoHostRewrite: wrapperspb.Bool(false)},
						Timeout:              durationpb.New(300 * time.Second),
					}},
					TypedPerFilterConfig: map[string]*anypb.Any{EGFilter: enable},
				},
			},
		}},
	}
	routeCluster := &clusterv3.Cluster{
		Name:                 EGRouteCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
		LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
		ConnectTimeout:       durationpb.New(egConnectTimout),
		LbConfig: &clusterv3.Cluster_OriginalDstLbConfig_{OriginalDstLbConfig: &clusterv3.Cluster_OriginalDstLbConfig{
			UseHttpHeader:  true,
			HttpHeaderName: wire.DestinationEndpointKey,
		}},
	}
	eppCluster := pickerCluster(EGEPPCluster, EGEPPHost, p, egConnectTimout)
	otherCluster := &clusterv3.Cluster{
		Name:                 EGOtherCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment:       Assignment(EGOtherCluster, other),
	}
	return []proto.Message{
		Listener(EGListener, p.ListenerPort, EGRoutes, HTTPFilter(EGFilter, filter, true)),
		routes, routeCluster, eppCluster, otherCluster,
	}
}

// pickerCluster is a pool's picker as Envoy Gateway and kgateway reach it:
// STRICT_DNS on host at p.EPP's port, least request, with TLS that accepts
// any certificate when p.EPPTLS.
func pickerCluster(name, host string, p Pool, connectTimeout time.Duration) *clusterv3.Cluster {
	_, eppPort, _ := net.SplitHostPort(p.EPP)
	port, _ := strconv.Atoi(eppPort)
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		LbPolicy:             clusterv3.Cluster_LEAST_REQUEST,
		ConnectTimeout:       durationpb.New(connectTimeout),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{lbEndpoint(host, uint32(port))},
		}}},
	}
	if p.EPPTLS {
		c.TransportSocket = AcceptAnyTLS()
	}
	return c
}

// DuplexMode is headers SEND, both bodies FULL_DUPLEX_STREAMED, trailers SEND.
func DuplexMode() *extprocv3.ProcessingMode {
	return &extprocv3.ProcessingMode{
		RequestHeaderMode:   extprocv3.ProcessingMode_SEND,
		ResponseHeaderMode:  extprocv3.ProcessingMode_SEND,
		RequestBodyMode:     extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode:    extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		RequestTrailerMode:  extprocv3.ProcessingMode_SEND,
		ResponseTrailerMode: extprocv3.ProcessingMode_SEND,
	}
}

// LBNamespaces forwards and receives the envoy.lb namespace.
func LBNamespaces() *extprocv3.MetadataOptions {
	ns := &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: []string{wire.LBNamespace}}
	return &extprocv3.MetadataOptions{ForwardingNamespaces: ns, ReceivingNamespaces: ns}
}

// LBKey is the metadata key envoy.lb/key.
func LBKey(key string) *metadatav3.MetadataKey {
	return &metadatav3.MetadataKey{Key: wire.LBNamespace, Path: []*metadatav3.MetadataKey_PathSegment{
		{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: key}},
	}}
}

// HTTPFilter wraps a typed filter config as an HCM http filter.
func HTTPFilter(name string, cfg proto.Message, disabled bool) *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: name, Disabled: disabled, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: Any(cfg)}}
}

// Listener is a plaintext HTTP listener on 0.0.0.0:port whose routes come
// over RDS; the router is appended to filters.
func Listener(name string, port uint32, rds string, filters ...*hcmv3.HttpFilter) *listenerv3.Listener {
	router := HTTPFilter("envoy.filters.http.router", &routerv3.Router{}, false)
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			RouteConfigName: rds,
			ConfigSource: &corev3.ConfigSource{
				ResourceApiVersion:    corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			},
		}},
		HttpFilters: append(filters, router),
	}
	return &listenerv3.Listener{
		Name:    name,
		Address: socketAddress("0.0.0.0", port),
		FilterChains: []*listenerv3.FilterChain{{
			Filters: []*listenerv3.Filter{{
				Name:       "envoy.filters.network.http_connection_manager",
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: Any(hcm)},
			}},
		}},
	}
}

// CatchAllRoutes is a route configuration sending every request to cluster.
func CatchAllRoutes(name, cluster string) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"},
		Routes: []*routev3.Route{{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}}}}}}}
}

// EDSCluster is a cluster whose endpoints come over ADS.
func EDSCluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			ServiceName: name,
			EdsConfig: &corev3.ConfigSource{
				ResourceApiVersion:    corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			},
		},
		ConnectTimeout: durationpb.New(10 * time.Second),
	}
}

// EDSClusterFrom is an EDS cluster whose load assignment serviceName comes
// from the EDS server that cluster source reaches (an api_config_source),
// not over ADS.
func EDSClusterFrom(name, serviceName, source string) *clusterv3.Cluster {
	c := EDSCluster(name)
	c.EdsClusterConfig.ServiceName = serviceName
	c.EdsClusterConfig.EdsConfig = &corev3.ConfigSource{
		ResourceApiVersion: corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
			ApiType: corev3.ApiConfigSource_GRPC, TransportApiVersion: corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: source}}}},
		}},
	}
	return c
}

// EDSClusterFromGoogleGrpc is EDSClusterFrom whose api_config_source is a
// plaintext google_grpc channel to target (host:port), which needs no
// cluster.
func EDSClusterFromGoogleGrpc(name, serviceName, target string) *clusterv3.Cluster {
	c := EDSClusterFrom(name, serviceName, "")
	c.EdsClusterConfig.EdsConfig.GetApiConfigSource().GrpcServices = []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_GoogleGrpc_{
		GoogleGrpc: &corev3.GrpcService_GoogleGrpc{TargetUri: target, StatPrefix: "eds"},
	}}}
	return c
}

// Assignment is a ClusterLoadAssignment of ip:port endpoints.
func Assignment(name string, endpoints ...string) *endpointv3.ClusterLoadAssignment {
	var les []*endpointv3.LbEndpoint
	for _, ep := range endpoints {
		host, port, err := net.SplitHostPort(ep)
		if err != nil {
			panic("xdstest: endpoint " + ep + ": " + err.Error())
		}
		n, _ := strconv.Atoi(port)
		les = append(les, lbEndpoint(host, uint32(n)))
	}
	return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: les}}}
}

func lbEndpoint(host string, port uint32) *endpointv3.LbEndpoint {
	return &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
		Address: socketAddress(host, port),
	}}}
}

func socketAddress(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// AcceptAnyTLS is TLS with an empty validation context: the server's
// certificate is not verified (endpoint pickers serve self-signed ones).
func AcceptAnyTLS() *corev3.TransportSocket {
	return &corev3.TransportSocket{
		Name: "envoy.transport_sockets.tls",
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: Any(&tlsv3.UpstreamTlsContext{
			CommonTlsContext: &tlsv3.CommonTlsContext{AlpnProtocols: []string{"h2"}},
		})},
	}
}

// Any packs m; only a nil message can fail.
func Any(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic("xdstest: " + err.Error())
	}
	return a
}

// StaticCluster is a STATIC cluster of ip:port endpoints, round robin.
func StaticCluster(name string, endpoints ...string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment:       Assignment(name, endpoints...),
	}
}

// ExtProc is an ext_proc filter config calling cluster with mode,
// receiving and forwarding envoy.lb.
func ExtProc(cluster string, mode *extprocv3.ProcessingMode, failOpen bool) *extprocv3.ExternalProcessor {
	return &extprocv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster}},
		},
		FailureModeAllow: failOpen,
		ProcessingMode:   mode,
		MetadataOptions:  LBNamespaces(),
	}
}
