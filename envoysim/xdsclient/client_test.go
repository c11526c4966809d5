package xdsclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestNewValidatesConfig(t *testing.T) {
	h := HandlerFunc(func(context.Context, string, string, []*anypb.Any) error { return nil })
	for _, tc := range []struct {
		name    string
		cfg     Config
		handler Handler
		wantErr string
	}{
		{"ok", Config{Server: "127.0.0.1:1", NodeID: "n"}, h, ""},
		{"no server", Config{NodeID: "n"}, h, "Server"},
		{"no node id", Config{Server: "127.0.0.1:1"}, h, "NodeID"},
		{"nil handler", Config{Server: "127.0.0.1:1", NodeID: "n"}, nil, "Handler"},
		{"negative backoff", Config{Server: "127.0.0.1:1", NodeID: "n", BackoffInitial: -1}, h, "negative"},
		{"initial above max", Config{Server: "127.0.0.1:1", NodeID: "n", BackoffInitial: time.Second, BackoffMax: time.Millisecond}, h, "exceeds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg, tc.handler)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.wantErr)
			}
		})
	}
}

func TestTypeURLsMatchProtos(t *testing.T) {
	for typ, m := range map[string]proto.Message{
		ListenerType: &listenerv3.Listener{},
		RouteType:    &routev3.RouteConfiguration{},
		ClusterType:  &clusterv3.Cluster{},
		EndpointType: &endpointv3.ClusterLoadAssignment{},
		SecretType:   &tlsv3.Secret{},
		wrapperType:  &discoveryv3.Resource{},
	} {
		if want := typePrefix + string(proto.MessageName(m)); typ != want {
			t.Errorf("%s, want %s", typ, want)
		}
	}
}

// Wildcard LDS and CDS first; the handler then subscribes RDS and EDS by
// the names the listener and cluster reference, from inside Apply.
func TestFollowsListenersAndClustersToRoutesAndEndpoints(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	setSnapshot(t, cache, basicSnapshot(t, "1", 8001))
	srv := startXDS(t, "127.0.0.1:0", cache)
	proxy := &fakeProxy{}
	c := runClient(t, srv.addr, proxy, nil)

	waitVersions(ctx, t, c, "1")

	for typ, want := range map[string][]string{ListenerType: {"l1"}, RouteType: {"r1"}, ClusterType: {"c1"}, EndpointType: {"c1"}} {
		if got := proxy.names(typ); !slices.Equal(got, want) {
			t.Errorf("%s applied %v, want %v", typ, got, want)
		}
	}
	st := c.Status()
	for typ, want := range map[string]TypeStatus{
		ListenerType: {Wildcard: true},
		ClusterType:  {Wildcard: true},
		RouteType:    {Names: []string{"r1"}},
		EndpointType: {Names: []string{"c1"}},
	} {
		got := st[typ]
		if got.Wildcard != want.Wildcard || !slices.Equal(got.Names, want.Names) || got.Version != "1" ||
			got.ACKs != 1 || got.NACKs != 0 || got.LastError != "" || got.Nonce == "" {
			t.Errorf("%s status %+v, want names %v wildcard %v version 1, one ACK", typ, got, want.Names, want.Wildcard)
		}
	}

	reqs := srv.requests()
	first := reqs[0]
	if n := first.GetNode(); n.GetId() != testNode || n.GetCluster() != "devproxy" || n.GetUserAgentName() != UserAgentName {
		t.Errorf("first request node %v", n)
	}
	if first.GetTypeUrl() != ListenerType || len(first.GetResourceNames()) != 0 || first.GetVersionInfo() != "" || first.GetResponseNonce() != "" {
		t.Errorf("first request %v, want a wildcard LDS request with no version or nonce", first)
	}
	if nodes := srv.wireNodes(); len(nodes) < 2 || !nodes[0] || slices.Contains(nodes[1:], true) {
		t.Errorf("node on the wire per request %v, want on the first request only", nodes)
	}
	// Every ACK names the response it answers and carries its version.
	for _, typ := range []string{ListenerType, RouteType, ClusterType, EndpointType} {
		nonce := st[typ].Nonce
		ack := srv.waitRequest(ctx, t, typ+" ACK", func(r *discoveryv3.DiscoveryRequest) bool {
			return r.GetTypeUrl() == typ && r.GetResponseNonce() == nonce
		})
		if ack.GetVersionInfo() != "1" || ack.GetErrorDetail() != nil {
			t.Errorf("%s ACK %v", typ, ack)
		}
		if resp := srv.responseWithNonce(nonce); resp.GetTypeUrl() != typ || resp.GetVersionInfo() != "1" {
			t.Errorf("%s ACK answers response %v", typ, resp)
		}
	}
	// RDS and EDS were never requested with empty names (legacy wildcard).
	for _, r := range reqs {
		if (r.GetTypeUrl() == RouteType || r.GetTypeUrl() == EndpointType) && len(r.GetResourceNames()) == 0 {
			t.Errorf("%s request without names: %v", r.GetTypeUrl(), r)
		}
	}
}

