package envoysim

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/envoysim/xdstest"
	"github.com/infergate/infergate/inference/wire"
)

// testNode runs a Node of srv until the test ends.
func testNode(t *testing.T, srv *xdstest.Server, bootstrapClusters ...*clusterv3.Cluster) *Node {
	t.Helper()
	n, err := NewNode(NodeConfig{
		XDS:               xdsclient.Config{Server: srv.Addr, NodeID: xdstest.NodeID},
		BootstrapClusters: bootstrapClusters,
		FreePorts:         true,
		Resolve:           map[string]string{xdstest.EGEPPHost: "127.0.0.1"},
		Timeouts:          Timeouts{Route: 10 * time.Second, Connect: time.Second, Shutdown: time.Second},
		Logger:            logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node: %v", err)
		}
	})
	return n
}

// waitVersion waits until the node ACKed version of typ, failing with the
// NACK reason if it refused it.
func waitVersion(t *testing.T, n *Node, typ, version string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.XDS().WaitVersion(ctx, typ, version); err != nil {
		t.Fatal(err)
	}
}

// listenerURL waits for a listener to serve and returns its base URL.
func listenerURL(t *testing.T, n *Node, name string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if addr, ok := n.ListenerAddr(name); ok {
			return "http://" + addr
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n.XDS() == nil {
		t.Fatalf("listener %q never served", name)
	}
	t.Fatalf("listener %q never served; xDS status %+v", name, n.XDS().Status())
	return ""
}

func get(t *testing.T, url string, kv ...string) (*http.Response, string) {
	t.Helper()
	return send(t, http.MethodPost, url, strings.NewReader(`{"model":"m"}`), kv...)
}

// send makes one request with headers kv (name, value, ...) and returns
// the response and its body.
func send(t *testing.T, method, url string, body io.Reader, kv ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(fakeproc.Ctx(t), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Add(kv[i], kv[i+1])
	}
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// modelHeaderProcessor sets x-gateway-model-name on the request headers and
// asks for the route to be matched again, as the payload processor does.
func modelHeaderProcessor(c *fakeproc.Conn) error {
	for {
		req, err := c.Recv()
		if err != nil {
			return nil
		}
		if req.GetRequestHeaders() != nil {
			cr := &extprocv3.CommonResponse{HeaderMutation: fakeproc.SetHeaders("x-gateway-model-name", "llama"), ClearRouteCache: true}
			if err := c.Send(fakeproc.HeadersResp(false, cr)); err != nil {
				return err
			}
		}
	}
}

func headersOnly() *extprocfilterv3.ProcessingMode {
	return &extprocfilterv3.ProcessingMode{ResponseHeaderMode: extprocfilterv3.ProcessingMode_SKIP}
}

// modelRoutes sends x-gateway-model-name: llama to cluster "llama" and
// everything else to "default".
func modelRoutes() *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{Name: "r", VirtualHosts: []*routev3.VirtualHost{{
		Name: "vh", Domains: []string{"*"},
		Routes: []*routev3.Route{
			{
				Match: &routev3.RouteMatch{
					PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"},
					Headers: []*routev3.HeaderMatcher{{Name: "x-gateway-model-name", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
						StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "llama"}},
					}}},
				},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "llama"}}},
			},
			{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "default"}}},
			},
		},
	}}}
}

// TestRouteRematchedAfterClearRouteCache: the payload processor's model
// header selects the route only because the processor clears the route
// cache; route_cache_action RETAIN keeps the first match.
func TestRouteRematchedAfterClearRouteCache(t *testing.T) {
	payload := fakeproc.Start(t, modelHeaderProcessor)
	llama, other := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	for _, tc := range []struct {
		name   string
		action extprocfilterv3.ExternalProcessor_RouteCacheAction
		want   *fakeproc.Upstream
	}{
		{"DEFAULT honours clear_route_cache", extprocfilterv3.ExternalProcessor_DEFAULT, llama},
		{"RETAIN keeps the first route", extprocfilterv3.ExternalProcessor_RETAIN, other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := xdstest.Start(t)
			ep := xdstest.ExtProc("payload", headersOnly(), false)
			ep.RouteCacheAction = tc.action
			srv.Set(t, "1",
				xdstest.Listener("l", 80, "r", xdstest.HTTPFilter("payload", ep, false)), modelRoutes(),
				xdstest.StaticCluster("payload", payload.Addr),
				xdstest.StaticCluster("llama", llama.Addr), xdstest.StaticCluster("default", other.Addr))
			n := testNode(t, srv)
			resp, body := get(t, listenerURL(t, n, "l")+"/v1/chat/completions")
			if resp.StatusCode != 200 || body != "hello from "+tc.want.Addr {
				t.Fatalf("got %d %q, want the answer of %s", resp.StatusCode, body, tc.want.Addr)
			}
		})
	}
}

