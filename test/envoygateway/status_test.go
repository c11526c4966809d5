package envoygateway

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/loopback"
)

// startExtension runs infergate's extension server (as infergate egext
// does, with its own Pod cache, serving the pools' endpoints over EDS) on
// the namespace's loopback and returns its address.
func (c *cluster) startExtension(t *testing.T) string {
	t.Helper()
	return loopback.Serve(t, func(ctx context.Context, ln net.Listener) error {
		return envoygateway.Run(ctx, envoygateway.Options{Listener: ln, EDSAddress: ln.Addr().String(), Kube: c.Env.Config, Logger: logr.Discard()})
	})
}

// TestPlainEnvoyGatewayRejectsInferencePool is what users hit today:
// without an extension, Envoy Gateway v1.9.1 does not know the kind.
func TestPlainEnvoyGatewayRejectsInferencePool(t *testing.T) {
	c := startCluster(t)
	c.startEG(t, "")
	ns := "plain"
	c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	c.create(t, gatewayObjects(ns)...)
	c.create(t, inferencePool(ns, "llama", inferencev1.EndpointPickerFailOpen), poolRoute(ns, "llm-route", "llama"))
	cond := c.routeCondition(t, ns, "llm-route", "ResolvedRefs")
	if cond.Status != metav1.ConditionFalse || cond.Reason != "InvalidKind" {
		t.Fatalf("ResolvedRefs = %s %s (%s), want False InvalidKind", cond.Status, cond.Reason, cond.Message)
	}
	t.Logf("plain Envoy Gateway: ResolvedRefs %s %s: %s", cond.Status, cond.Reason, cond.Message)
}

// TestExtensionResolvesInferencePool: with the extension registered for
// InferencePool backends the route resolves, and a route to a pool that
// does not exist gets the upstream reason.
func TestExtensionResolvesInferencePool(t *testing.T) {
	c := startCluster(t)
	c.startEG(t, c.startExtension(t))
	ns := "ext"
	c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	c.create(t, gatewayObjects(ns)...)
	c.create(t, inferencePool(ns, "llama", inferencev1.EndpointPickerFailOpen), poolRoute(ns, "llm-route", "llama"))
	c.create(t, poolRoute(ns, "missing-route", "nope"))
	if cond := c.routeCondition(t, ns, "llm-route", "ResolvedRefs"); cond.Status != metav1.ConditionTrue {
		t.Fatalf("ResolvedRefs = %s %s (%s), want True", cond.Status, cond.Reason, cond.Message)
	}
	if cond := c.routeCondition(t, ns, "missing-route", "ResolvedRefs"); cond.Status != metav1.ConditionFalse || cond.Reason != "BackendNotFound" {
		t.Fatalf("missing pool: ResolvedRefs = %s %s (%s), want False BackendNotFound", cond.Status, cond.Reason, cond.Message)
	}
}

// poolParent waits until the pool's status has an entry for the Gateway
// whose conditions satisfy ok, and returns it.
func (c *cluster) poolParent(t *testing.T, ns, pool, gateway, what string, ok func(accepted, resolved *metav1.Condition) bool) inferencev1.ParentStatus {
	t.Helper()
	var got inferencev1.ParentStatus
	gatewaytest.WaitFor(t, "InferencePool "+ns+"/"+pool+" status: "+what, 60*time.Second, func() bool {
		var p inferencev1.InferencePool
		if err := c.Client.Get(gatewaytest.Ctx(t), client.ObjectKey{Namespace: ns, Name: pool}, &p); err != nil {
			return false
		}
		for _, ps := range p.Status.Parents {
			if string(ps.ParentRef.Name) != gateway {
				continue
			}
			got = ps
			return ok(meta.FindStatusCondition(ps.Conditions, "Accepted"), meta.FindStatusCondition(ps.Conditions, "ResolvedRefs"))
		}
		return ok(nil, nil)
	})
	return got
}

