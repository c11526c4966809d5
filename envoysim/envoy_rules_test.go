package envoysim

import (
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	healthcheckv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/health_check/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	ringhashv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/envoysim/xdstest"
	"github.com/infergate/infergate/inference/wire"
)

// Rules where a first reading of the protos gets Envoy wrong; each case
// names the Envoy source it follows.

// TestPerRouteConfigsMerge: ext_proc merges ExtProcPerRoute from the route
// configuration, virtual host and route field by field (ext_proc.cc
// FilterConfigPerRoute(less_specific, more_specific)); a metadata_options
// override replaces only the namespace lists it carries.
func TestPerRouteConfigsMerge(t *testing.T) {
	env := xbEnv(t, xbResolve)
	rcCfg := prOverrides(&extprocfilterv3.ExtProcOverrides{GrpcService: xbGrpc("epp-rc")})
	routeCfg := prOverrides(&extprocfilterv3.ExtProcOverrides{
		ProcessingMode:  xdstest.DuplexMode(),
		MetadataOptions: &extprocfilterv3.MetadataOptions{ReceivingNamespaces: &extprocfilterv3.MetadataOptions_MetadataNamespaces{Untyped: []string{"x"}}},
	})
	tb := xbBuildOne(t, prResources(t, false, false, rcCfg, nil, routeCfg), env)
	cfg := xbRoute(t, tb, "target").filters[0].Config()
	if cfg.Target != prClusters["epp-rc"] {
		t.Errorf("grpc_service from the route configuration lost: target %s", cfg.Target)
	}
	if cfg.ProcessingMode.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		t.Errorf("processing_mode from the route lost: %v", cfg.ProcessingMode)
	}
	if got := cfg.MetadataOptions; len(got.Receiving) != 1 || got.Receiving[0] != "x" || len(got.Forwarding) != 1 || got.Forwarding[0] != wire.LBNamespace {
		t.Errorf("metadata options %+v: want receiving [x], forwarding kept [envoy.lb]", got)
	}
	if plain := xbRoute(t, tb, "plain").filters[0].Config(); plain.Target != prClusters["epp-rc"] ||
		plain.ProcessingMode.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_NONE {
		t.Errorf("a route with only the route configuration's override: %+v", plain)
	}
}

// TestFilterConfigWrapper: an empty FilterConfig is rejected ("Empty
// route/virtual host per filter configuration", per_filter_config.cc); one
// whose config is an empty Any enables the filter with its listener config.
func TestFilterConfigWrapper(t *testing.T) {
	env := xbEnv(t, xbResolve)
	if _, err := build(prResources(t, true, false, nil, nil, &routev3.FilterConfig{}), env); err == nil ||
		!strings.Contains(err.Error(), "empty FilterConfig") {
		t.Fatalf("empty FilterConfig: %v", err)
	}
	tb := xbBuildOne(t, prResources(t, true, false, nil, nil, &routev3.FilterConfig{Config: &anypb.Any{}}), env)
	target := xbRoute(t, tb, "target")
	if !tb.inChain(target, 0) || target.filters[0] != tb.filters[0].client {
		t.Fatal("FilterConfig{config: {}} did not enable the filter with its listener config")
	}
	if tb.inChain(xbRoute(t, tb, "plain"), 0) {
		t.Fatal("a route without per-route config enabled a disabled filter")
	}
	if _, err := build(prResources(t, false, false, nil, nil, &extprocfilterv3.ExtProcPerRoute{}), env); err == nil ||
		!strings.Contains(err.Error(), "disabled: true or overrides") {
		t.Fatalf("ExtProcPerRoute{}: %v", err)
	}
}