// TestClearRouteCacheNeedsAHeaderMutation: Envoy clears the route cache
// only for an answer that carries a header mutation as well
// (DecodingProcessorState::clearRouteCache). One filter sets the model
// header without asking; a second asks with nothing to mutate: the route
// matched before both stays. With the second's answer carrying an (empty)
// mutation, the route is matched again.
func TestClearRouteCacheNeedsAHeaderMutation(t *testing.T) {
	setter := fakeproc.Start(t, func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			if req.GetRequestHeaders() != nil {
				if err := c.Send(fakeproc.HeadersResp(false, &extprocv3.CommonResponse{HeaderMutation: fakeproc.SetHeaders("x-gateway-model-name", "llama")})); err != nil {
					return err
				}
			}
		}
	})
	clearer := func(mutation *extprocv3.HeaderMutation) *fakeproc.Server {
		return fakeproc.Start(t, func(c *fakeproc.Conn) error {
			for {
				req, err := c.Recv()
				if err != nil {
					return nil
				}
				if req.GetRequestHeaders() != nil {
					if err := c.Send(fakeproc.HeadersResp(false, &extprocv3.CommonResponse{HeaderMutation: mutation, ClearRouteCache: true})); err != nil {
						return err
					}
				}
			}
		})
	}
	llama, other := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	for _, tc := range []struct {
		name string
		clr  *fakeproc.Server
		want *fakeproc.Upstream
	}{
		{"clear_route_cache alone", clearer(nil), other},
		{"with an empty header mutation", clearer(&extprocv3.HeaderMutation{}), llama},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := xdstest.Start(t)
			srv.Set(t, "1",
				xdstest.Listener("l", 80, "r",
					xdstest.HTTPFilter("setter", xdstest.ExtProc("setter", headersOnly(), false), false),
					xdstest.HTTPFilter("clearer", xdstest.ExtProc("clearer", headersOnly(), false), false)),
				modelRoutes(),
				xdstest.StaticCluster("setter", setter.Addr), xdstest.StaticCluster("clearer", tc.clr.Addr),
				xdstest.StaticCluster("llama", llama.Addr), xdstest.StaticCluster("default", other.Addr))
			n := testNode(t, srv)
			resp, body := get(t, listenerURL(t, n, "l")+"/v1/chat/completions")
			if resp.StatusCode != 200 || body != "hello from "+tc.want.Addr {
				t.Fatalf("got %d %q, want the answer of %s", resp.StatusCode, body, tc.want.Addr)
			}
		})
	}
}

// TestServedEndpointReachesThePicker: override_host's selected_host_key puts
// the served host in envoy.lb, which the filter forwards on the response
// path (Istio); an ORIGINAL_DST cluster reports nothing (Envoy Gateway).
func TestServedEndpointReachesThePicker(t *testing.T) {
	up := fakeproc.StartUpstream(t, nil)
	epp := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: up.Addr, MetadataDest: up.Addr}))
	pool := xdstest.Pool{Endpoints: []string{up.Addr}, EPP: epp.Addr, ListenerPort: 80}
	for _, tc := range []struct {
		name, listener string
		rs             []proto.Message
		wantServed     string
	}{
		{"Istio override_host", xdstest.IstioListener, xdstest.Istio(pool), up.Addr},
		{"Envoy Gateway ORIGINAL_DST", xdstest.EGListener, xdstest.EnvoyGateway(pool, up.Addr), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := xdstest.Start(t)
			srv.Set(t, "1", tc.rs...)
			n := testNode(t, srv)
			resp, body := get(t, listenerURL(t, n, tc.listener)+"/v1/completions")
			if resp.StatusCode != 200 || resp.Header.Get(UpstreamHeader) != up.Addr {
				t.Fatalf("%d %q via %q", resp.StatusCode, body, resp.Header.Get(UpstreamHeader))
			}
			// The fake picker echoes envoy.lb/x-gateway-destination-endpoint-served.
			if got := resp.Header.Get("x-test-served"); got != tc.wantServed {
				t.Fatalf("picker saw served %q, want %q", got, tc.wantServed)
			}
		})
	}
}

// TestHeadersRemovedBeforeTheHostChoice: Envoy's router applies the
// route's header changes before it chooses the host (router.cc
// Filter::decodeHeaders, Envoy ≥ 1.35): a route that removes the header an
// ORIGINAL_DST cluster reads leaves it no host (503), and the upstream never
// sees the header either way.
func TestHeadersRemovedBeforeTheHostChoice(t *testing.T) {
	a, b := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	epp := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: b.Addr}))
	for _, tc := range []struct {
		name   string
		remove []string
		want   int
	}{
		{"the header kept", nil, 200},
		{"the header removed", []string{wire.DestinationEndpointKey}, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := xdstest.EnvoyGateway(xdstest.Pool{Endpoints: []string{a.Addr, b.Addr}, EPP: epp.Addr, ListenerPort: 80}, a.Addr)
			for _, m := range rs {
				if rc, ok := m.(*routev3.RouteConfiguration); ok {
					rc.VirtualHosts[0].Routes[1].RequestHeadersToRemove = tc.remove
				}
			}
			srv := xdstest.Start(t)
			srv.Set(t, "1", rs...)
			n := testNode(t, srv)
			resp, body := get(t, listenerURL(t, n, xdstest.EGListener)+"/v1/completions")
			if resp.StatusCode != tc.want {
				t.Fatalf("%d %q, want %d", resp.StatusCode, body, tc.want)
			}
			if tc.want == 200 && body != "hello from "+b.Addr {
				t.Fatalf("%q, want the picker's choice %s", body, b.Addr)
			}
		})
	}
}

