// Package xdstest serves xDS to the Envoy stand-in from go-control-plane's
// own ADS server and snapshot cache (the library Envoy Gateway builds its
// xDS server on), and builds the resource shapes the inference gateways
// send: Istio's (one ext_proc filter retargeted per route, EDS cluster with
// the override_host policy) and Envoy Gateway's with an InferencePool
// extension (a disabled ext_proc filter per pool enabled per route, an
// ORIGINAL_DST cluster by header). The shapes follow what those control
// planes are documented to generate (shared/reference/gateways.md §2.7, §3);
// the real control planes are tested against the stand-in by their own
// integration tests.
package xdstest

import (
	"context"
	"net"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// NodeID is the node the server keeps its snapshot for.
const NodeID = "envoysim-test"

// Server is go-control-plane's ADS server on a loopback port.
type Server struct {
	Addr  string
	cache cachev3.SnapshotCache
}

// Start serves an empty snapshot cache until the test ends; opts configure
// the gRPC server (e.g. grpc.Creds for TLS).
func Start(t testing.TB, opts ...grpc.ServerOption) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: ln.Addr().String(), cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)}
	// go-control-plane's stream loops end only with this context; GracefulStop
	// would wait on open streams forever.
	ctx, cancel := context.WithCancel(context.Background())
	g := grpc.NewServer(opts...)
	xds := serverv3.NewServer(ctx, s.cache, nil)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, xds)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, xds)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	t.Cleanup(func() { cancel(); g.Stop(); <-done })
	return s
}

// Set publishes a snapshot of resources at version. The snapshot must be
// consistent (every RDS and EDS name referenced, none extra): the ADS cache
// leaves a type unanswered otherwise.
func (s *Server) Set(t testing.TB, version string, rs ...proto.Message) {
	t.Helper()
	s.set(t, version, true, rs)
}

// SetExternalEDS is Set for a snapshot whose clusters take their endpoints
// from another EDS server: go-control-plane's consistency check, which
// expects every EDS name here, is skipped.
func (s *Server) SetExternalEDS(t testing.TB, version string, rs ...proto.Message) {
	t.Helper()
	s.set(t, version, false, rs)
}

func (s *Server) set(t testing.TB, version string, check bool, rs []proto.Message) {
	t.Helper()
	byType := map[resourcev3.Type][]types.Resource{}
	for _, r := range rs {
		var typ resourcev3.Type
		switch r.(type) {
		case *listenerv3.Listener:
			typ = resourcev3.ListenerType
		case *routev3.RouteConfiguration:
			typ = resourcev3.RouteType
		case *clusterv3.Cluster:
			typ = resourcev3.ClusterType
		case *endpointv3.ClusterLoadAssignment:
			typ = resourcev3.EndpointType
		default:
			t.Fatalf("xdstest: resource type %T", r)
		}
		byType[typ] = append(byType[typ], r)
	}
	snap, err := cachev3.NewSnapshot(version, byType)
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Consistent(); check && err != nil {
		t.Fatalf("xdstest: snapshot %s: %v", version, err)
	}
	if err := s.cache.SetSnapshot(context.Background(), NodeID, snap); err != nil {
		t.Fatal(err)
	}
}

// SetEndpoints publishes load assignments alone, for a server that is only
// an EDS source (a cluster's eds_config api_config_source).
func (s *Server) SetEndpoints(t testing.TB, version string, clas ...*endpointv3.ClusterLoadAssignment) {
	t.Helper()
	rs := make([]types.Resource, len(clas))
	for i, c := range clas {
		rs[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.EndpointType: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), NodeID, snap); err != nil {
		t.Fatal(err)
	}
}
