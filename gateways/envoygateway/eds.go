package envoygateway

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// EDSServer is where Envoy reaches the extension's EDS service: the
// address of the extension's Service, and, when it serves TLS, the PEM
// certificates Envoy verifies its certificate against.
//
// Envoy reaches it over a google_grpc channel, not through a cluster: an
// api_config_source over envoy_grpc must name a static non-EDS cluster of
// Envoy's bootstrap (source/common/config/utility.cc
// checkApiConfigSourceSubscriptionBackingCluster, validateClusterName), and
// the clusters an extension adds arrive over CDS, so Envoy would reject
// every pool cluster ("must have a statically defined non-EDS cluster").
// A google_grpc source names no cluster and is not checked; Envoy's Google
// gRPC client connects to target_uri itself, in plaintext without
// channel_credentials (google_grpc_creds_impl.cc
// CredsUtility::defaultChannelCredentials) or over TLS that verifies the
// server's certificate against RootCAs for the target's host name.
type EDSServer struct {
	Address string // host:port
	TLS     bool
	RootCAs []byte // PEM; with TLS
}

// edsStatPrefix names the EDS channel's statistics in Envoy.
const edsStatPrefix = "infergate_eds"

// configSource is where a pool cluster's endpoints come from.
func (e *EDSServer) configSource() *corev3.ConfigSource {
	g := &corev3.GrpcService_GoogleGrpc{TargetUri: e.Address, StatPrefix: edsStatPrefix}
	if e.TLS {
		g.ChannelCredentials = &corev3.GrpcService_GoogleGrpc_ChannelCredentials{CredentialSpecifier: &corev3.GrpcService_GoogleGrpc_ChannelCredentials_SslCredentials{
			SslCredentials: &corev3.GrpcService_GoogleGrpc_SslCredentials{RootCerts: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: e.RootCAs}}},
		}}
	}
	return &corev3.ConfigSource{
		ResourceApiVersion: corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
			ApiType: corev3.ApiConfigSource_GRPC, TransportApiVersion: corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_GoogleGrpc_{GoogleGrpc: g}}},
		}},
	}
}

// EDSName is the load assignment of pool p: its ready pods × targetPorts.
func EDSName(p *Pool) string { return "infergate/pool/" + p.Key() }

// PickerEDSName is the load assignment of pool p's picker: the ready
// addresses of its Service (KubeEndpoints.PickerEndpoints).
func PickerEDSName(p *Pool) string { return "infergate/picker/" + p.Key() }

// allNodes gives every Envoy the same snapshot: the pools' endpoints do
// not depend on which Gateway asks.
type allNodes struct{}

func (allNodes) ID(*corev3.Node) string { return "all" }

// newEndpointCache is the snapshot cache behind the extension's EDS service
// (state of the world, not aggregated: Envoy opens an EDS stream to it).
func newEndpointCache() cachev3.SnapshotCache {
	return cachev3.NewSnapshotCache(false, allNodes{}, nil)
}

// endpointPublisher keeps the EDS snapshot equal to every pool's endpoints:
// any change to a Pod or an InferencePool republishes them all, so a scale
// out reaches Envoy without Envoy Gateway translating anything.
type endpointPublisher struct {
	reader    client.Reader
	cache     cachev3.SnapshotCache
	endpoints KubeEndpoints
	version   atomic.Uint64
	log       logr.Logger
}

// everything is the one key the publisher reconciles: all pools at once.
var everything = reconcile.Request{NamespacedName: ktypes.NamespacedName{Name: "all-pools"}}

func setUpEndpoints(mgr ctrl.Manager, cache cachev3.SnapshotCache, log logr.Logger) error {
	p := &endpointPublisher{reader: mgr.GetCache(), cache: cache, endpoints: KubeEndpoints{Reader: mgr.GetCache()}, log: log}
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request { return []reconcile.Request{everything} })
	return ctrl.NewControllerManagedBy(mgr).
		Named("inferencepool-endpoints").
		// Every replica serves EDS, leader or not: a proxy that starts
		// while one replica is down gets its endpoints from another.
		WithOptions(controller.Options{SkipNameValidation: ptr.To(true), NeedLeaderElection: ptr.To(false)}).
		Watches(&inferencev1.InferencePool{}, all).
		Watches(&corev1.Pod{}, all).
		Watches(&corev1.Service{}, all).
		Watches(&discoveryv1.EndpointSlice{}, all).
		Complete(p)
}

func (e *endpointPublisher) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var pools inferencev1.InferencePoolList
	if err := e.reader.List(ctx, &pools); err != nil {
		return reconcile.Result{}, fmt.Errorf("list InferencePools: %w", err)
	}
	var clas []types.Resource
	for i := range pools.Items {
		p, err := poolOf(&pools.Items[i])
		if err != nil {
			continue // its route answers 500; nothing to publish
		}
		eps, err := e.endpoints.Endpoints(ctx, p)
		if err != nil {
			return reconcile.Result{}, err
		}
		cla, err := loadAssignment(EDSName(p), eps)
		if err != nil {
			return reconcile.Result{}, err
		}
		clas = append(clas, cla)
		// An empty assignment too: the picker's cluster then has no host
		// (its failure mode answers) rather than waiting to warm.
		peps, err := e.endpoints.PickerEndpoints(ctx, p)
		if err != nil {
			return reconcile.Result{}, err
		}
		if cla, err = loadAssignment(PickerEDSName(p), peps); err != nil {
			return reconcile.Result{}, err
		}
		clas = append(clas, cla)
	}
	snap, err := cachev3.NewSnapshot(strconv.FormatUint(e.version.Add(1), 10), map[resourcev3.Type][]types.Resource{resourcev3.EndpointType: clas})
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := e.cache.SetSnapshot(ctx, allNodes{}.ID(nil), snap); err != nil {
		return reconcile.Result{}, err
	}
	e.log.V(1).Info("endpoints published", "pools", len(clas))
	return reconcile.Result{}, nil
}

// loadAssignment lists ip:port endpoints as one locality.
func loadAssignment(name string, endpoints []string) (*endpointv3.ClusterLoadAssignment, error) {
	lbs := make([]*endpointv3.LbEndpoint, 0, len(endpoints))
	for _, ep := range endpoints {
		a, err := hostPort(ep)
		if err != nil {
			return nil, err
		}
		lbs = append(lbs, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: a}}})
	}
	return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}}}, nil
}