// TestRouterLocalReplies: a direct response, no route (404), a route to a
// cluster that does not exist (503), weighted clusters (both get traffic),
// and a route on which the picker is disabled.
func TestRouterLocalReplies(t *testing.T) {
	a, b := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	epp := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: a.Addr}))
	disabled := xdstest.Any(&routev3.FilterConfig{Disabled: true})
	rc := &routev3.RouteConfiguration{Name: "r", VirtualHosts: []*routev3.VirtualHost{{
		Name: "vh", Domains: []string{"api.example.com"},
		Routes: []*routev3.Route{
			{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: "/direct"}},
				Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 418}}},
			{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: "/missing"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "nope"}}}},
			{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: "/split"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_WeightedClusters{
					WeightedClusters: &routev3.WeightedCluster{Clusters: []*routev3.WeightedCluster_ClusterWeight{
						{Name: "a", Weight: wrapperspb.UInt32(50)}, {Name: "b", Weight: wrapperspb.UInt32(50)},
					}},
				}}},
				TypedPerFilterConfig: map[string]*anypb.Any{"epp": disabled}},
		},
	}}}
	srv := xdstest.Start(t)
	srv.Set(t, "1",
		xdstest.Listener("l", 80, "r", xdstest.HTTPFilter("epp", xdstest.ExtProc("epp", xdstest.DuplexMode(), false), false)), rc,
		xdstest.StaticCluster("epp", epp.Addr), xdstest.StaticCluster("a", a.Addr), xdstest.StaticCluster("b", b.Addr))
	n := testNode(t, srv)
	base := listenerURL(t, n, "l")
	host := func(path, authority string) (int, string) {
		req, _ := http.NewRequestWithContext(fakeproc.Ctx(t), http.MethodGet, base+path, nil)
		req.Host = authority
		resp, err := httpClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := host("/direct", "api.example.com"); code != 418 {
		t.Errorf("direct response: %d", code)
	}
	if code, _ := host("/direct", "other.example.com"); code != 404 {
		t.Errorf("no virtual host: %d, want 404", code)
	}
	if code, _ := host("/nowhere", "api.example.com"); code != 404 {
		t.Errorf("no route: %d, want 404", code)
	}
	if code, _ := host("/missing", "api.example.com"); code != 503 {
		t.Errorf("missing cluster: %d, want 503", code)
	}
	before := len(epp.Messages())
	seen := map[string]int{}
	for range 40 {
		code, body := host("/split", "api.example.com")
		if code != 200 {
			t.Fatalf("weighted: %d %s", code, body)
		}
		seen[body]++
	}
	if len(seen) != 2 {
		t.Errorf("weighted clusters 50/50 over 40 requests went to %v", seen)
	}
	if after := len(epp.Messages()); after != before {
		t.Fatalf("the picker got %d messages on a route that disables it", after-before)
	}
}

// TestWeightedClusterFilterConfig: a weighted cluster's
// typed_per_filter_config reaches the filters of the requests that take
// it, and a request keeps its cluster when a filter clears the route cache
// (Envoy draws both from the stream id): each pool's picker sees exactly the
// requests that go to its pool, as a rule split between two InferencePools
// needs.
func TestWeightedClusterFilterConfig(t *testing.T) {
	a, b := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	// Each picker names itself in the destination header; the static
	// clusters ignore it, the upstreams show who processed the request.
	pa := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: "picker-a"}))
	pb := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: "picker-b"}))
	idle := &extprocfilterv3.ProcessingMode{RequestHeaderMode: extprocfilterv3.ProcessingMode_SKIP, ResponseHeaderMode: extprocfilterv3.ProcessingMode_SKIP}
	on := xdstest.Any(&extprocfilterv3.ExtProcPerRoute{Override: &extprocfilterv3.ExtProcPerRoute_Overrides{Overrides: &extprocfilterv3.ExtProcOverrides{
		ProcessingMode: xdstest.DuplexMode(),
	}}})
	rc := &routev3.RouteConfiguration{Name: "r", VirtualHosts: []*routev3.VirtualHost{{
		Name: "vh", Domains: []string{"*"},
		Routes: []*routev3.Route{{
			Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_WeightedClusters{
				WeightedClusters: &routev3.WeightedCluster{Clusters: []*routev3.WeightedCluster_ClusterWeight{
					{Name: "a", Weight: wrapperspb.UInt32(70), TypedPerFilterConfig: map[string]*anypb.Any{"pa": on}},
					{Name: "b", Weight: wrapperspb.UInt32(30), TypedPerFilterConfig: map[string]*anypb.Any{"pb": on}},
				}},
			}}},
		}},
	}}}
	srv := xdstest.Start(t)
	srv.Set(t, "1",
		xdstest.Listener("l", 80, "r",
			xdstest.HTTPFilter("pa", xdstest.ExtProc("pa", idle, false), false),
			xdstest.HTTPFilter("pb", xdstest.ExtProc("pb", idle, false), false)),
		rc, xdstest.StaticCluster("pa", pa.Addr), xdstest.StaticCluster("pb", pb.Addr),
		xdstest.StaticCluster("a", a.Addr), xdstest.StaticCluster("b", b.Addr))
	n := testNode(t, srv)
	url := listenerURL(t, n, "l") + "/v1/completions"
	const total = 200
	hits := map[string]int{}
	for range total {
		resp, body := get(t, url)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		up, want := a, "picker-a"
		if body == "hello from "+b.Addr {
			up, want = b, "picker-b"
		}
		h, _ := up.Last()
		if got := h.Get(wire.DestinationEndpointKey); got != want {
			t.Fatalf("a request to %s was processed by %q, want %q alone", up.Addr, got, want)
		}
		hits[want]++
	}
	// 70/30 over 200 requests: 4.5 sigma is ±0.146.
	if share := float64(hits["picker-a"]) / total; share < 0.55 || share > 0.85 {
		t.Fatalf("split %v, want about 70/30", hits)
	}
}