// TestExtensionWritesPoolStatus: the pool gets a parent entry for the
// Gateway its route attaches it to, with ResolvedRefs following the
// picker's Service, and loses it when the route goes away.
func TestExtensionWritesPoolStatus(t *testing.T) {
	c := startCluster(t)
	c.startEG(t, c.startExtension(t))
	ns := "status"
	c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	c.create(t, gatewayObjects(ns)...)
	route := poolRoute(ns, "llm-route", "llama")
	c.create(t, inferencePool(ns, "llama", inferencev1.EndpointPickerFailClose), route)
	ps := c.poolParent(t, ns, "llama", "inference-gateway", "Accepted, picker Service missing", func(a, r *metav1.Condition) bool {
		return a != nil && a.Status == metav1.ConditionTrue && r != nil && r.Status == metav1.ConditionFalse && r.Reason == "InvalidExtensionRef"
	})
	if ps.ParentRef.Namespace != inferencev1.Namespace(ns) || ps.ParentRef.Kind != "Gateway" || ps.ParentRef.Group == nil ||
		*ps.ParentRef.Group != "gateway.networking.k8s.io" || ps.ControllerName != envoygateway.DefaultControllerName {
		t.Fatalf("parent entry %+v", ps)
	}
	c.create(t, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "llama-epp", Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc-ext-proc", Port: 9002}}},
	})
	c.poolParent(t, ns, "llama", "inference-gateway", "ResolvedRefs once the Service exists", func(a, r *metav1.Condition) bool {
		return r != nil && r.Status == metav1.ConditionTrue && r.Reason == "ResolvedRefs"
	})
	// A picker port the Service does not expose is refused by name.
	var pool inferencev1.InferencePool
	c.change(t, client.ObjectKey{Namespace: ns, Name: "llama"}, &pool, func() {
		pool.Spec.EndpointPickerRef.Port = &inferencev1.Port{Number: 9999}
	})
	c.poolParent(t, ns, "llama", "inference-gateway", "InvalidExtensionRef for a port the Service lacks", func(a, r *metav1.Condition) bool {
		return r != nil && r.Status == metav1.ConditionFalse && r.Reason == "InvalidExtensionRef" && strings.Contains(r.Message, "has no port 9999")
	})
	if err := c.Client.Delete(gatewaytest.Ctx(t), route); err != nil {
		t.Fatal(err)
	}
	c.poolParent(t, ns, "llama", "inference-gateway", "no entry once the route is gone", func(a, r *metav1.Condition) bool {
		return a == nil && r == nil
	})
}

// TestPoolsAndBadInputOnEnvoyGateway: two pools on one Gateway each get
// their own picker filter and status; a pool without endpointPickerRef
// makes its route answer 500 naming the problem and its status says so; a
// pool in another namespace without a ReferenceGrant is refused by Envoy
// Gateway itself.
func TestPoolsAndBadInputOnEnvoyGateway(t *testing.T) {
	c := startCluster(t)
	c.startEG(t, c.startExtension(t))
	ns, other := "pools", "pools-other"
	for _, n := range []string{ns, other} {
		c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	c.create(t, gatewayObjects(ns)...)
	noEPP := inferencePool(ns, "broken", inferencev1.EndpointPickerFailClose)
	noEPP.Spec.EndpointPickerRef = nil
	llama, qwen := poolRoute(ns, "llama-route", "llama"), poolRoute(ns, "qwen-route", "qwen")
	llama.Spec.Rules[0].Matches = pathMatch("/llama")
	qwen.Spec.Rules[0].Matches = pathMatch("/qwen")
	broken := poolRoute(ns, "broken-route", "broken")
	broken.Spec.Rules[0].Matches = pathMatch("/broken")
	cross := poolRoute(ns, "cross-route", "remote")
	cross.Spec.Rules[0].Matches = pathMatch("/cross")
	remoteNS := gatewayv1.Namespace(other)
	cross.Spec.Rules[0].BackendRefs[0].Namespace = &remoteNS
	c.create(t, inferencePool(ns, "llama", inferencev1.EndpointPickerFailOpen), inferencePool(ns, "qwen", inferencev1.EndpointPickerFailClose),
		noEPP, inferencePool(other, "remote", inferencev1.EndpointPickerFailOpen), llama, qwen, broken, cross)

	for _, name := range []string{"llama-route", "qwen-route"} {
		if cond := c.routeCondition(t, ns, name, "ResolvedRefs"); cond.Status != metav1.ConditionTrue {
			t.Fatalf("%s: ResolvedRefs %s %s", name, cond.Status, cond.Reason)
		}
	}
	if cond := c.routeCondition(t, ns, "cross-route", "ResolvedRefs"); cond.Status != metav1.ConditionFalse || cond.Reason != "RefNotPermitted" {
		t.Fatalf("cross-namespace pool without a ReferenceGrant: ResolvedRefs %s %s (%s)", cond.Status, cond.Reason, cond.Message)
	}
	for _, pool := range []string{"llama", "qwen"} {
		c.poolParent(t, ns, pool, "inference-gateway", "an entry per pool", func(a, r *metav1.Condition) bool {
			return a != nil && a.Status == metav1.ConditionTrue
		})
	}
	c.poolParent(t, ns, "broken", "inference-gateway", "EndpointPickerRefMissing", func(a, r *metav1.Condition) bool {
		return a != nil && a.Status == metav1.ConditionFalse && a.Reason == "EndpointPickerRefMissing"
	})
	gatewaytest.WaitFor(t, "a Warning Event on the broken pool", 30*time.Second, func() bool {
		var evs eventsv1.EventList
		if err := c.Client.List(gatewaytest.Ctx(t), &evs, client.InNamespace(ns)); err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == "broken" && e.Regarding.Kind == "InferencePool" && e.Type == corev1.EventTypeWarning &&
				e.Reason == "EndpointPickerRefMissing" && strings.Contains(e.Note, "endpointPickerRef is required") {
				return true
			}
		}
		return false
	})

	// What the Gateway's Envoy gets: one filter per pool, each enabled only
	// on its pool's route with its own failure mode; the broken pool's
	// route answers 500 with the reason.
	n := c.standIn(t, ns, "inference-gateway", "qwen")
	var base string
	gatewaytest.WaitFor(t, "the Gateway's listener", 60*time.Second, func() bool {
		addr, ok := n.ListenerAddr(ns + "/inference-gateway/http")
		base = "http://" + addr
		return ok
	})
	r := postPath(t, base, "/broken")
	if r.Status != 500 || !strings.Contains(r.Body, "spec.endpointPickerRef is required") {
		t.Fatalf("broken pool's route: %d %q", r.Status, r.Body)
	}
	// No picker runs here: FailOpen llama falls back to its (empty) pool,
	// FailClose qwen answers 500 — each route its own filter and mode.
	if r := postPath(t, base, "/qwen"); r.Status != 500 {
		t.Fatalf("FailClose pool without its picker: %d %q", r.Status, r.Body)
	}
	if r := postPath(t, base, "/llama"); r.Status != 503 || !strings.Contains(r.Body, "no healthy upstream") {
		t.Fatalf("FailOpen pool without picker or pods: %d %q", r.Status, r.Body)
	}
	for typ, st := range n.XDS().Status() {
		if st.NACKs > 0 {
			t.Fatalf("the stand-in NACKed Envoy Gateway's %s: %s", typ, st.LastError)
		}
	}
}

