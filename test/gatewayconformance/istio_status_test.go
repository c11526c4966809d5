package gatewayconformance

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/gateway-api-inference-extension/conformance/resources"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/internal/testcert"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/livecluster"
)

// Istio's InferencePool filter: the name its per-route overrides turn on.
const istioInferenceFilter = "envoy.filters.http.ext_proc"

// statusHold is how long the webhook holds each HTTPRoute status write:
// far past istiod's push debounce (PILOT_DEBOUNCE_AFTER, 100 ms), as a
// busy istiod or API server can be.
const statusHold = 3 * time.Second

// TestIstioInferenceFilter shows, with istiod and an API server that
// takes statusHold to accept each HTTPRoute status write, why the picker's
// chart keeps Istio's InferencePool filter on a Gateway's listener.
//
// istiod puts the filter on a listener only while its InferencePool index
// lists the Gateway, and builds that index from the routes' status.parents
// (pilot/pkg/config/kube/gateway/inferencepool_collection.go
// findGatewayParents; listener_builder.go HasInferencePool); a change of
// the index pushes nothing (controller.go registers no push for it). A
// route's own push comes as soon as the route exists. So when the status
// lands later, the route's override turns on a filter the listener lacks,
// and the route serves round robin, picker and failureMode bypassed,
// until some other change pushes the listener.
//
//   - Istio alone: on a fresh Gateway, a route to the primary pool serves
//     before its status lands; after it has landed istiod's own view
//     (/debug/config_dump) has the filter, yet the stand-in was sent none
//     and requests still go round robin. If Istio pushes the filter, the
//     test fails and says so.
//   - With the chart's EnvoyFilter: a fresh Gateway has the filter before
//     any route, and its route's requests reach the picker's choice from
//     the first answer on, before and after the status lands; the chart's
//     filter is istiod's own, field for field.
func TestIstioInferenceFilter(t *testing.T) {
	dir, l := startIstio(t)
	gws := istioProxies(t, l)
	defer gws.stop()
	// The suite's base resources (pools, pickers, model servers), left in
	// place after one upstream test that routes through them.
	r := &run{Live: l, name: "istio", version: filepath.Base(dir), class: "istio"}
	o := r.options(t, 45*time.Second)
	o.CleanupBaseResources, o.RunTest = false, "GatewayFollowingEPPRouting"
	if _, out, passed := r.command(t, o, 45*time.Second); !passed {
		t.Fatalf("the suite's base resources and %s:\n%s", o.RunTest, tail(out, 60))
	}
	var pods corev1.PodList
	if err := l.Client.List(gatewaytest.Ctx(t), &pods, client.InNamespace(resources.AppBackendNamespace), client.MatchingLabels{"app": resources.PrimaryModelServerAppLabel}); err != nil || len(pods.Items) == 0 {
		t.Fatalf("the primary pool's pods: %v (%d)", err, len(pods.Items))
	}
	target := pods.Items[0]
	holdRouteStatus(t, l, statusHold)

	var own *extprocv3.ExternalProcessor
	t.Run("Istio alone", func(t *testing.T) {
		n, pod, addr := startIstioGateway(t, l, gws, "istio-alone")
		if c := filterCount(n); c != 0 {
			t.Fatalf("a Gateway with no route has %d %s filters: %v", c, istioInferenceFilter, n.ListenerFilters())
		}
		route := primaryPoolRoute(t, l, "istio-alone", "/istio-alone")
		served, parents := firstAnswer(t, l, route, addr, "/istio-alone", target.Status.PodIP)
		t.Logf("first answer from %s, with %d status parents", served, parents)
		waitRouteStatus(t, l, route)
		gatewaytest.WaitFor(t, "istiod's view of the Gateway to have its inference filter", 30*time.Second, func() bool {
			own = istiodFilter(pod)
			return own != nil
		})
		// Pushes follow a change within the debounce; give one ample time.
		time.Sleep(2 * time.Second)
		if c := filterCount(n); c != 0 {
			t.Fatalf("istiod pushed its inference filter after the route's status (listener %v): Istio changed; "+
				"docs/istio.md#limits and the picker chart's provider.istio.inferenceFilter may no longer be needed", n.ListenerFilters())
		}
		got := askN(t, addr, "/istio-alone", target.Status.PodIP, 6)
		if !slices.ContainsFunc(got, func(p string) bool { return p != target.Name }) {
			t.Errorf("the listener has no inference filter, yet every request reached the picker's choice %s: %v", target.Name, got)
		}
		t.Logf("listener %v; asked for %s, served by %v", n.ListenerFilters(), target.Name, got)
	})

	t.Run("with the chart's filter", func(t *testing.T) {
		inferenceFilter(t, l, resources.AppBackendNamespace, "chart-filter")
		n, _, addr := startIstioGateway(t, l, gws, "chart-filter")
		gatewaytest.WaitFor(t, "the chart's inference filter on the Gateway's listener", 30*time.Second, func() bool {
			return filterCount(n) == 1
		})
		route := primaryPoolRoute(t, l, "chart-filter", "/chart-filter")
		served, parents := firstAnswer(t, l, route, addr, "/chart-filter", target.Status.PodIP)
		if served != target.Name {
			t.Errorf("first answer from %s (%d status parents), want the picker's choice %s", served, parents, target.Name)
		}
		before := askN(t, addr, "/chart-filter", target.Status.PodIP, 6)
		waitRouteStatus(t, l, route)
		after := askN(t, addr, "/chart-filter", target.Status.PodIP, 6)
		for _, p := range append(before, after...) {
			if p != target.Name {
				t.Errorf("asked for %s: served by %v before the route's status landed, %v after", target.Name, before, after)
				break
			}
		}
		if c := filterCount(n); c != 1 {
			t.Errorf("listener %v: %d %s filters, want 1", n.ListenerFilters(), c, istioInferenceFilter)
		}
		t.Logf("first answer with %d status parents; served by %v before the status, %v after", parents, before, after)
	})

	t.Run("the chart's filter is istiod's", func(t *testing.T) {
		if own == nil {
			t.Skip("istiod's own filter was not read (see Istio alone)")
		}
		chart := chartFilter(t, l)
		if !proto.Equal(chart, own) {
			t.Errorf("the picker chart's inference filter differs from istiod's:\nchart:  %v\nistiod: %v", chart, own)
		}
	})
}