// Snapshots set while the stream is up are delivered live, followed where
// they lead, and ACKed.
func TestLiveUpdatesAreACKed(t *testing.T) {
	ctx := testCtx(t, 15*time.Second)
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	setSnapshot(t, cache, basicSnapshot(t, "1", 8001))
	srv := startXDS(t, "127.0.0.1:0", cache)
	proxy := &fakeProxy{}
	c := runClient(t, srv.addr, proxy, nil)
	waitVersions(ctx, t, c, "1")

	for _, step := range []struct {
		name      string
		version   string
		resources map[resourcev3.Type][]types.Resource
		want      map[string][]string
	}{
		{
			name:    "endpoint moves",
			version: "2",
			resources: map[resourcev3.Type][]types.Resource{
				resourcev3.ListenerType: {httpListener(t, "l1", "r1")},
				resourcev3.RouteType:    {routeConfig("r1", "c1")},
				resourcev3.ClusterType:  {edsCluster("c1")},
				resourcev3.EndpointType: {loadAssignment("c1", 8002)},
			},
			want: map[string][]string{ListenerType: {"l1"}, RouteType: {"r1"}, ClusterType: {"c1"}, EndpointType: {"c1"}},
		},
		{
			name:    "listener switches route config, cluster added",
			version: "3",
			resources: map[resourcev3.Type][]types.Resource{
				resourcev3.ListenerType: {httpListener(t, "l1", "r2")},
				resourcev3.RouteType:    {routeConfig("r2", "c2")},
				resourcev3.ClusterType:  {edsCluster("c1"), edsCluster("c2")},
				resourcev3.EndpointType: {loadAssignment("c1", 8002), loadAssignment("c2", 8003)},
			},
			want: map[string][]string{ListenerType: {"l1"}, RouteType: {"r2"}, ClusterType: {"c1", "c2"}, EndpointType: {"c1", "c2"}},
		},
		{
			name:    "second listener",
			version: "4",
			resources: map[resourcev3.Type][]types.Resource{
				resourcev3.ListenerType: {httpListener(t, "l1", "r2"), httpListener(t, "l2", "r3")},
				resourcev3.RouteType:    {routeConfig("r2", "c2"), routeConfig("r3", "c1")},
				resourcev3.ClusterType:  {edsCluster("c1"), edsCluster("c2")},
				resourcev3.EndpointType: {loadAssignment("c1", 8002), loadAssignment("c2", 8003)},
			},
			want: map[string][]string{ListenerType: {"l1", "l2"}, RouteType: {"r2", "r3"}, ClusterType: {"c1", "c2"}, EndpointType: {"c1", "c2"}},
		},
	} {
		setSnapshot(t, cache, snapshot(t, step.version, step.resources))
		waitVersions(ctx, t, c, step.version)
		st := c.Status()
		for typ, want := range step.want {
			if got := proxy.names(typ); !slices.Equal(got, want) {
				t.Errorf("%s: %s applied %v, want %v", step.name, typ, got, want)
			}
			if st[typ].Version != step.version || st[typ].LastError != "" {
				t.Errorf("%s: %s status %+v", step.name, typ, st[typ])
			}
			if (typ == RouteType || typ == EndpointType) && !slices.Equal(st[typ].Names, want) {
				t.Errorf("%s: %s subscribed %v, want %v", step.name, typ, st[typ].Names, want)
			}
		}
		// The server saw the ACK of the live response.
		nonce := st[ListenerType].Nonce
		srv.waitRequest(ctx, t, step.name+" LDS ACK", func(r *discoveryv3.DiscoveryRequest) bool {
			return r.GetTypeUrl() == ListenerType && r.GetResponseNonce() == nonce && r.GetVersionInfo() == step.version
		})
	}
}