// TestPerRouteConfigOfPassThroughFilter: a CORS policy on a route would make
// Envoy answer preflight requests itself, which the stand-in does not do.
func TestPerRouteConfigOfPassThroughFilter(t *testing.T) {
	r := xbResources(t, xdstest.EnvoyGateway(xbPool, xbOther)...)
	xbEditHCM(t, r.listeners[xdstest.EGListener], func(h *hcmv3.HttpConnectionManager) {
		h.HttpFilters = append([]*hcmv3.HttpFilter{xdstest.HTTPFilter("envoy.filters.http.cors", &corsv3.Cors{}, false)}, h.HttpFilters...)
	})
	xbEGPoolRoute(r).TypedPerFilterConfig["envoy.filters.http.cors"] = xdstest.Any(&corsv3.CorsPolicy{})
	if _, err := build(r, xbEnv(t, xbResolve)); err == nil || !strings.Contains(err.Error(), `typed_per_filter_config["envoy.filters.http.cors"]`) {
		t.Fatalf("per-route CORS policy: %v", err)
	}
}

// TestLoadBalancingPolicyFirstWins: Envoy uses the first policy it
// supports; the stand-in may not skip one it does not reproduce.
func TestLoadBalancingPolicyFirstWins(t *testing.T) {
	r := xbResources(t, xdstest.EnvoyGateway(xbPool, xbOther)...)
	r.clusters[xdstest.EGOtherCluster].LoadBalancingPolicy = &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{
		{TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "ring_hash", TypedConfig: xdstest.Any(&ringhashv3.RingHash{})}},
		{TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "round_robin", TypedConfig: xdstest.Any(&roundrobinv3.RoundRobin{})}},
	}}
	if _, err := build(r, xbEnv(t, xbResolve)); err == nil || !strings.Contains(err.Error(), "RingHash") {
		t.Fatalf("ring_hash before round_robin: %v", err)
	}
}

// TestZeroWrapperIsNotDefault: a wrapper set to its zero value is a setting
// when the default is not zero: bind_to_port false means "do not bind".
func TestZeroWrapperIsNotDefault(t *testing.T) {
	r := xbResources(t, xdstest.EnvoyGateway(xbPool, xbOther)...)
	r.listeners[xdstest.EGListener].BindToPort = wrapperspb.Bool(false)
	if _, err := build(r, xbEnv(t, xbResolve)); err == nil || !strings.Contains(err.Error(), "bind_to_port") {
		t.Fatalf("bind_to_port false: %v", err)
	}
}

// TestHostSourcesReadAsEnvoyDoes: override_host reads the first instance of
// its header and only a string metadata value (override_host
// load_balancer.cc); ORIGINAL_DST tries metadata_key, then the header, and
// takes the first element of a metadata list (original_dst_cluster.cc);
// override_host accepts a host of any priority.
func TestHostSourcesReadAsEnvoyDoes(t *testing.T) {
	a, b, c := "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
	key := &metadataKey{namespace: wire.LBNamespace, path: []string{wire.DestinationEndpointKey}}
	list := func(vals ...any) map[string]*structpb.Struct {
		lv, _ := structpb.NewList(vals)
		return map[string]*structpb.Struct{wire.LBNamespace: {Fields: map[string]*structpb.Value{wire.DestinationEndpointKey: structpb.NewListValue(lv)}}}
	}
	override := &cluster{name: "oh", endpoints: []string{a}, members: map[string]bool{a: true, b: true, c: true},
		override: &overrideHost{sources: []hostSource{{md: key}, {header: "x-dst"}}}}
	od := &cluster{name: "od", originalDst: &originalDst{md: key, header: "x-dst"}}
	for _, tc := range []struct {
		name string
		cl   *cluster
		h    extprocfilter.Headers
		md   map[string]*structpb.Struct
		want string
	}{
		{"override_host: first header instance only", override, extprocfilter.Headers{{Key: "x-dst", Value: "10.9.9.9:1"}, {Key: "x-dst", Value: b}}, nil, a},
		{"override_host: a metadata list is not a host", override, nil, list(b), a},
		{"override_host: a host of a lower priority", override, extprocfilter.Headers{{Key: "x-dst", Value: c}}, nil, c},
		{"ORIGINAL_DST: header when metadata is absent", od, extprocfilter.Headers{{Key: "x-dst", Value: b}}, nil, b},
		{"ORIGINAL_DST: first element of a metadata list", od, nil, list(c, b), c},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.cl.targets(tc.h, tc.md)
			if err != nil || len(got) != 1 || got[0] != tc.want {
				t.Fatalf("targets %v, %v; want [%s]", got, err, tc.want)
			}
		})
	}
	// Members of every priority come from the load assignment.
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: "x", Endpoints: []*endpointv3.LocalityLbEndpoints{
		{LbEndpoints: xdstest.Assignment("x", a).Endpoints[0].LbEndpoints},
		{Priority: 1, LbEndpoints: xdstest.Assignment("x", c).Endpoints[0].LbEndpoints},
	}}
	as, err := clusterEndpoints(cla, &transportSelector{}, xbEnv(t, xbResolve), 0)
	eps, members := as.endpoints, as.members
	if err != nil || len(eps) != 1 || eps[0] != a || !members[c] {
		t.Fatalf("endpoints %v members %v: %v", eps, members, err)
	}
}

