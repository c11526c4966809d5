package envoygateway

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/gateway/proto/extension"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/envoysim/xdstest"
	"github.com/infergate/infergate/gateways/internal/xdsbuild"
)

const (
	routeCluster = "httproute/default/llm-route/rule/0"
	routeConfig  = "default/eg/http"
)

// poolJSON is an InferencePool as Envoy Gateway hands it to the extension.
func poolJSON(t *testing.T, mutate func(m map[string]any)) []byte {
	t.Helper()
	m := map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "llama", "namespace": "default"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts":       []any{map[string]any{"number": 8000}},
			"endpointPickerRef": map[string]any{"name": "llama-epp", "port": map[string]any{"number": 9002}, "failureMode": "FailOpen"},
		},
	}
	if mutate != nil {
		mutate(m)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func spec(m map[string]any) map[string]any { return m["spec"].(map[string]any) }
func epp(m map[string]any) map[string]any  { return spec(m)["endpointPickerRef"].(map[string]any) }

func TestParsePool(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mutate  func(m map[string]any)
		want    func(p *Pool) bool
		wantErr string
	}{
		{name: "FailOpen", want: func(p *Pool) bool {
			return p.FailOpen && p.EPPService == "llama-epp" && p.EPPPort == 9002 && p.TargetPorts[0] == 8000 && p.Selector["app"] == "vllm"
		}},
		{name: "failureMode absent is FailClose", mutate: func(m map[string]any) { delete(epp(m), "failureMode") }, want: func(p *Pool) bool { return !p.FailOpen }},
		{name: "port absent is 9002", mutate: func(m map[string]any) { delete(epp(m), "port") }, want: func(p *Pool) bool { return p.EPPPort == DefaultEPPPort }},
		{name: "response body annotation", mutate: func(m map[string]any) {
			m["metadata"].(map[string]any)["annotations"] = map[string]any{ResponseBodyAnnotation: "streamed"}
		}, want: func(p *Pool) bool { return p.ResponseBody }},
		{name: "health check by default gRPC", want: func(p *Pool) bool { return p.HealthCheck == "grpc" }},
		{name: "TCP health check annotation", mutate: func(m map[string]any) {
			m["metadata"].(map[string]any)["annotations"] = map[string]any{HealthCheckAnnotation: "tcp"}
		}, want: func(p *Pool) bool { return p.HealthCheck == "tcp" }},
		{name: "unknown health check", mutate: func(m map[string]any) {
			m["metadata"].(map[string]any)["annotations"] = map[string]any{HealthCheckAnnotation: "http"}
		}, wantErr: HealthCheckAnnotation + ` "http": want grpc or tcp`},
		{name: "no endpointPickerRef", mutate: func(m map[string]any) { delete(spec(m), "endpointPickerRef") }, wantErr: "spec.endpointPickerRef is required"},
		{name: "unknown failureMode", mutate: func(m map[string]any) { epp(m)["failureMode"] = "Sometimes" }, wantErr: `failureMode "Sometimes"`},
		{name: "not a Service", mutate: func(m map[string]any) { epp(m)["kind"] = "Backend" }, wantErr: `kind "Backend"`},
		{name: "no target ports", mutate: func(m map[string]any) { spec(m)["targetPorts"] = []any{} }, wantErr: "spec.targetPorts is empty"},
		{name: "bad annotation", mutate: func(m map[string]any) {
			m["metadata"].(map[string]any)["annotations"] = map[string]any{PlaintextAnnotation: "maybe"}
		}, wantErr: PlaintextAnnotation},
		{name: "another version", mutate: func(m map[string]any) { m["apiVersion"] = "inference.networking.x-k8s.io/v1alpha2" }, wantErr: "is not an inference.networking.k8s.io/v1 InferencePool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParsePool(poolJSON(t, tc.mutate))
			if tc.wantErr != "" {
				if !errors.Is(err, ErrInvalidPool) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.want(p) {
				t.Fatalf("%+v, %v", p, err)
			}
		})
	}
}