// A handler error NACKs with its message and the last good version; the
// handler's old state stays; the next good snapshot is ACKed.
func TestHandlerErrorNACKs(t *testing.T) {
	ctx := testCtx(t, 15*time.Second)
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	setSnapshot(t, cache, basicSnapshot(t, "1", 8001))
	srv := startXDS(t, "127.0.0.1:0", cache)
	proxy := &fakeProxy{reject: func(typeURL, name string) error {
		if typeURL == ListenerType && name == "bad" {
			return errors.New(`listener "bad": unsupported filter`)
		}
		return nil
	}}
	c := runClient(t, srv.addr, proxy, nil)
	waitVersions(ctx, t, c, "1")

	bad := snapshot(t, "2", map[resourcev3.Type][]types.Resource{
		resourcev3.ListenerType: {httpListener(t, "l1", "r1"), httpListener(t, "bad", "r1")},
		resourcev3.RouteType:    {routeConfig("r1", "c1")},
		resourcev3.ClusterType:  {edsCluster("c1")},
		resourcev3.EndpointType: {loadAssignment("c1", 8001)},
	})
	setSnapshot(t, cache, bad)

	var nackErr *NACKError
	if err := c.WaitVersion(ctx, ListenerType, "2"); !errors.As(err, &nackErr) {
		t.Fatalf("WaitVersion(LDS, 2) = %v, want a NACKError", err)
	}
	if !strings.Contains(nackErr.Message, `listener "bad": unsupported filter`) {
		t.Errorf("NACK message %q", nackErr.Message)
	}
	nack := srv.waitRequest(ctx, t, "LDS NACK", func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetTypeUrl() == ListenerType && r.GetErrorDetail() != nil
	})
	if got := nack.GetErrorDetail(); got.GetCode() != int32(codes.InvalidArgument) || !strings.Contains(got.GetMessage(), `listener "bad"`) {
		t.Errorf("error_detail %v, want INVALID_ARGUMENT with the handler's message", got)
	}
	if nack.GetVersionInfo() != "1" {
		t.Errorf("NACK version_info %q, want the last accepted 1", nack.GetVersionInfo())
	}
	if resp := srv.responseWithNonce(nack.GetResponseNonce()); resp.GetTypeUrl() != ListenerType || resp.GetVersionInfo() != "2" {
		t.Errorf("NACK answers response %v, want LDS version 2", resp)
	}
	if st := c.Status()[ListenerType]; st.Version != "1" || st.RejectedVersion != "2" || st.NACKs == 0 || !strings.Contains(st.LastError, "unsupported filter") {
		t.Errorf("LDS status %+v", st)
	}
	if got := proxy.names(ListenerType); !slices.Equal(got, []string{"l1"}) {
		t.Errorf("proxy holds listeners %v after the NACK, want the old [l1]", got)
	}

	// go-control-plane answers a NACK at once with the same snapshot; the
	// client paces the repeats instead of spinning.
	time.Sleep(300 * time.Millisecond)
	if n := c.Status()[ListenerType].NACKs; n > 6 {
		t.Errorf("%d NACKs of one bad version in 300ms: repeats are not paced", n)
	} else {
		t.Logf("%d NACKs of version 2 in ~300ms", n)
	}

	setSnapshot(t, cache, basicSnapshot(t, "3", 8003))
	waitVersions(ctx, t, c, "3")
	if st := c.Status()[ListenerType]; st.LastError != "" || st.Version != "3" {
		t.Errorf("LDS status after a good snapshot %+v", st)
	}
	ack := srv.waitRequest(ctx, t, "LDS ACK of 3", func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetTypeUrl() == ListenerType && r.GetVersionInfo() == "3"
	})
	if ack.GetErrorDetail() != nil {
		t.Errorf("ACK carries error_detail %v", ack.GetErrorDetail())
	}
}