// TestListenersFollowUpdates: a listener that leaves LDS stops serving, a
// new one starts, and a cluster update reaches a listener in place.
func TestListenersFollowUpdates(t *testing.T) {
	a, b := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	routes := func(name string) *routev3.RouteConfiguration {
		return xdstest.CatchAllRoutes(name, "up")
	}
	srv := xdstest.Start(t)
	srv.Set(t, "1", xdstest.Listener("one", 80, "r1"), routes("r1"), xdstest.StaticCluster("up", a.Addr))
	n := testNode(t, srv)
	one := listenerURL(t, n, "one")
	if _, body := get(t, one+"/"); body != "hello from "+a.Addr {
		t.Fatalf("v1: %q", body)
	}
	srv.Set(t, "2", xdstest.Listener("two", 81, "r2"), routes("r2"), xdstest.StaticCluster("up", b.Addr))
	waitVersion(t, n, xdsclient.ListenerType, "2")
	two := listenerURL(t, n, "two")
	if _, body := get(t, two+"/"); body != "hello from "+b.Addr {
		t.Fatalf("v2: %q", body)
	}
	if _, ok := n.ListenerAddr("one"); ok {
		t.Fatal("listener one still registered after it left LDS")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := httpClient().Get(one + "/")
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("listener one still answers after it left LDS")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestUnsupportedUpdateKeepsTheLastGoodConfig: a NACKed cluster update
// leaves the node serving what it had, and names the field.
func TestUnsupportedUpdateKeepsTheLastGoodConfig(t *testing.T) {
	a := fakeproc.StartUpstream(t, nil)
	routes := xdstest.CatchAllRoutes("r", "up")
	srv := xdstest.Start(t)
	srv.Set(t, "1", xdstest.Listener("l", 80, "r"), routes, xdstest.StaticCluster("up", a.Addr))
	n := testNode(t, srv)
	base := listenerURL(t, n, "l")
	bad := xdstest.StaticCluster("up", a.Addr)
	bad.LbPolicy = clusterv3.Cluster_MAGLEV
	srv.Set(t, "2", xdstest.Listener("l", 80, "r"), routes, bad)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var nack *xdsclient.NACKError
	if err := n.XDS().WaitVersion(ctx, xdsclient.ClusterType, "2"); !errors.As(err, &nack) || !strings.Contains(nack.Message, "MAGLEV") {
		t.Fatalf("want a NACK naming MAGLEV, got %v", err)
	}
	if resp, body := get(t, base+"/"); resp.StatusCode != 200 || body != "hello from "+a.Addr {
		t.Fatalf("after the NACK: %d %q", resp.StatusCode, body)
	}
}

// TestUpdateAppliedInPart: as Envoy, a CDS or LDS update with one resource
// the node cannot build rejects that resource alone: the rest is applied,
// the bad one keeps the version the node had (or stays out), and the
// update is NACKed naming it.
func TestUpdateAppliedInPart(t *testing.T) {
	a, b := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	routes := xdstest.CatchAllRoutes("r", "up")
	maglev := func(name, ep string) *clusterv3.Cluster {
		c := xdstest.StaticCluster(name, ep)
		c.LbPolicy = clusterv3.Cluster_MAGLEV
		return c
	}
	unbuildable := xdstest.Listener("l3", 82, "r", xdstest.HTTPFilter("envoy.filters.http.lua", &structpb.Struct{}, false))
	for _, tc := range []struct {
		name   string
		v2     []proto.Message
		typ    string
		nack   string                        // what the NACK names
		want   map[string]*fakeproc.Upstream // who answers on each listener after it
		absent string                        // a listener that must not be there
	}{
		{name: "cluster", typ: xdsclient.ClusterType,
			// up moves to b, broken is refused: up's move still happens.
			v2:   []proto.Message{xdstest.Listener("l", 80, "r"), routes, xdstest.StaticCluster("up", b.Addr), maglev("broken", a.Addr)},
			nack: `cluster "broken"`, want: map[string]*fakeproc.Upstream{"l": b}},
		{name: "cluster kept at its last version", typ: xdsclient.ClusterType,
			// up turns bad and keeps serving a; l2 and its cluster come.
			v2: []proto.Message{xdstest.Listener("l", 80, "r"), xdstest.Listener("l2", 81, "r2"), routes,
				xdstest.CatchAllRoutes("r2", "other"), maglev("up", b.Addr), xdstest.StaticCluster("other", b.Addr)},
			nack: `cluster "up"`, want: map[string]*fakeproc.Upstream{"l": a, "l2": b}},
		{name: "listener", typ: xdsclient.ListenerType,
			v2: []proto.Message{xdstest.Listener("l", 80, "r"), xdstest.Listener("l2", 81, "r2"), unbuildable, routes,
				xdstest.CatchAllRoutes("r2", "other"), xdstest.StaticCluster("up", a.Addr), xdstest.StaticCluster("other", b.Addr)},
			nack: `listener "l3"`, want: map[string]*fakeproc.Upstream{"l": a, "l2": b}, absent: "l3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := xdstest.Start(t)
			srv.Set(t, "1", xdstest.Listener("l", 80, "r"), routes, xdstest.StaticCluster("up", a.Addr))
			n := testNode(t, srv)
			listenerURL(t, n, "l")
			srv.Set(t, "2", tc.v2...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var nack *xdsclient.NACKError
			if err := n.XDS().WaitVersion(ctx, tc.typ, "2"); !errors.As(err, &nack) || !strings.Contains(nack.Message, tc.nack) {
				t.Fatalf("want a NACK naming %s, got %v", tc.nack, err)
			}
			for l, up := range tc.want {
				if resp, body := get(t, listenerURL(t, n, l)+"/"); resp.StatusCode != 200 || body != "hello from "+up.Addr {
					t.Fatalf("%s after the update: %d %q, want %s's answer", l, resp.StatusCode, body, up.Addr)
				}
			}
			if _, ok := n.ListenerAddr(tc.absent); tc.absent != "" && ok {
				t.Fatalf("the refused listener %s serves", tc.absent)
			}
		})
	}
}

// TestListenerThatCannotBindIsNACKed: Envoy rejects an LDS update whose
// listener cannot bind its port.
func TestListenerThatCannotBindIsNACKed(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := uint32(taken.Addr().(*net.TCPAddr).Port)
	a := fakeproc.StartUpstream(t, nil)
	routes := xdstest.CatchAllRoutes("r", "up")
	srv := xdstest.Start(t)
	srv.Set(t, "1", xdstest.Listener("l", port, "r"), routes, xdstest.StaticCluster("up", a.Addr))
	n, err := NewNode(NodeConfig{
		XDS:      xdsclient.Config{Server: srv.Addr, NodeID: xdstest.NodeID},
		Timeouts: Timeouts{Shutdown: time.Second},
		Logger:   logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	defer func() { cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	var nack *xdsclient.NACKError
	if err := n.XDS().WaitVersion(wctx, xdsclient.ListenerType, "1"); !errors.As(err, &nack) || !strings.Contains(nack.Message, "binding port") {
		t.Fatalf("want an LDS NACK for the port in use, got %v", err)
	}
	if _, ok := n.ListenerAddr("l"); ok {
		t.Fatal("a listener that could not bind is registered")
	}
}

// offlineNode is a node with no xDS server (Run only owns the listeners'
// lifetime) and apply, which hands it resources as an update would.
func offlineNode(t *testing.T) (*Node, func(typ string, ms ...proto.Message)) {
	t.Helper()
	n, err := NewNode(NodeConfig{
		XDS: xdsclient.Config{Server: "127.0.0.1:1", NodeID: "n"}, FreePorts: true,
		Timeouts: Timeouts{Shutdown: time.Second}, Logger: logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return n, func(typ string, ms ...proto.Message) {
		t.Helper()
		var rs []*anypb.Any
		for _, m := range ms {
			rs = append(rs, xdstest.Any(m))
		}
		if err := n.Apply(context.Background(), typ, "v", rs); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWarmingListener: a listener whose route configuration has not arrived
// holds its port but does not serve; once RDS delivers it, it serves; an
// RDS update that drops it leaves the listener serving its last table.
func TestWarmingListener(t *testing.T) {
	a := fakeproc.StartUpstream(t, nil)
	n, apply := offlineNode(t)
	routes := xdstest.CatchAllRoutes("r", "up")
	apply(xdsclient.ClusterType, xdstest.StaticCluster("up", a.Addr))
	apply(xdsclient.ListenerType, xdstest.Listener("l", 80, "r"))
	if _, ok := n.ListenerAddr("l"); ok {
		t.Fatal("a listener without its routes serves")
	}
	if n.warming["l"] == nil {
		t.Fatal("the warming listener holds no socket")
	}
	apply(xdsclient.RouteType, routes)
	base := listenerURL(t, n, "l")
	if _, body := get(t, base+"/"); body != "hello from "+a.Addr {
		t.Fatalf("after RDS: %q", body)
	}
	apply(xdsclient.RouteType)
	if _, body := get(t, base+"/"); body != "hello from "+a.Addr {
		t.Fatalf("after its RDS went away the listener should keep its table: %q", body)
	}
}

// TestEndpointsFromAnotherEDSServer: a cluster whose eds_config is an
// api_config_source gets its endpoints from that server over its own EDS
// stream, and follows its updates, when the source is one Envoy accepts: a
// static non-EDS cluster of the bootstrap, or a google_grpc channel. One
// that names a cluster CDS sent is NACKed with Envoy's message
// (utility.cc Utility::validateClusterName).
func TestEndpointsFromAnotherEDSServer(t *testing.T) {
	a, b := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	for _, tc := range []struct {
		name      string
		pool      func(side string) *clusterv3.Cluster
		cds       func(side string) []proto.Message // clusters CDS sends beside the pool's
		bootstrap func(side string) []*clusterv3.Cluster
		nack      string
	}{
		{
			name: "bootstrap cluster",
			pool: func(string) *clusterv3.Cluster { return xdstest.EDSClusterFrom("pool-cluster", "pool", "eds-server") },
			bootstrap: func(side string) []*clusterv3.Cluster {
				return []*clusterv3.Cluster{xdstest.StaticCluster("eds-server", side)}
			},
		},
		{
			name: "google_grpc",
			pool: func(side string) *clusterv3.Cluster {
				return xdstest.EDSClusterFromGoogleGrpc("pool-cluster", "pool", side)
			},
		},
		{
			name: "cluster sent over CDS",
			pool: func(string) *clusterv3.Cluster { return xdstest.EDSClusterFrom("pool-cluster", "pool", "eds-server") },
			cds:  func(side string) []proto.Message { return []proto.Message{xdstest.StaticCluster("eds-server", side)} },
			nack: "must have a statically defined non-EDS cluster: 'eds-server' does not exist, was added via api, or is an EDS cluster",
		},
		{
			name: "EDS cluster of the bootstrap",
			pool: func(string) *clusterv3.Cluster { return xdstest.EDSClusterFrom("pool-cluster", "pool", "eds-server") },
			bootstrap: func(side string) []*clusterv3.Cluster {
				return []*clusterv3.Cluster{xdstest.EDSCluster("eds-server")}
			},
			nack: "must have a statically defined non-EDS cluster: 'eds-server'",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			side := xdstest.Start(t)
			side.SetEndpoints(t, "1", xdstest.Assignment("pool", a.Addr))
			rs := []proto.Message{xdstest.Listener("l", 80, "r"), xdstest.CatchAllRoutes("r", "pool-cluster"), tc.pool(side.Addr)}
			if tc.cds != nil {
				rs = append(rs, tc.cds(side.Addr)...)
			}
			var bs []*clusterv3.Cluster
			if tc.bootstrap != nil {
				bs = tc.bootstrap(side.Addr)
			}
			srv := xdstest.Start(t)
			srv.SetExternalEDS(t, "1", rs...)
			n := testNode(t, srv, bs...)
			if tc.nack != "" {
				deadline := time.Now().Add(10 * time.Second)
				for {
					st := n.XDS().Status()[xdsclient.ClusterType]
					if st.RejectedVersion == "1" {
						if !strings.Contains(st.LastError, tc.nack) {
							t.Fatalf("NACK %q does not say %q", st.LastError, tc.nack)
						}
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("the clusters were not NACKed: %+v", st)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			base := listenerURL(t, n, "l")
			waitBody := func(want string) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for {
					_, body := get(t, base+"/")
					if body == want {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("got %q, want %q; xDS %+v", body, want, n.XDS().Status())
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			waitBody("hello from " + a.Addr)
			side.SetEndpoints(t, "2", xdstest.Assignment("pool", b.Addr))
			waitBody("hello from " + b.Addr)
		})
	}
}

// TestEDSClusterWarms: a listener whose route goes to an EDS cluster does
// not start serving before that cluster's first load assignment arrives
// (Envoy warms the cluster), and serves once it does.
func TestEDSClusterWarms(t *testing.T) {
	a := fakeproc.StartUpstream(t, nil)
	n, apply := offlineNode(t)
	routes := xdstest.CatchAllRoutes("r", "pool")
	apply(xdsclient.ClusterType, xdstest.EDSCluster("pool"))
	apply(xdsclient.ListenerType, xdstest.Listener("l", 80, "r"))
	apply(xdsclient.RouteType, routes)
	if _, ok := n.ListenerAddr("l"); ok {
		t.Fatal("the listener serves while its cluster still waits for its endpoints")
	}
	apply(xdsclient.EndpointType, xdstest.Assignment("pool", a.Addr))
	if _, body := get(t, listenerURL(t, n, "l")+"/"); body != "hello from "+a.Addr {
		t.Fatalf("after EDS: %q", body)
	}
}

// TestClusterWarmsAlone: once the node has initialized, a cluster that
// warms holds back only itself, as Envoy warms cluster by cluster: a new
// one is not there (its routes answer 503 cluster_not_found) while the
// rest of the node takes updates, an updated one serves at its old
// version, and each is put in use when its load assignment arrives.
func TestClusterWarmsAlone(t *testing.T) {
	up1, up2, up3 := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	n, apply := offlineNode(t)
	prefix := func(p, cluster string) *routev3.Route {
		return &routev3.Route{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: p}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}}}
	}
	apply(xdsclient.ClusterType, xdstest.EDSCluster("a"))
	apply(xdsclient.ListenerType, xdstest.Listener("l", 80, "r"))
	apply(xdsclient.RouteType, &routev3.RouteConfiguration{Name: "r", VirtualHosts: []*routev3.VirtualHost{{
		Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{prefix("/a", "a"), prefix("/b", "b")}}}})
	apply(xdsclient.EndpointType, xdstest.Assignment("a", up1.Addr))
	base := listenerURL(t, n, "l")
	expect := func(path string, status int, from *fakeproc.Upstream) {
		t.Helper()
		resp, body := get(t, base+path)
		want := "any body"
		if from != nil {
			want = "hello from " + from.Addr
		}
		if resp.StatusCode != status || (from != nil && body != want) {
			t.Fatalf("%s: %d %q, want %d %q", path, resp.StatusCode, body, status, want)
		}
	}
	expect("/a", 200, up1)

	// b is new and warms: /b finds no cluster, and a's new endpoint is in
	// use at once.
	apply(xdsclient.ClusterType, xdstest.EDSCluster("a"), xdstest.EDSCluster("b"))
	apply(xdsclient.EndpointType, xdstest.Assignment("a", up2.Addr))
	expect("/a", 200, up2)
	expect("/b", 503, nil)
	apply(xdsclient.EndpointType, xdstest.Assignment("b", up3.Addr))
	expect("/b", 200, up3)

	// a changes to a load assignment that has not come: it serves at its
	// version in use until that arrives.
	a2 := xdstest.EDSCluster("a")
	a2.EdsClusterConfig.ServiceName = "a2"
	apply(xdsclient.ClusterType, a2, xdstest.EDSCluster("b"))
	expect("/a", 200, up2)
	apply(xdsclient.EndpointType, xdstest.Assignment("a2", up1.Addr))
	expect("/a", 200, up1)
}

// TestStreamIdleTimeout: the connection manager's stream_idle_timeout ends
// a request with no activity for that long: before the response started
// with Envoy's "stream timeout", 504 once the whole request was received
// and 408 while its body is still due; after it by resetting the stream; a
// response that keeps sending is not idle however long it runs
// (conn_manager_impl.cc ActiveStream::onIdleTimeout, utility.cc
// Utility::maybeRequestTimeoutCode).
func TestStreamIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	for _, tc := range []struct {
		name     string
		upstream http.HandlerFunc
		stalled  bool // the client sends part of a body and stops
		// routeIdle is the route's idle_timeout, which replaces the
		// connection manager's (conn_manager_impl.cc
		// ActiveStream::refreshIdleTimeout); nil: unset.
		routeIdle *durationpb.Duration
		want      int  // status; 0: the stream is reset
		wantBody  bool // the whole body arrives
	}{
		{name: "silent before the response", want: http.StatusGatewayTimeout, upstream: func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(3 * idle)
		}},
		{name: "request body stalled", stalled: true, want: http.StatusRequestTimeout, upstream: func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
		}},
		{name: "a route's longer idle_timeout", routeIdle: durationpb.New(10 * idle), want: http.StatusOK, upstream: func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(3 * idle)
		}},
		{name: "a route's idle_timeout 0", routeIdle: durationpb.New(0), want: http.StatusOK, upstream: func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(3 * idle)
		}},
		{name: "a route's shorter idle_timeout", routeIdle: durationpb.New(idle / 3), want: http.StatusGatewayTimeout, upstream: func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(idle)
		}},
		{name: "silent after the response started", want: 0, upstream: func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("data: 1\n\n"))
			w.(http.Flusher).Flush()
			time.Sleep(3 * idle)
		}},
		{name: "streaming longer than the timeout", want: http.StatusOK, wantBody: true, upstream: func(w http.ResponseWriter, r *http.Request) {
			for range 8 {
				_, _ = w.Write([]byte("data: x\n\n"))
				w.(http.Flusher).Flush()
				time.Sleep(idle / 3)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := fakeproc.StartUpstream(t, tc.upstream)
			l := xdstest.Listener("l", 80, "r")
			hcm := &hcmv3.HttpConnectionManager{}
			if err := l.FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
				t.Fatal(err)
			}
			hcm.StreamIdleTimeout = durationpb.New(idle)
			l.FilterChains[0].Filters[0].ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: xdstest.Any(hcm)}
			srv := xdstest.Start(t)
			rc := xdstest.CatchAllRoutes("r", "up")
			rc.VirtualHosts[0].Routes[0].GetRoute().IdleTimeout = tc.routeIdle
			srv.Set(t, "1", l, rc, xdstest.StaticCluster("up", up.Addr))
			n := testNode(t, srv)
			req, err := http.NewRequest(http.MethodGet, listenerURL(t, n, "l")+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.stalled {
				pr, pw := io.Pipe()
				t.Cleanup(func() { _ = pw.Close() })
				go func() { _, _ = pw.Write([]byte(`{"model":`)) }()
				req.Method, req.Body = http.MethodPost, pr
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, readErr := io.ReadAll(resp.Body)
			switch {
			case tc.want == 0:
				if readErr == nil {
					t.Fatalf("the stream was not reset: %d %q", resp.StatusCode, body)
				}
			case resp.StatusCode != tc.want:
				t.Fatalf("status %d (%q), want %d", resp.StatusCode, body, tc.want)
			case (tc.want == http.StatusRequestTimeout || tc.want == http.StatusGatewayTimeout) && string(body) != "stream timeout":
				t.Fatalf("body %q, want Envoy's \"stream timeout\"", body)
			case tc.wantBody && (readErr != nil || strings.Count(string(body), "data: x") != 8):
				t.Fatalf("body %q (%v), want all 8 events", body, readErr)
			}
		})
	}
}

// TestHealthCheckedProcessorCluster: a picker's cluster with gRPC health
// checks whose one host is down. With healthy_panic_threshold 0 the
// cluster has no healthy host, the stream fails at its start and FailOpen
// lets a POST through to the pool; with Envoy's default threshold (50%)
// the cluster is in panic, the dead host is used, the connection fails
// after the body reached the filter and the answer is 500. A host that
// answers SERVING is used.
func TestHealthCheckedProcessorCluster(t *testing.T) {
	up := fakeproc.StartUpstream(t, nil)
	live := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: up.Addr}))
	for _, tc := range []struct {
		name   string
		picker string
		panic  *typev3.Percent
		want   int
	}{
		{"down, panic 0", fakeproc.ClosedAddr(t), &typev3.Percent{Value: 0}, 200},
		{"down, Envoy's default panic threshold", fakeproc.ClosedAddr(t), nil, 500},
		{"up", live.Addr, &typev3.Percent{Value: 0}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			epp := xdstest.StaticCluster("epp", tc.picker)
			epp.HealthChecks = []*corev3.HealthCheck{{
				Timeout: durationpb.New(time.Second), Interval: durationpb.New(time.Second),
				UnhealthyThreshold: wrapperspb.UInt32(2), HealthyThreshold: wrapperspb.UInt32(1),
				HealthChecker: &corev3.HealthCheck_GrpcHealthCheck_{GrpcHealthCheck: &corev3.HealthCheck_GrpcHealthCheck{ServiceName: wire.ExtProcHealthService}},
			}}
			epp.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: tc.panic}
			srv := xdstest.Start(t)
			srv.Set(t, "1",
				xdstest.Listener("l", 80, "r", xdstest.HTTPFilter("epp", xdstest.ExtProc("epp", xdstest.DuplexMode(), true), false)),
				xdstest.CatchAllRoutes("r", "pool"), xdstest.StaticCluster("pool", up.Addr), epp)
			n := testNode(t, srv)
			resp, err := http.Post(listenerURL(t, n, "l")+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%d %q, want %d", resp.StatusCode, body, tc.want)
			}
		})
	}
}

