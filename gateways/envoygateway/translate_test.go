package envoygateway

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/infergate/infergate/extproc/devproxy/xdstest"
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
	clusters, listeners, err := ModifyTranslation([]*clusterv3.Cluster{nc}, []*listenerv3.Listener{l}, []*routev3.RouteConfiguration{rc}, Config{})
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
	_, again, err := ModifyTranslation(clusters[:1], listeners, []*routev3.RouteConfiguration{rc}, Config{})
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