// holdRouteStatus makes the API server hold each HTTPRoute status write
// for d (a validating webhook that answers after d) until the test ends.
func holdRouteStatus(t *testing.T, l *livecluster.Live, d time.Duration) {
	t.Helper()
	ca := testcert.NewCA(t, "route-status-webhook")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.Server(t)}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		review.Request = nil
		_ = json.NewEncoder(w).Encode(review)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	url := "https://" + ln.Addr().String() + "/"
	wh := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "hold-httproute-status"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "hold.httproute-status.infergate.test",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca.PEM},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{gatewayv1.GroupName}, APIVersions: []string{"*"},
					Resources: []string{"httproutes/status"}},
			}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To(int32(d/time.Second) + 5),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		}},
	}
	if err := l.Client.Create(gatewaytest.Ctx(t), wh); err != nil {
		t.Fatal(err)
	}
}

// startIstioGateway creates a Gateway of class istio in the app namespace
// and returns its stand-in once it has its listener, its Pod, and where
// it serves.
func startIstioGateway(t *testing.T, l *livecluster.Live, gws *istioGateways, name string) (*envoysim.Node, *corev1.Pod, string) {
	t.Helper()
	gw := &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: resources.AppBackendNamespace, Name: name},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: "istio", Listeners: []gatewayv1.Listener{{
			Name: "http", Port: 80, Protocol: gatewayv1.HTTPProtocolType,
		}}},
	}
	if err := l.Client.Create(gatewaytest.Ctx(t), gw); err != nil {
		t.Fatal(err)
	}
	var (
		n   *envoysim.Node
		pod *corev1.Pod
	)
	gatewaytest.WaitFor(t, "Gateway "+name+"'s stand-in with its listener", 60*time.Second, func() bool {
		n, pod = gws.node(name)
		return n != nil && n.XDS().Status()[xdsclient.ListenerType].ACKs > 0 && len(n.ListenerFilters()) > 0
	})
	var addr string
	gatewaytest.WaitFor(t, "Gateway "+name+"'s address", 30*time.Second, func() bool {
		if err := l.Client.Get(gatewaytest.Ctx(t), client.ObjectKeyFromObject(gw), gw); err != nil || len(gw.Status.Addresses) == 0 {
			return false
		}
		addr = net.JoinHostPort(gw.Status.Addresses[0].Value, "80")
		return true
	})
	return n, pod, addr
}

// primaryPoolRoute routes path on Gateway gw (app namespace) to the
// suite's primary InferencePool.
func primaryPoolRoute(t *testing.T, l *livecluster.Live, gw, path string) *gatewayv1.HTTPRoute {
	t.Helper()
	route := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: gw, Namespace: resources.AppBackendNamespace},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: gatewayv1.ObjectName(gw)}}},
			Rules: []gatewayv1.HTTPRouteRule{{
				Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: &path}}},
				BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
					Group: ptr.To(gatewayv1.Group("inference.networking.k8s.io")), Kind: ptr.To(gatewayv1.Kind("InferencePool")),
					Name: gatewayv1.ObjectName(resources.PrimaryInferencePoolNN.Name),
				}}}},
			}},
		},
	}
	if err := l.Client.Create(gatewaytest.Ctx(t), route); err != nil {
		t.Fatal(err)
	}
	return route
}