// Raw responses that go-control-plane's snapshot cache never produces, sent
// by its server through a scripted cache.
func TestResponseChecks(t *testing.T) {
	listenerAny := mustAny(t, httpListener(t, "l1", "r1"))
	clusterAny := mustAny(t, edsCluster("c1"))
	wrap := func(name string, a *anypb.Any) *anypb.Any {
		return mustAny(t, &discoveryv3.Resource{Name: name, Version: "1", Resource: a})
	}
	lds := func(version string, res ...*anypb.Any) *discoveryv3.DiscoveryResponse {
		return &discoveryv3.DiscoveryResponse{TypeUrl: ListenerType, VersionInfo: version, Resources: res}
	}
	for _, tc := range []struct {
		name      string
		responses []*discoveryv3.DiscoveryResponse
		wantNACK  string // substring of error_detail.message; "" = ACK
		wantNames []string
		noApply   bool
	}{
		{
			name:      "plain",
			responses: []*discoveryv3.DiscoveryResponse{lds("1", listenerAny)},
			wantNames: []string{"l1"},
		},
		{
			name:      "wrapped in discovery Resource",
			responses: []*discoveryv3.DiscoveryResponse{lds("1", wrap("l1", listenerAny))},
			wantNames: []string{"l1"},
		},
		{
			name:      "heartbeat only is ACKed without Apply",
			responses: []*discoveryv3.DiscoveryResponse{lds("1", mustAny(t, &discoveryv3.Resource{Name: "l1"}))},
			noApply:   true,
		},
		{
			name:      "empty state of the world",
			responses: []*discoveryv3.DiscoveryResponse{lds("1")},
			wantNames: []string{},
		},
		{
			name: "unsubscribed type ignored",
			responses: []*discoveryv3.DiscoveryResponse{
				{TypeUrl: SecretType, VersionInfo: "9", Resources: []*anypb.Any{mustAny(t, &tlsv3.Secret{Name: "s"})}},
				lds("1", listenerAny),
			},
			wantNames: []string{"l1"},
		},
		{
			name:      "resource of another type",
			responses: []*discoveryv3.DiscoveryResponse{lds("1", listenerAny, clusterAny)},
			wantNACK:  "resource 1 is a " + ClusterType,
		},
		{
			name:      "wrapped resource of another type",
			responses: []*discoveryv3.DiscoveryResponse{lds("1", wrap("c1", clusterAny))},
			wantNACK:  "resource 0 is a " + ClusterType,
		},
		{
			name:      "heartbeat mixed with resources",
			responses: []*discoveryv3.DiscoveryResponse{lds("1", listenerAny, mustAny(t, &discoveryv3.Resource{Name: "l2"}))},
			wantNACK:  "mixes 1 TTL heartbeats",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 10*time.Second)
			srv := startXDS(t, "127.0.0.1:0", scriptedCache{script: map[string][]*discoveryv3.DiscoveryResponse{ListenerType: tc.responses}})
			proxy := &fakeProxy{}
			c := runClient(t, srv.addr, proxy, nil)

			// The last scripted response is the one answered.
			last := len(tc.responses)
			answer := srv.waitRequest(ctx, t, "answer to the last response", func(r *discoveryv3.DiscoveryRequest) bool {
				return r.GetTypeUrl() == ListenerType && r.GetResponseNonce() == fmt.Sprint(last)
			})
			for _, r := range srv.requests() {
				if r.GetResponseNonce() != "" && r.GetResponseNonce() != fmt.Sprint(last) {
					t.Errorf("request answers an ignored response: %v", r)
				}
			}
			st := c.Status()
			if _, ok := st[SecretType]; ok {
				t.Errorf("status has an entry for an unsubscribed type: %v", st)
			}
			if tc.wantNACK == "" {
				if answer.GetErrorDetail() != nil || answer.GetVersionInfo() != "1" {
					t.Fatalf("answer %v, want an ACK of version 1", answer)
				}
				if err := c.WaitVersion(ctx, ListenerType, "1"); err != nil {
					t.Fatal(err)
				}
				if n := proxy.applyCalls(ListenerType); tc.noApply != (n == 0) {
					t.Errorf("%d Apply calls", n)
				}
				if tc.wantNames != nil {
					if got := proxy.names(ListenerType); !slices.Equal(got, tc.wantNames) {
						t.Errorf("applied %v, want %v", got, tc.wantNames)
					}
				}
				return
			}
			if !strings.Contains(answer.GetErrorDetail().GetMessage(), tc.wantNACK) || answer.GetVersionInfo() != "" {
				t.Fatalf("answer %v, want a NACK mentioning %q with empty version_info", answer, tc.wantNACK)
			}
			if got := proxy.names(ListenerType); len(got) != 0 {
				t.Errorf("handler applied %v from a rejected response", got)
			}
		})
	}
}