// egInput is what Envoy Gateway renders around a pool backend before the
// hooks: a listener whose HCM takes routes over RDS, the rule's route and
// cluster.
func egInput() (*listenerv3.Listener, *routev3.RouteConfiguration, *clusterv3.Cluster) {
	l := xdstest.Listener(routeConfig, 10080, routeConfig)
	rc := &routev3.RouteConfiguration{Name: routeConfig, VirtualHosts: []*routev3.VirtualHost{{
		Name: "default/eg/http/*", Domains: []string{"*"},
		Routes: []*routev3.Route{
			{
				Name:   "httproute/default/llm-route/rule/0/match/0/*",
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: routeCluster}}},
			},
		},
	}}}
	c := &clusterv3.Cluster{
		Name:                 routeCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		ConnectTimeout:       durationpb.New(10 * time.Second),
	}
	return l, rc, c
}

// poolTranslation is Envoy Gateway's input for one pool's route after the
// route and cluster hooks, over endpoints: the pool, the listener, the
// modified route configuration and cluster.
func poolTranslation(t *testing.T, endpoints ...string) (*Pool, *listenerv3.Listener, *routev3.RouteConfiguration, *clusterv3.Cluster) {
	t.Helper()
	p, err := ParsePool(poolJSON(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	l, rc, c := egInput()
	r, err := ModifyRoute(rc.VirtualHosts[0].Routes[0], p, nil)
	if err != nil {
		t.Fatal(err)
	}
	rc.VirtualHosts[0].Routes[0] = r
	nc, err := ModifyCluster(c, p, endpoints, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, l, rc, nc
}

func TestTranslationShape(t *testing.T) {
	p, l, rc, nc := poolTranslation(t, "10.0.0.1:8000", "10.0.0.2:8000")
	clusters, listeners, err := ModifyTranslation(context.Background(), []*clusterv3.Cluster{nc}, []*listenerv3.Listener{l}, []*routev3.RouteConfiguration{rc}, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []interface{ Validate() error }{nc, clusters[1], listeners[0], rc} {
		if err := m.Validate(); err != nil {
			t.Fatalf("Envoy's proto validation: %v", err)
		}
	}
	if len(clusters) != 2 || clusters[1].GetName() != EPPClusterName(p) {
		t.Fatalf("clusters %v", clusters)
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	fs := hcm.GetHttpFilters()
	if len(fs) != 3 || fs[0].GetName() != StripFilterName || fs[0].GetDisabled() || fs[1].GetName() != FilterName(p) || fs[1].GetDisabled() ||
		fs[2].GetName() != "envoy.filters.http.router" {
		t.Fatalf("filters %v", fs)
	}
	ep := &extprocv3.ExternalProcessor{}
	if err := fs[1].GetTypedConfig().UnmarshalTo(ep); err != nil {
		t.Fatal(err)
	}
	// On the listener the filter sends nothing; the pool's route turns it on.
	if lm := ep.GetProcessingMode(); !ep.GetFailureModeAllow() || lm.GetRequestHeaderMode() != extprocv3.ProcessingMode_SKIP ||
		lm.GetResponseHeaderMode() != extprocv3.ProcessingMode_SKIP || lm.GetRequestBodyMode() != extprocv3.ProcessingMode_NONE ||
		ep.GetGrpcService().GetEnvoyGrpc().GetClusterName() != EPPClusterName(p) {
		t.Fatalf("ext_proc %v", ep)
	}
	pr := &extprocv3.ExtProcPerRoute{}
	if err := rc.VirtualHosts[0].Routes[0].GetTypedPerFilterConfig()[FilterName(p)].UnmarshalTo(pr); err != nil {
		t.Fatalf("the pool's route does not configure its filter: %v", err)
	}
	m := pr.GetOverrides().GetProcessingMode()
	if m.GetRequestHeaderMode() != extprocv3.ProcessingMode_SEND || m.GetRequestBodyMode() != extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED ||
		m.GetResponseBodyMode() != extprocv3.ProcessingMode_NONE || m.GetRequestTrailerMode() != extprocv3.ProcessingMode_SEND {
		t.Fatalf("route's processing mode %v", m)
	}
	// Translating again (Envoy Gateway calls the hook on every
	// translation, with its own fresh resources) adds nothing twice.
	_, again, err := ModifyTranslation(context.Background(), clusters[:1], listeners, []*routev3.RouteConfiguration{rc}, Config{}, nil)
	if err != nil || !proto.Equal(again[0], listeners[0]) {
		t.Fatalf("second translation changed the listener: %v", err)
	}
}

func TestInvalidPoolRouteAnswers500(t *testing.T) {
	_, perr := ParsePool(poolJSON(t, func(m map[string]any) { delete(spec(m), "endpointPickerRef") }))
	_, rc, _ := egInput()
	r, err := ModifyRoute(rc.VirtualHosts[0].Routes[0], nil, perr)
	if err != nil {
		t.Fatal(err)
	}
	dr := r.GetDirectResponse()
	if dr.GetStatus() != 500 || !strings.Contains(dr.GetBody().GetInlineString(), "endpointPickerRef is required") {
		t.Fatalf("route %v", r)
	}
}

// ruleWeights is a Rules answering from a map (or with err).
// The first missFirst answers are NotFound, as from a cache that has not
// seen the HTTPRoute yet.
type ruleWeights struct {
	weights   map[string]uint32
	err       error
	missFirst int
	asked     []RuleRef
}

func (r *ruleWeights) PoolWeights(_ context.Context, ref RuleRef) (map[string]uint32, error) {
	r.asked = append(r.asked, ref)
	if len(r.asked) <= r.missFirst {
		return nil, errors.New(`httproutes.gateway.networking.k8s.io "llm-route" not found`)
	}
	return r.weights, r.err
}

// poolEndpoints is an Endpoints answering from a map by pool.
type poolEndpoints map[string][]string

func (e poolEndpoints) Endpoints(_ context.Context, p *Pool) ([]string, error) {
	return e[p.Key()], nil
}

// splitTranslation runs the three hooks as Envoy Gateway does for a rule
// whose backendRefs are the pools llama (weight 70) and llama-b (30):
// one route to one cluster, both pools attached to each.
func splitTranslation(t *testing.T, rules Rules) (*routev3.RouteConfiguration, []*clusterv3.Cluster, []*listenerv3.Listener) {
	t.Helper()
	ctx := context.Background()
	second := poolJSON(t, func(m map[string]any) {
		m["metadata"].(map[string]any)["name"] = "llama-b"
		epp(m)["name"] = "llama-b-epp"
		epp(m)["failureMode"] = "FailClose"
	})
	res := []*pb.ExtensionResource{{UnstructuredBytes: poolJSON(t, nil)}, {UnstructuredBytes: second}}
	s := NewServer(poolEndpoints{"default/llama": {"10.0.0.1:8000"}, "default/llama-b": {"10.0.1.1:8000", "10.0.1.2:8000"}}, rules, Config{}, logr.Discard())
	s.rulesWait = 500 * time.Millisecond
	l, rc, c := egInput()
	rr, err := s.PostRouteModify(ctx, &pb.PostRouteModifyRequest{Route: rc.VirtualHosts[0].Routes[0], PostRouteContext: &pb.PostRouteExtensionContext{ExtensionResources: res}})
	if err != nil {
		t.Fatal(err)
	}
	rc.VirtualHosts[0].Routes[0] = rr.GetRoute()
	cr, err := s.PostClusterModify(ctx, &pb.PostClusterModifyRequest{Cluster: c, PostClusterContext: &pb.PostClusterExtensionContext{BackendExtensionResources: res}})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := s.PostTranslateModify(ctx, &pb.PostTranslateModifyRequest{
		Clusters: []*clusterv3.Cluster{cr.GetCluster()}, Listeners: []*listenerv3.Listener{l}, Routes: []*routev3.RouteConfiguration{rc},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rc, tr.GetClusters(), tr.GetListeners()
}

// TestSplitBetweenPools: a rule split between two InferencePools becomes
// weighted clusters, one per pool with that pool's endpoints, each
// enabling its own pool's picker, with the rule's weights.
//
// The rule is read from a cache that has not seen the HTTPRoute at first.
func TestSplitBetweenPools(t *testing.T) {
	rules := &ruleWeights{weights: map[string]uint32{"default/llama": 70, "default/llama-b": 30}, missFirst: 2}
	rc, clusters, listeners := splitTranslation(t, rules)
	if len(rules.asked) != 3 || rules.asked[2] != (RuleRef{Namespace: "default", Name: "llm-route", Rule: 0}) {
		t.Fatalf("rules asked %v, want the rule of the route three times", rules.asked)
	}
	r := rc.VirtualHosts[0].Routes[0]
	if err := r.Validate(); err != nil {
		t.Fatalf("Envoy's proto validation: %v", err)
	}
	wcs := r.GetRoute().GetWeightedClusters().GetClusters()
	if len(wcs) != 2 {
		t.Fatalf("route action %v, want two weighted clusters", r.GetRoute())
	}
	byName := map[string]*clusterv3.Cluster{}
	for _, c := range clusters {
		byName[c.GetName()] = c
	}
	for i, want := range []struct {
		pool, other string
		weight      uint32
		endpoints   int
	}{{"default/llama", "default/llama-b", 70, 1}, {"default/llama-b", "default/llama", 30, 2}} {
		p := &Pool{Namespace: "default", Name: strings.TrimPrefix(want.pool, "default/")}
		o := &Pool{Namespace: "default", Name: strings.TrimPrefix(want.other, "default/")}
		wc := wcs[i]
		if wc.GetName() != PoolClusterName(routeCluster, p) || wc.GetWeight().GetValue() != want.weight {
			t.Errorf("weighted cluster %d: %s weight %d, want %s weight %d", i, wc.GetName(), wc.GetWeight().GetValue(), PoolClusterName(routeCluster, p), want.weight)
		}
		if _, ok := wc.GetTypedPerFilterConfig()[FilterName(p)]; !ok {
			t.Errorf("weighted cluster %s does not enable its pool's picker: %v", wc.GetName(), wc.GetTypedPerFilterConfig())
		}
		if _, ok := wc.GetTypedPerFilterConfig()[FilterName(o)]; ok {
			t.Errorf("weighted cluster %s enables the other pool's picker", wc.GetName())
		}
		c := byName[wc.GetName()]
		if c == nil {
			t.Fatalf("no cluster %s in %v", wc.GetName(), slices.Collect(maps.Keys(byName)))
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("cluster %s: Envoy's proto validation: %v", c.GetName(), err)
		}
		if n := len(c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()); n != want.endpoints {
			t.Errorf("cluster %s has %d endpoints, want %s's %d", c.GetName(), n, want.pool, want.endpoints)
		}
		if byName[EPPClusterName(p)] == nil {
			t.Errorf("no picker cluster for %s", want.pool)
		}
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
	}
	want := []string{StripFilterName, FilterPrefix + "default/llama", FilterPrefix + "default/llama-b", "envoy.filters.http.router"}
	if !slices.Equal(names, want) {
		t.Fatalf("filters %v, want %v", names, want)
	}
}

// TestSplitBetweenPoolsErrors: a split rule whose weights cannot be read
// in time, or are all 0, answers 500 naming why.
func TestSplitBetweenPoolsErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rules Rules
		want  string
	}{
		{"no rule source", nil, "reads no HTTPRoutes"},
		{"rule unreadable", &ruleWeights{err: errors.New("httproutes is forbidden")}, "httproutes is forbidden"},
		{"pool not in the rule", &ruleWeights{weights: map[string]uint32{"default/llama": 1}}, "no backendRef to pool default/llama-b"},
		{"all weights 0", &ruleWeights{weights: map[string]uint32{"default/llama": 0, "default/llama-b": 0}}, "weight 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, _, _ := splitTranslation(t, tc.rules)
			dr := rc.VirtualHosts[0].Routes[0].GetDirectResponse()
			if dr.GetStatus() != 500 || !strings.Contains(dr.GetBody().GetInlineString(), tc.want) {
				t.Fatalf("route answers %d %q, want 500 containing %q", dr.GetStatus(), dr.GetBody().GetInlineString(), tc.want)
			}
		})
	}
}

func TestParseRouteName(t *testing.T) {
	for _, tc := range []struct {
		name string
		want RuleRef
		ok   bool
	}{
		{"httproute/default/llm-route/rule/0/match/0/*", RuleRef{"default", "llm-route", 0}, true},
		{"httproute/app/r/rule/12/match/3/api.example.com", RuleRef{"app", "r", 12}, true},
		{"httproute/app/r/rule/x/match/0/*", RuleRef{}, false},
		{"grpcroute/app/r/rule/0/match/0/*", RuleRef{}, false},
		{"httproute/app/r", RuleRef{}, false},
	} {
		got, ok := ParseRouteName(tc.name)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseRouteName(%q) = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// TestPoolRouteDefaults: a pool's route retries what never reached a model
// server, so that Envoy walks the picker's fallback list, and has a route
// timeout for generations instead of Envoy's 15 s, unless Envoy Gateway
// rendered its own (a BackendTrafficPolicy's retries, an HTTPRoute's
// timeouts.request), which are kept as they are.
func TestPoolRouteDefaults(t *testing.T) {
	p, err := ParsePool(poolJSON(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	own := &routev3.RetryPolicy{RetryOn: "5xx", NumRetries: wrapperspb.UInt32(7)}
	for _, tc := range []struct {
		name        string
		given       *routev3.RetryPolicy
		want        *routev3.RetryPolicy
		timeout     *durationpb.Duration
		wantTimeout time.Duration
	}{
		{"none of its own", nil, xdsbuild.FallbackRetries(), nil, xdsbuild.RouteTimeout},
		{"a BackendTrafficPolicy's retries, an HTTPRoute's timeout", own, own, durationpb.New(30 * time.Second), 30 * time.Second},
		{"timeouts.request 0: none", nil, xdsbuild.FallbackRetries(), durationpb.New(0), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, rc, _ := egInput()
			in := rc.VirtualHosts[0].Routes[0]
			in.GetRoute().RetryPolicy = tc.given
			in.GetRoute().Timeout = tc.timeout
			single, err := ModifyRoute(in, p, nil)
			if err != nil {
				t.Fatal(err)
			}
			split, err := SplitRoute(in, []*Pool{p, p}, []uint32{1, 1})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range []*routev3.Route{single, split} {
				if got := r.GetRoute().GetRetryPolicy(); !proto.Equal(got, tc.want) {
					t.Errorf("route %s: retry policy %v, want %v", r.GetName(), got, tc.want)
				}
				if got := r.GetRoute().GetTimeout(); got == nil || got.AsDuration() != tc.wantTimeout {
					t.Errorf("route %s: timeout %v, want %s", r.GetName(), got, tc.wantTimeout)
				}
				// The stream idle timeout (300 s on Envoy Gateway) must not
				// cut what the route timeout allows.
				switch idle := r.GetRoute().GetIdleTimeout(); {
				case tc.wantTimeout == 0 && idle != nil:
					t.Errorf("route %s without a timeout: idle_timeout %v, want the connection manager's", r.GetName(), idle)
				case tc.wantTimeout > 0 && (idle == nil || idle.AsDuration() != tc.wantTimeout):
					t.Errorf("route %s: idle_timeout %v, want %s", r.GetName(), idle, tc.wantTimeout)
				}
			}
		})
	}
	// What the policy is: retries only of what never reached a server, at
	// least one (a list of a pick and a fallback), never the same host.
	rp := xdsbuild.FallbackRetries()
	if rp.GetRetryOn() != "connect-failure,refused-stream" || rp.GetNumRetries().GetValue() < 1 ||
		len(rp.GetRetryHostPredicate()) != 1 || rp.GetRetryHostPredicate()[0].GetName() != "envoy.retry_host_predicates.previous_hosts" {
		t.Fatalf("fallback retry policy %v", rp)
	}
}

// TestPickerClusterHealthCheck: the picker's cluster runs the check the
// pool asks for: gRPC health by default, connect-only TCP (a connection
// per check) with the annotation.
func TestPickerClusterHealthCheck(t *testing.T) {
	for _, kind := range []string{"grpc", "tcp"} {
		c := eppCluster(&Pool{Namespace: "default", Name: "llama", EPPService: "llama-epp", EPPPort: 9002, HealthCheck: kind}, nil, nil)
		hc := c.GetHealthChecks()[0]
		if (kind == "tcp") != (hc.GetTcpHealthCheck() != nil) || (kind == "grpc") != (hc.GetGrpcHealthCheck() != nil) ||
			hc.GetReuseConnection() == nil || hc.GetReuseConnection().GetValue() {
			t.Errorf("%s: health check %v", kind, hc)
		}
	}
}