// firstAnswer asks until the route answers 200 and returns the Pod that
// served it and how many status parents the route had just before.
func firstAnswer(t *testing.T, l *livecluster.Live, route *gatewayv1.HTTPRoute, addr, path, podIP string) (string, int) {
	t.Helper()
	var served string
	parents := 0
	gatewaytest.WaitFor(t, "the route's first answer", 30*time.Second, func() bool {
		var rt gatewayv1.HTTPRoute
		if err := l.Client.Get(gatewaytest.Ctx(t), client.ObjectKeyFromObject(route), &rt); err == nil {
			parents = len(rt.Status.Parents)
		}
		pod, err := ask(addr, path, podIP)
		served = pod
		return err == nil
	})
	return served, parents
}

// waitRouteStatus waits for the route's status to name its Gateway.
func waitRouteStatus(t *testing.T, l *livecluster.Live, route *gatewayv1.HTTPRoute) {
	t.Helper()
	gatewaytest.WaitFor(t, "the route's status", 30*time.Second, func() bool {
		var rt gatewayv1.HTTPRoute
		return l.Client.Get(gatewaytest.Ctx(t), client.ObjectKeyFromObject(route), &rt) == nil && len(rt.Status.Parents) > 0
	})
}

// askN asks n times for the pool's Pod at podIP and returns who served.
func askN(t *testing.T, addr, path, podIP string, n int) []string {
	t.Helper()
	var out []string
	for range n {
		pod, err := ask(addr, path, podIP)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pod)
	}
	return out
}

// ask sends a completion through the Gateway at addr asking the suite's
// test picker for the Pod at podIP, and returns the Pod the echo server
// says served it; an error unless the answer is 200.
func ask(addr, path, podIP string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewBufferString(`{"model":"conformance-fake-model","prompt":"hi"}`))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("test-epp-endpoint-selection", podIP)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, body)
	}
	var echo struct {
		Pod string `json:"pod"`
	}
	if err := json.Unmarshal(body, &echo); err != nil || echo.Pod == "" {
		return "", fmt.Errorf("answer names no Pod: %s", body)
	}
	return echo.Pod, nil
}

// filterCount is how many of Istio's InferencePool filters the stand-in's
// listeners serve with.
func filterCount(n *envoysim.Node) int {
	c := 0
	for _, l := range n.ListenerFilters() {
		_, fs, _ := strings.Cut(l, ": ")
		for _, f := range strings.Fields(strings.Trim(fs, "[]")) {
			if f == istioInferenceFilter {
				c++
			}
		}
	}
	return c
}

// istiodFilter is the InferencePool filter istiod would send pod's
// Gateway now (its /debug/config_dump builds the configuration afresh),
// or nil.
func istiodFilter(pod *corev1.Pod) *extprocv3.ExternalProcessor {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var dump any
	if istiodDebug(ctx, "/debug/config_dump?proxyID="+pod.Name+"."+pod.Namespace, &dump) != nil {
		return nil
	}
	ep, err := namedFilter(dump)
	if err != nil {
		return nil
	}
	return ep
}

// chartFilter is the InferencePool filter the picker's chart puts on a
// Gateway (its EnvoyFilter's inserted value).
func chartFilter(t *testing.T, l *livecluster.Live) *extprocv3.ExternalProcessor {
	t.Helper()
	ef := renderInferenceFilter(t, l, "any", "gw")
	patches, _, _ := unstructured.NestedSlice(ef.Object, "spec", "configPatches")
	var value any
	for _, p := range patches {
		if v, ok, _ := unstructured.NestedFieldCopy(p.(map[string]any), "patch", "value"); ok {
			value = v
		}
	}
	ep, err := namedFilter(value)
	if err != nil {
		t.Fatalf("the chart's EnvoyFilter: %v", err)
	}
	return ep
}

// namedFilter finds, anywhere in a decoded JSON document, the HTTP filter
// named istioInferenceFilter and decodes its typed config (JSON or proto
// field names).
func namedFilter(doc any) (*extprocv3.ExternalProcessor, error) {
	var found map[string]any
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["name"] == istioInferenceFilter && found == nil {
				if tc, ok := v["typedConfig"].(map[string]any); ok {
					found = tc
				} else if tc, ok := v["typed_config"].(map[string]any); ok {
					found = tc
				}
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(doc)
	if found == nil {
		return nil, errors.New("no " + istioInferenceFilter + " filter with a typed config")
	}
	b, err := json.Marshal(found)
	if err != nil {
		return nil, err
	}
	a := &anypb.Any{}
	if err := protojson.Unmarshal(b, a); err != nil {
		return nil, err
	}
	ep := &extprocv3.ExternalProcessor{}
	if err := a.UnmarshalTo(ep); err != nil {
		return nil, err
	}
	return ep, nil
}
