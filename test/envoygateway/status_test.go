package envoygateway

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/test/loopback"
)

// startExtension runs infergate's extension server (as infergate egext
// does, with its own Pod cache, serving the pools' endpoints over EDS) on
// the namespace's loopback and returns its address.
func (c *cluster) startExtension(t *testing.T) string {
	t.Helper()
	return loopback.Serve(t, func(ctx context.Context, ln net.Listener) error {
		return envoygateway.Run(ctx, envoygateway.Options{Listener: ln, EDSAddress: ln.Addr().String(), Kube: c.env.Config, Logger: logr.Discard()})
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
	waitFor(t, "InferencePool "+ns+"/"+pool+" status: "+what, 60*time.Second, func() bool {
		var p inferencev1.InferencePool
		if err := c.client.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: pool}, &p); err != nil {
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
	if err := c.client.Delete(testCtx(t), route); err != nil {
		t.Fatal(err)
	}
	c.poolParent(t, ns, "llama", "inference-gateway", "no entry once the route is gone", func(a, r *metav1.Condition) bool {
		return a == nil && r == nil
	})
}