// TestFilterChainFromTheFirstRoute: Envoy builds a request's filter chain
// from the route it first matches; a re-match after clear_route_cache
// changes per-route configs, not which filters run (see the note on
// FilterConfig.disabled in route_components.proto).
func TestFilterChainFromTheFirstRoute(t *testing.T) {
	payload := fakeproc.Start(t, modelHeaderProcessor)
	epp := fakeproc.Start(t, func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			if req.GetRequestHeaders() != nil {
				cr := &extprocv3.CommonResponse{HeaderMutation: fakeproc.SetHeaders("x-picker-ran", "yes")}
				if err := c.Send(fakeproc.HeadersResp(false, cr)); err != nil {
					return err
				}
			}
		}
	})
	up := fakeproc.StartUpstream(t, nil)
	rc := modelRoutes()
	// The llama route enables the listener-disabled picker.
	rc.VirtualHosts[0].Routes[0].TypedPerFilterConfig = map[string]*anypb.Any{"epp": xdstest.Any(&routev3.FilterConfig{Config: &anypb.Any{}})}
	srv := xdstest.Start(t)
	srv.Set(t, "1",
		xdstest.Listener("l", 80, "r",
			xdstest.HTTPFilter("payload", xdstest.ExtProc("payload", headersOnly(), false), false),
			xdstest.HTTPFilter("epp", xdstest.ExtProc("epp", headersOnly(), false), true)),
		rc, xdstest.StaticCluster("payload", payload.Addr), xdstest.StaticCluster("epp", epp.Addr),
		xdstest.StaticCluster("llama", up.Addr), xdstest.StaticCluster("default", up.Addr))
	n := testNode(t, srv)
	base := listenerURL(t, n, "l")
	// Starts on the default route; the payload filter re-matches it to llama.
	if resp, _ := get(t, base+"/v1/completions"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if h, _ := up.Last(); h.Get("x-picker-ran") != "" {
		t.Fatal("a filter enabled only on the re-matched route ran")
	}
	// Starting on the llama route, the picker is in the chain.
	if resp, _ := get(t, base+"/v1/completions", "x-gateway-model-name", "llama"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if h, _ := up.Last(); h.Get("x-picker-ran") != "yes" {
		t.Fatal("the picker did not run on the route that enables it")
	}
}

// TestConfigsEnvoyRejects: settings Envoy itself refuses are NACKed too.
func TestConfigsEnvoyRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(r *resources)
		want   string
	}{
		{"a domain in two virtual hosts", func(r *resources) {
			rc := r.routes[xdstest.EGRoutes]
			rc.VirtualHosts = append(rc.VirtualHosts, &routev3.VirtualHost{Name: "dup", Domains: []string{"*"}})
		}, `domain "*" is also in virtual host`},
		{"disable_clear_route_cache with route_cache_action", func(r *resources) {
			xbEditExtProc(t, r.listeners[xdstest.EGListener], func(ep *extprocfilterv3.ExternalProcessor) {
				ep.DisableClearRouteCache = true
				ep.RouteCacheAction = extprocfilterv3.ExternalProcessor_CLEAR
			})
		}, "only one of disable_clear_route_cache and route_cache_action"},
		{"ORIGINAL_DST with a load assignment", func(r *resources) {
			r.clusters[xdstest.EGRouteCluster].LoadAssignment = xdstest.Assignment(xdstest.EGRouteCluster, "127.0.0.1:8000")
		}, "ORIGINAL_DST clusters take no load_assignment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := xbResources(t, xdstest.EnvoyGateway(xbPool, xbOther)...)
			tc.mutate(r)
			if _, err := build(r, xbEnv(t, xbResolve)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestHealthCheckFilter: Envoy Gateway's readiness listener answers /ready
// with 200 from its health_check filter and sends everything else on to its
// route (a direct 500). The listener uses default_filter_chain only.
func TestHealthCheckFilter(t *testing.T) {
	hc := &healthcheckv3.HealthCheck{
		PassThroughMode: wrapperspb.Bool(false),
		Headers: []*routev3.HeaderMatcher{{Name: ":path", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
			StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "/ready"}},
		}}},
	}
	l := xdstest.Listener("ready", 19003, "ready-routes", xdstest.HTTPFilter("envoy.filters.http.health_check", hc, false))
	l.DefaultFilterChain, l.FilterChains = l.FilterChains[0], nil
	rc := &routev3.RouteConfiguration{Name: "ready-routes", VirtualHosts: []*routev3.VirtualHost{{Name: "r", Domains: []string{"*"},
		Routes: []*routev3.Route{{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 500}}}}}}}
	srv := xdstest.Start(t)
	srv.Set(t, "1", l, rc)
	n := testNode(t, srv)
	base := listenerURL(t, n, "ready")
	for path, want := range map[string]int{"/ready": 200, "/other": 500} {
		if resp, _ := get(t, base+path); resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	hc.PassThroughMode = wrapperspb.Bool(true)
	r := xbResources(t, xdstest.Listener("ready", 19003, "ready-routes", xdstest.HTTPFilter("envoy.filters.http.health_check", hc, false)), rc)
	if _, err := build(r, xbEnv(t, xbResolve)); err == nil || !strings.Contains(err.Error(), "pass_through_mode") {
		t.Fatalf("pass-through health check: %v", err)
	}
}

