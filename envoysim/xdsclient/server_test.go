package xdsclient

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

const testNode = "node-1"

// xdsServer is go-control-plane's ADS server on 127.0.0.1, recording every
// request it receives and every response it sends.
type xdsServer struct {
	addr  string
	stop  func()
	mu    sync.Mutex
	reqs  []*discoveryv3.DiscoveryRequest // as go-control-plane's callbacks see them
	resps []*discoveryv3.DiscoveryResponse
	// nodes records, per request read off the wire, whether it carried a
	// node: go-control-plane copies the stream's node into every request
	// before its callbacks run.
	nodes []bool
	// changed is closed and replaced on every record.
	changed chan struct{}
}

// startXDS serves c on addr ("127.0.0.1:0" for a fresh port) until the
// test ends or stop is called.
func startXDS(t *testing.T, addr string, c cachev3.Cache, opts ...grpc.ServerOption) *xdsServer {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	s := &xdsServer{addr: lis.Addr().String(), changed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	cb := serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
			s.record(proto.Clone(req).(*discoveryv3.DiscoveryRequest), nil)
			return nil
		},
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
			s.record(nil, proto.Clone(resp).(*discoveryv3.DiscoveryResponse))
		},
	}
	g := grpc.NewServer(append(opts, grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, &wireRecorder{ServerStream: ss, s: s})
	}))...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, c, cb))
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = g.Serve(lis)
	}()
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			cancel() // ends go-control-plane's stream loops
			g.Stop() // closes the connections: the client sees the stream fail
			<-served
		})
	}
	t.Cleanup(s.stop)
	return s
}

type wireRecorder struct {
	grpc.ServerStream
	s *xdsServer
}

func (w *wireRecorder) RecvMsg(m any) error {
	err := w.ServerStream.RecvMsg(m)
	if req, ok := m.(*discoveryv3.DiscoveryRequest); ok && err == nil {
		w.s.mu.Lock()
		w.s.nodes = append(w.s.nodes, req.GetNode() != nil)
		w.s.mu.Unlock()
	}
	return err
}

// wireNodes reports, per request in arrival order, whether it carried a node.
func (s *xdsServer) wireNodes() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.nodes)
}

func (s *xdsServer) record(req *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if req != nil {
		s.reqs = append(s.reqs, req)
	}
	if resp != nil {
		s.resps = append(s.resps, resp)
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *xdsServer) requests() []*discoveryv3.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

func (s *xdsServer) responses() []*discoveryv3.DiscoveryResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.resps)
}

// waitRequest returns the first request received that satisfies match.
func (s *xdsServer) waitRequest(ctx context.Context, t *testing.T, what string, match func(*discoveryv3.DiscoveryRequest) bool) *discoveryv3.DiscoveryRequest {
	t.Helper()
	for {
		s.mu.Lock()
		changed := s.changed
		for _, r := range s.reqs {
			if match(r) {
				s.mu.Unlock()
				return r
			}
		}
		s.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("server never received %s: %v", what, ctx.Err())
		}
	}
}

// responseWithNonce returns the response sent with nonce.
func (s *xdsServer) responseWithNonce(nonce string) *discoveryv3.DiscoveryResponse {
	for _, r := range s.responses() {
		if r.GetNonce() == nonce {
			return r
		}
	}
	return nil
}

// --- resources ---

func adsSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
}

func mustAny(t testing.TB, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// httpListener is a listener whose HTTP connection manager takes its routes
// from RDS resource route.
func httpListener(t testing.TB, name, route string) *listenerv3.Listener {
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			RouteConfigName: route,
			ConfigSource:    adsSource(),
		}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router"}},
	}
	return &listenerv3.Listener{
		Name: name,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 10080},
		}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name:       "envoy.filters.network.http_connection_manager",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, hcm)},
		}}}},
	}
}

func routeConfig(name, cluster string) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    name,
			Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}},
			}},
		}},
	}
}

func edsCluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsSource()},
	}
}

func loadAssignment(cluster string, port uint32) *endpointv3.ClusterLoadAssignment {
	return &endpointv3.ClusterLoadAssignment{
		ClusterName: cluster,
		Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
				}}},
			}},
		}}}},
	}
}

// snapshot builds a consistent snapshot: go-control-plane's ADS cache only
// answers RDS and EDS requests that name every resource of the type it has.
func snapshot(t testing.TB, version string, res map[resourcev3.Type][]types.Resource) *cachev3.Snapshot {
	t.Helper()
	s, err := cachev3.NewSnapshot(version, res)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Consistent(); err != nil {
		t.Fatalf("snapshot %s: %v", version, err)
	}
	return s
}

// basicSnapshot: listener l1 → route r1 → cluster c1 (EDS) → endpoint port.
func basicSnapshot(t testing.TB, version string, port uint32) *cachev3.Snapshot {
	return snapshot(t, version, map[resourcev3.Type][]types.Resource{
		resourcev3.ListenerType: {httpListener(t, "l1", "r1")},
		resourcev3.RouteType:    {routeConfig("r1", "c1")},
		resourcev3.ClusterType:  {edsCluster("c1")},
		resourcev3.EndpointType: {loadAssignment("c1", port)},
	})
}

func setSnapshot(t testing.TB, c cachev3.SnapshotCache, s *cachev3.Snapshot) {
	t.Helper()
	if err := c.SetSnapshot(context.Background(), testNode, s); err != nil {
		t.Fatal(err)
	}
}

// scriptedCache answers the first request of each stream for a type with
// fixed raw DiscoveryResponses, sent as they are: go-control-plane's
// snapshot cache cannot produce malformed or unsolicited responses.
type scriptedCache struct {
	script map[string][]*discoveryv3.DiscoveryResponse
}

func (c scriptedCache) CreateWatch(req *cachev3.Request, _ cachev3.Subscription, ch chan cachev3.Response) (func(), error) {
	if req.GetResponseNonce() != "" {
		return func() {}, nil // later requests (ACK/NACK) get no answer
	}
	resps := c.script[req.GetTypeUrl()]
	done := make(chan struct{})
	go func() {
		for _, r := range resps {
			select {
			case ch <- &cachev3.PassthroughResponse{Request: req, DiscoveryResponse: proto.Clone(r).(*discoveryv3.DiscoveryResponse)}:
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }) }, nil
}

func (scriptedCache) CreateDeltaWatch(*cachev3.DeltaRequest, cachev3.Subscription, chan cachev3.DeltaResponse) (func(), error) {
	return nil, errors.New("delta not scripted")
}

func (scriptedCache) Fetch(context.Context, *cachev3.Request) (cachev3.Response, error) {
	return nil, errors.New("fetch not scripted")
}

// testCtx bounds a test.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