// TestProcessorWithoutGRPCHealth: a picker that serves ext_proc alone (as
// GAIE's and llm-d's do unless run with --health-checking) answers a gRPC
// health check UNIMPLEMENTED, an active failure, so its host never becomes
// healthy and a FailClose filter answers 500; a connect-only TCP check
// (reuse_connection false) finds it up and requests go through it. A TCP
// check that would reuse its connection is NACKed.
func TestProcessorWithoutGRPCHealth(t *testing.T) {
	up := fakeproc.StartUpstream(t, nil)
	picker := fakeproc.StartWithoutHealth(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: up.Addr}))
	grpcCheck := &corev3.HealthCheck_GrpcHealthCheck_{GrpcHealthCheck: &corev3.HealthCheck_GrpcHealthCheck{ServiceName: wire.ExtProcHealthService}}
	tcpCheck := &corev3.HealthCheck_TcpHealthCheck_{TcpHealthCheck: &corev3.HealthCheck_TcpHealthCheck{}}
	for _, tc := range []struct {
		name    string
		checker any
		reuse   *wrapperspb.BoolValue
		want    int // 0: the update is NACKed
	}{
		{"gRPC check", grpcCheck, wrapperspb.Bool(false), 500},
		{"connect-only TCP check", tcpCheck, wrapperspb.Bool(false), 200},
		{"TCP check reusing its connection", tcpCheck, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			epp := xdstest.StaticCluster("epp", picker.Addr)
			hc := &corev3.HealthCheck{
				Timeout: durationpb.New(time.Second), Interval: durationpb.New(200 * time.Millisecond),
				NoTrafficInterval:  durationpb.New(200 * time.Millisecond),
				UnhealthyThreshold: wrapperspb.UInt32(2), HealthyThreshold: wrapperspb.UInt32(1), ReuseConnection: tc.reuse,
			}
			switch c := tc.checker.(type) {
			case *corev3.HealthCheck_GrpcHealthCheck_:
				hc.HealthChecker = c
			case *corev3.HealthCheck_TcpHealthCheck_:
				hc.HealthChecker = c
			}
			epp.HealthChecks = []*corev3.HealthCheck{hc}
			epp.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{Value: 0}}
			srv := xdstest.Start(t)
			srv.Set(t, "1",
				xdstest.Listener("l", 80, "r", xdstest.HTTPFilter("epp", xdstest.ExtProc("epp", xdstest.DuplexMode(), false), false)),
				xdstest.CatchAllRoutes("r", "pool"), xdstest.StaticCluster("pool", up.Addr), epp)
			n := testNode(t, srv)
			if tc.want == 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				var nack *xdsclient.NACKError
				if err := n.XDS().WaitVersion(ctx, xdsclient.ClusterType, "1"); !errors.As(err, &nack) || !strings.Contains(nack.Message, "reuse_connection") {
					t.Fatalf("want a NACK naming reuse_connection, got %v", err)
				}
				return
			}
			resp, err := http.Post(listenerURL(t, n, "l")+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%d %q, want %d", resp.StatusCode, body, tc.want)
			}
		})
	}
}
