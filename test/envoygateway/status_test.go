package envoygateway

import (
	"context"
	"net"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/test/loopback"
)

// startExtension runs infergate's extension server (as infergate egext
// does, with its own Pod cache) on the namespace's loopback and returns its
// address.
func (c *cluster) startExtension(t *testing.T) string {
	t.Helper()
	return loopback.Serve(t, func(ctx context.Context, ln net.Listener) error {
		return envoygateway.Run(ctx, envoygateway.Options{Listener: ln, Kube: c.env.Config, Logger: logr.Discard()})
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