// After the control plane goes away and comes back on the same address the
// client resumes, re-sending its subscriptions with the versions it holds.
func TestReconnectResumes(t *testing.T) {
	for _, tc := range []struct {
		name, restartVersion string
	}{
		{"restarted with the same version", "1"},
		{"restarted with a new version", "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 15*time.Second)
			first := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
			setSnapshot(t, first, basicSnapshot(t, "1", 8001))
			srv := startXDS(t, "127.0.0.1:0", first)
			proxy := &fakeProxy{}
			c := runClient(t, srv.addr, proxy, func(cfg *Config) { cfg.BackoffMax = 500 * time.Millisecond })
			waitVersions(ctx, t, c, "1")
			acksBefore := c.Status()[ListenerType].ACKs

			srv.stop()
			second := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
			setSnapshot(t, second, basicSnapshot(t, tc.restartVersion, 8002))
			srv2 := startXDS(t, srv.addr, second)

			lds := srv2.waitRequest(ctx, t, "LDS on the new stream", func(r *discoveryv3.DiscoveryRequest) bool {
				return r.GetTypeUrl() == ListenerType
			})
			if lds.GetNode().GetId() != testNode || lds.GetVersionInfo() != "1" || lds.GetResponseNonce() != "" {
				t.Errorf("first request after reconnect %v, want node, version_info 1, no nonce", lds)
			}
			rds := srv2.waitRequest(ctx, t, "RDS on the new stream", func(r *discoveryv3.DiscoveryRequest) bool {
				return r.GetTypeUrl() == RouteType
			})
			if !slices.Equal(rds.GetResourceNames(), []string{"r1"}) || rds.GetVersionInfo() != "1" {
				t.Errorf("RDS request after reconnect %v, want [r1] at version 1", rds)
			}
			srv2.waitRequest(ctx, t, "EDS on the new stream", func(r *discoveryv3.DiscoveryRequest) bool {
				return r.GetTypeUrl() == EndpointType
			})
			// Requests go out again in first-subscribed order: LDS, CDS,
			// then RDS and EDS in the order the handler added them (which
			// depends on whether go-control-plane sent LDS or CDS first).
			if got, want := initialTypes(srv2), initialTypes(srv); !slices.Equal(got, want) || len(got) != 4 {
				t.Errorf("initial requests after reconnect in order %v, want %v as on the first stream", got, want)
			}

			waitVersions(ctx, t, c, tc.restartVersion)
			// A fresh go-control-plane stream answers even an unchanged
			// version, since it has returned nothing on that stream yet.
			srv2.waitRequest(ctx, t, "LDS ACK on the new stream", func(r *discoveryv3.DiscoveryRequest) bool {
				return r.GetTypeUrl() == ListenerType && r.GetResponseNonce() != "" && r.GetErrorDetail() == nil
			})
			if got := c.Status()[ListenerType].ACKs; got <= acksBefore {
				t.Errorf("LDS ACKs %d, want more than the %d before the restart", got, acksBefore)
			}
		})
	}
}

