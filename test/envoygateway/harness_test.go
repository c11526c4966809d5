package envoygateway

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/test/gatewaytest"
)

type cluster struct {
	*gatewaytest.Cluster
}

// startCluster brings up the API server with the Gateway API, InferencePool
// and Envoy Gateway CRDs, and writes a kubeconfig for the processes.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	return &cluster{gatewaytest.StartCluster(t, "envoy-gateway", gatewaytest.EnvoyGatewayCRDs(t))}
}

func (c *cluster) create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Client.Create(gatewaytest.Ctx(t), o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// startEG runs Envoy Gateway's controller, with the extension at
// extension if set, until the test ends.
func (c *cluster) startEG(t *testing.T, extension string) {
	t.Helper()
	gatewaytest.StartEnvoyGateway(t, c.Cluster, gatewaytest.EnvoyGateway{Extension: extension})
}

// gatewayObjects are a GatewayClass for Envoy Gateway and a Gateway with an
// HTTP listener in ns.
func gatewayObjects(ns string) []client.Object {
	return []client.Object{
		&gatewayv1.GatewayClass{
			ObjectMeta: metav1.ObjectMeta{Name: "eg"},
			Spec:       gatewayv1.GatewayClassSpec{ControllerName: gatewaytest.EnvoyGatewayController},
		},
		&gatewayv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Name: "inference-gateway", Namespace: ns},
			Spec: gatewayv1.GatewaySpec{
				GatewayClassName: "eg",
				Listeners:        []gatewayv1.Listener{{Name: "http", Protocol: gatewayv1.HTTPProtocolType, Port: 80}},
			},
		},
	}
}

// poolRoute is an HTTPRoute on the Gateway whose only backend is pool.
func poolRoute(ns, name, pool string) *gatewayv1.HTTPRoute {
	group := gatewayv1.Group(inferencev1.GroupVersion.Group)
	kind := gatewayv1.Kind("InferencePool")
	return &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "inference-gateway"}}},
			Rules: []gatewayv1.HTTPRouteRule{{
				BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
					Group: &group, Kind: &kind, Name: gatewayv1.ObjectName(pool),
				}}}},
			}},
		},
	}
}

// change reads obj (key), applies mutate and writes it back, again from a
// fresh read when the write conflicts: Envoy Gateway and the extension
// write the status of routes and pools at any time, and a status write
// moves the object's resourceVersion, so a read-then-Update may meet 409
// Conflict (seen under load, where their writes land between the two).
func (c *cluster) change(t *testing.T, key client.ObjectKey, obj client.Object, mutate func()) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Client.Get(gatewaytest.Ctx(t), key, obj); err != nil {
			return err
		}
		mutate()
		return c.Client.Update(gatewaytest.Ctx(t), obj)
	})
	if err != nil {
		t.Fatalf("update %s: %v", key, err)
	}
}

// pickerObjects are pool name's picker Service, <name>-epp:9002, and the
// EndpointSlice Kubernetes' endpoint controller would write for its one
// ready replica at pickerIP (the test control plane runs no controllers).
func pickerObjects(ns, name string) []client.Object {
	svc := name + "-epp"
	port, portName, ready := int32(9002), "grpc-ext-proc", true
	return []client.Object{
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: svc, Namespace: ns},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: portName, Port: port}}},
		},
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: svc + "-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{pickerIP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		},
	}
}

// inferencePool selects app=<name> pods on port 8000, with its picker at
// <name>-epp:9002.
func inferencePool(ns, name string, failureMode inferencev1.EndpointPickerFailureMode) *inferencev1.InferencePool {
	return &inferencev1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: inferencev1.InferencePoolSpec{
			Selector:    inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": inferencev1.LabelValue(name)}},
			TargetPorts: []inferencev1.Port{{Number: 8000}},
			EndpointPickerRef: &inferencev1.EndpointPickerRef{
				Name: inferencev1.ObjectName(name + "-epp"), Port: &inferencev1.Port{Number: 9002}, FailureMode: failureMode,
			},
		},
	}
}

// routeCondition waits until the route's status for the Gateway has
// condition typ, and returns it.
func (c *cluster) routeCondition(t *testing.T, ns, name, typ string) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	gatewaytest.WaitFor(t, fmt.Sprintf("HTTPRoute %s/%s condition %s", ns, name, typ), 60*time.Second, func() bool {
		var r gatewayv1.HTTPRoute
		if err := c.Client.Get(gatewaytest.Ctx(t), client.ObjectKey{Namespace: ns, Name: name}, &r); err != nil {
			return false
		}
		for _, p := range r.Status.Parents {
			for _, cond := range p.Conditions {
				if cond.Type == typ {
					got = cond
					return true
				}
			}
		}
		return false
	})
	return got
}