func pathMatch(prefix string) []gatewayv1.HTTPRouteMatch {
	t := gatewayv1.PathMatchPathPrefix
	return []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: &t, Value: &prefix}}}
}

// TestPoolStatusNamesAPickerWithoutHealth: a picker that serves no
// grpc.health.v1 on its ext_proc port (GAIE's and llm-d's unless run with
// --health-checking) would never be healthy in Envoy; the pool's status
// says so, with the way out, and the pool's annotation for a TCP check
// clears it.
func TestPoolStatusNamesAPickerWithoutHealth(t *testing.T) {
	ln, err := net.Listen("tcp", pickerAddr)
	if err != nil {
		t.Fatal(err)
	}
	bare := grpc.NewServer() // ext_proc would be here; no health service
	go func() { _ = bare.Serve(ln) }()
	t.Cleanup(bare.Stop)
	c := startCluster(t)
	c.startEG(t, c.startExtension(t))
	ns := "nohealth"
	c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	c.create(t, gatewayObjects(ns)...)
	c.create(t, pickerObjects(ns, "llama")...)
	pool := inferencePool(ns, "llama", inferencev1.EndpointPickerFailClose)
	pool.Annotations = map[string]string{envoygateway.PlaintextAnnotation: "true"}
	c.create(t, pool, poolRoute(ns, "llm-route", "llama"))
	ps := c.poolParent(t, ns, "llama", "inference-gateway", "ResolvedRefs False: no health service", func(a, r *metav1.Condition) bool {
		return r != nil && r.Status == metav1.ConditionFalse && r.Reason == "InvalidExtensionRef"
	})
	msg := meta.FindStatusCondition(ps.Conditions, "ResolvedRefs").Message
	for _, want := range []string{pickerAddr, "grpc.health.v1", "--health-checking", envoygateway.HealthCheckAnnotation} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	c.change(t, client.ObjectKey{Namespace: ns, Name: "llama"}, pool, func() {
		pool.Annotations[envoygateway.HealthCheckAnnotation] = "tcp"
	})
	c.poolParent(t, ns, "llama", "inference-gateway", "ResolvedRefs True with a TCP check", func(a, r *metav1.Condition) bool {
		return r != nil && r.Status == metav1.ConditionTrue
	})
}