// initialTypes lists the types of the requests that carried no nonce.
func initialTypes(s *xdsServer) []string {
	var types []string
	for _, r := range s.requests() {
		if r.GetResponseNonce() == "" {
			types = append(types, r.GetTypeUrl())
		}
	}
	return types
}

// Cancelling Run's context stops it promptly, connected or not.
func TestRunStopsOnCancel(t *testing.T) {
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	setSnapshot(t, cache, basicSnapshot(t, "1", 8001))
	srv := startXDS(t, "127.0.0.1:0", cache)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := closed.Addr().String()
	closed.Close()

	for _, tc := range []struct {
		name, addr string
		connected  bool
	}{
		{"connected", srv.addr, true},
		{"server unreachable", deadAddr, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 10*time.Second)
			proxy := &fakeProxy{}
			c, err := New(Config{Server: tc.addr, NodeID: testNode}, proxy)
			if err != nil {
				t.Fatal(err)
			}
			proxy.client = c
			c.Subscribe(ListenerType, nil)
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(runCtx) }()
			if tc.connected {
				if err := c.WaitVersion(ctx, ListenerType, "1"); err != nil {
					t.Fatal(err)
				}
			} else {
				time.Sleep(150 * time.Millisecond) // let it fail and back off at least once
			}
			if err := c.Run(ctx); err == nil || !strings.Contains(err.Error(), "already running") {
				t.Errorf("second concurrent Run = %v, want an error", err)
			}
			start := time.Now()
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run = %v, want nil after cancel", err)
				}
				if d := time.Since(start); d > time.Second {
					t.Errorf("Run took %v to stop", d)
				}
			case <-ctx.Done():
				t.Fatal("Run did not stop after cancel")
			}
		})
	}
}

// Subscribe is safe from many goroutines while the stream runs, and the
// server ends up with the last set.
func TestConcurrentSubscribe(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	setSnapshot(t, cache, basicSnapshot(t, "1", 8001))
	srv := startXDS(t, "127.0.0.1:0", cache)
	nop := HandlerFunc(func(context.Context, string, string, []*anypb.Any) error { return nil })
	c := runClient(t, srv.addr, nop, nil)

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 20 {
				c.Subscribe(SecretType, []string{fmt.Sprintf("s%d-%d", i, j)})
				_ = c.Status()
			}
		})
	}
	wg.Wait()
	c.Subscribe(SecretType, []string{"final", "also-final", "final"})
	srv.waitRequest(ctx, t, "the last SDS subscription", func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetTypeUrl() == SecretType && slices.Equal(r.GetResourceNames(), []string{"also-final", "final"})
	})
	if got := c.Status()[SecretType].Names; !slices.Equal(got, []string{"also-final", "final"}) {
		t.Errorf("SDS names %v", got)
	}
}