// TestHeaderMutationFilter: request header removals take effect before the
// filters after it (the picker) and the router see the request.
func TestHeaderMutationFilter(t *testing.T) {
	up := fakeproc.StartUpstream(t, nil)
	hm := &headermutationv3.HeaderMutation{Mutations: &headermutationv3.Mutations{
		RequestMutations: []*mutationrulesv3.HeaderMutation{{Action: &mutationrulesv3.HeaderMutation_Remove{Remove: "X-Gateway-Destination-Endpoint"}}},
	}}
	rc := xdstest.CatchAllRoutes("r", "up")
	srv := xdstest.Start(t)
	srv.Set(t, "1", xdstest.Listener("l", 80, "r", xdstest.HTTPFilter("strip", hm, false)), rc, xdstest.StaticCluster("up", up.Addr))
	n := testNode(t, srv)
	if resp, _ := get(t, listenerURL(t, n, "l")+"/", wire.DestinationEndpointKey, "10.9.9.9:1"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if h, _ := up.Last(); h.Get(wire.DestinationEndpointKey) != "" {
		t.Fatalf("the client's %s reached the upstream", wire.DestinationEndpointKey)
	}
	hm.Mutations.RequestMutations[0].Action = &mutationrulesv3.HeaderMutation_Append{}
	r := xbResources(t, xdstest.Listener("l", 80, "r", xdstest.HTTPFilter("strip", hm, false)), rc, xdstest.StaticCluster("up", up.Addr))
	if _, err := build(r, xbEnv(t, xbResolve)); err == nil || !strings.Contains(err.Error(), "append") {
		t.Fatalf("an append mutation: %v", err)
	}
}
