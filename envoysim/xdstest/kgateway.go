package xdstest

import (
	"net"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headertometadatav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/inference/wire"
)

// Names in the kgateway shape (kgateway v2.2.0, pkg/kgateway/
// agentgatewaysyncer/backend/inferencepool: plugin.go and backends.go).
const (
	KgwListener        = "listener~80"
	KgwRoutes          = "listener~80"
	KgwFilter          = "inferencepool.backend.transformation.kgateway.io"
	KgwHeaderFilter    = "envoy.filters.http.header_to_metadata"
	KgwPoolCluster     = "endpoint-picker_default_pool_8000"
	KgwEPPCluster      = "endpointpicker_pool_default_ext_proc"
	KgwEPPHost         = "pool-epp.default.svc"
	KgwSubsetHint      = "envoy.lb.subset_hint"
	kgwPlaceholder     = "endpointpicker_placeholder-pool_placeholder-namespace_ext_proc"
	kgwSubsetHintKey   = wire.DestinationEndpointKey + "-subset"
	kgwConnectTimeout  = 10 * time.Second
	kgwMessageTimeout  = 5 * time.Second
	kgwGrpcTimeout     = 10 * time.Second
	kgwVirtualHostName = "listener~80~gw_example"
)

// Kgateway is the shape kgateway sends a Gateway's Envoy for an HTTPRoute
// to an InferencePool:
//   - on the listener, an ext_proc filter failing open whose gRPC service
//     is a placeholder cluster that does not exist (receiving envoy.lb,
//     forwarding envoy.lb.subset_hint), then header_to_metadata copying the
//     x-gateway-destination-endpoint header into envoy.lb, then the router;
//   - on the pool's route, an ExtProcPerRoute override naming the picker's
//     cluster with the pool's failure mode, and a metadata_match whose only
//     namespace is envoy.lb.subset_hint (the pool's endpoints as a list);
//   - the pool's cluster STATIC over its endpoints, each with its address
//     in envoy.lb metadata, with a subset load balancer on that key falling
//     back to any endpoint;
//   - the picker's cluster STRICT_DNS on KgwEPPHost over TLS that accepts
//     any certificate (resolve the name to the picker's IP).
func Kgateway(p Pool) []proto.Message {
	grpc := func(cluster, authority string) *corev3.GrpcService {
		return &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster, Authority: authority}}}
	}
	filter := &extprocv3.ExternalProcessor{
		GrpcService:      grpc(kgwPlaceholder, "placeholder-service.placeholder-namespace.svc:9002"),
		ProcessingMode:   DuplexMode(),
		MessageTimeout:   durationpb.New(kgwMessageTimeout),
		FailureModeAllow: true,
		MetadataOptions: &extprocv3.MetadataOptions{
			ForwardingNamespaces: &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: []string{KgwSubsetHint}},
			ReceivingNamespaces:  &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: []string{wire.LBNamespace}},
		},
	}
	toMetadata := &headertometadatav3.Config{RequestRules: []*headertometadatav3.Config_Rule{{
		Header: wire.DestinationEndpointKey,
		OnHeaderPresent: &headertometadatav3.Config_KeyValuePair{
			MetadataNamespace: wire.LBNamespace, Key: wire.DestinationEndpointKey, Type: headertometadatav3.Config_STRING,
		},
	}}}
	_, eppPort, _ := net.SplitHostPort(p.EPP)
	epp := grpc(KgwEPPCluster, KgwEPPHost+":"+eppPort)
	epp.Timeout = durationpb.New(kgwGrpcTimeout)
	override := Any(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Overrides{Overrides: &extprocv3.ExtProcOverrides{
		FailureModeAllow: wrapperspb.Bool(p.FailOpen),
		GrpcService:      epp,
	}}})
	hint := make([]*structpb.Value, len(p.Endpoints))
	lbEndpoints := make([]*endpointv3.LbEndpoint, len(p.Endpoints))
	for i, ep := range p.Endpoints {
		hint[i] = structpb.NewStringValue(ep)
		host, ps, _ := net.SplitHostPort(ep)
		n, _ := strconv.Atoi(ps)
		lbEndpoints[i] = lbEndpoint(host, uint32(n))
		lbEndpoints[i].Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			wire.LBNamespace: {Fields: map[string]*structpb.Value{wire.DestinationEndpointKey: structpb.NewStringValue(ep)}},
		}}
	}
	routes := &routev3.RouteConfiguration{
		Name: KgwRoutes,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    kgwVirtualHostName,
			Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Name:  "listener~80~gw_example-route-0-httproute-llm-route-default-0-0-matcher-0",
				Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{
					ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: KgwPoolCluster},
					MetadataMatch: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
						KgwSubsetHint: {Fields: map[string]*structpb.Value{kgwSubsetHintKey: structpb.NewListValue(&structpb.ListValue{Values: hint})}},
					}},
				}},
				TypedPerFilterConfig: map[string]*anypb.Any{KgwFilter: override},
			}},
		}},
	}
	pool := &clusterv3.Cluster{
		Name:                 KgwPoolCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		ConnectTimeout:       durationpb.New(5 * time.Second),
		LbSubsetConfig: &clusterv3.Cluster_LbSubsetConfig{
			FallbackPolicy:  clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT,
			SubsetSelectors: []*clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{{Keys: []string{wire.DestinationEndpointKey}}},
		},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: KgwPoolCluster, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbEndpoints}}},
	}
	eppCluster := pickerCluster(KgwEPPCluster, KgwEPPHost, p, kgwConnectTimeout)
	return []proto.Message{
		Listener(KgwListener, p.ListenerPort, KgwRoutes, HTTPFilter(KgwFilter, filter, false), HTTPFilter(KgwHeaderFilter, toMetadata, false)),
		routes, pool, eppCluster,
	}
}
