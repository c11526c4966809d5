package istio

import (
	"fmt"
	"path/filepath"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/controlplane"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/helmrender"
)

// The installation under test: the payload processor's chart in its own
// namespace, the pool's chart beside the Gateway.
const (
	gatewayName  = "inference-gateway"
	modelsNS     = "models"
	payloadNS    = "infergate"
	payloadHost  = "infergate-payload.infergate.svc.cluster.local"
	pickerHost   = "llama-epp.models.svc.cluster.local"
	payloadPort  = 9004
	pickerPort   = 9002
	modelPort    = 8000
	payloadIndex = 6 // podAddr of the payload processor's pod
	pickerIndex  = 7 // podAddr of the picker's pod
)

// install renders both charts for provider istio with the Helm library
// and applies everything they render, then the Gateway and the HTTPRoute
// to the pool, and the EndpointSlices a controller-manager would write:
// the processor's and the picker's Services at their pods' addresses, the
// pool's model servers (n pods) behind the Service Istio made for it.
func (c *cluster) install(t *testing.T, failureMode string, n int) {
	t.Helper()
	for _, ns := range []string{modelsNS, payloadNS} {
		c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	c.applyChart(t, "infergate-payload", "infergate", payloadNS,
		fmt.Sprintf(`provider: {name: istio, istio: {gateway: {name: %s, namespace: %s}, proxyVersion: "1.30.0"}}`, gatewayName, modelsNS))
	c.applyChart(t, "infergate-epp", "llama", modelsNS,
		fmt.Sprintf("provider: {name: istio, istio: {gateway: {name: %s}}}", gatewayName),
		fmt.Sprintf("inferencePool: {targetPorts: [{number: %d}], modelServers: {matchLabels: {app: llama}}, failureMode: %s}", modelPort, failureMode))
	// A second pool on the same Gateway: its picker release renders the
	// same EnvoyFilter, and the listener must still have one filter.
	c.applyChart(t, "infergate-epp", "spare", modelsNS,
		fmt.Sprintf("provider: {name: istio, istio: {gateway: {name: %s}}}", gatewayName),
		fmt.Sprintf("inferencePool: {targetPorts: [{number: %d}], modelServers: {matchLabels: {app: spare}}}", modelPort))
	gw := &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: modelsNS, Name: gatewayName},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: "istio", Listeners: []gatewayv1.Listener{{
			Name: "http", Port: 80, Protocol: gatewayv1.HTTPProtocolType,
		}}},
	}
	route := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: modelsNS, Name: "llama"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: gatewayName}}},
			// The rule matches the base-model header the payload processor
			// sets: a request reaches the pool only once the processor has
			// run and the route was matched again.
			Rules: []gatewayv1.HTTPRouteRule{{Matches: []gatewayv1.HTTPRouteMatch{{Headers: []gatewayv1.HTTPHeaderMatch{{
				Name: "x-gateway-base-model-name", Value: sim.DefaultModel,
			}}}}, BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{
				BackendObjectReference: gatewayv1.BackendObjectReference{
					Group: ptr.To(gatewayv1.Group("inference.networking.k8s.io")), Kind: ptr.To(gatewayv1.Kind("InferencePool")), Name: "llama",
				},
			}}}}},
		},
	}
	c.create(t, gw, route)
	c.gatewayPod(t)
	c.endpoints(t, payloadNS, "infergate-payload", "grpc", payloadPort, podAddr(payloadIndex))
	c.endpoints(t, modelsNS, "llama-epp", "grpc", pickerPort, podAddr(pickerIndex))
	var addrs []string
	for i := range n {
		addrs = append(addrs, podAddr(i))
		if _, err := controlplane.CreatePod(gatewaytest.Ctx(t), c.Client, modelsNS, fmt.Sprintf("llama-%d", i), map[string]string{"app": "llama"}, podAddr(i), true); err != nil {
			t.Fatal(err)
		}
	}
	// Istio makes a Service for the pool (its "shadow" Service); its
	// endpoints are the pool's pods, as an EndpointSlice controller would
	// list them.
	var shadow corev1.Service
	gatewaytest.WaitFor(t, "Istio's Service for the pool", testTimeout, func() bool {
		var list corev1.ServiceList
		if err := c.Client.List(gatewaytest.Ctx(t), &list, client.InNamespace(modelsNS), client.MatchingLabels{"istio.io/inferencepool-name": "llama"}); err != nil || len(list.Items) == 0 {
			return false
		}
		shadow = list.Items[0]
		return true
	})
	if len(shadow.Spec.Ports) == 0 {
		t.Fatalf("Istio's Service for the pool has no port: %+v", shadow.Spec)
	}
	c.endpoints(t, modelsNS, shadow.Name, shadow.Spec.Ports[0].Name, int32(shadow.Spec.Ports[0].TargetPort.IntValue()), addrs...)
}

// gatewayPod stands for the Gateway's Envoy as Istio's deployment
// controller would run it (that controller is off: nothing here runs
// Deployments): the Service Istio binds the Gateway's configuration to
// ("<gateway>-istio"), and a ready pod behind it at namespaceAddr, the
// address the stand-in's node ID carries, which is how istiod finds the
// configuration the node is for.
func (c *cluster) gatewayPod(t *testing.T) {
	t.Helper()
	labels := map[string]string{"gateway.networking.k8s.io/gateway-name": gatewayName}
	c.create(t, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: modelsNS, Name: gatewayName + "-istio", Labels: labels},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(80), AppProtocol: ptr.To("http")},
		}},
	})
	pod, err := controlplane.CreatePod(gatewaytest.Ctx(t), c.Client, modelsNS, gatewayName+"-istio-0", labels, namespaceAddr, true)
	if err != nil {
		t.Fatal(err)
	}
	c.create(t, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: modelsNS, Name: gatewayName + "-istio-test", Labels: map[string]string{discoveryv1.LabelServiceName: gatewayName + "-istio"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{namespaceAddr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: modelsNS, Name: pod.Name, UID: pod.UID},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(80)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	})
}

// applyChart renders a chart of this repository and creates its objects.
func (c *cluster) applyChart(t *testing.T, name, release, ns string, valueDocs ...string) {
	t.Helper()
	ch, err := loader.Load(filepath.Join("..", "..", "charts", name))
	if err != nil {
		t.Fatal(err)
	}
	vals, err := helmrender.Values(valueDocs...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := helmrender.Render(ch, release, ns, vals, c.kubeVersion)
	if err != nil {
		t.Fatalf("render %s: %v", name, err)
	}
	for _, o := range objs {
		if err := c.Client.Create(gatewaytest.Ctx(t), o); err != nil {
			t.Fatalf("create %s %s/%s from %s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), name, err)
		}
	}
}

// endpoints writes the EndpointSlice of a Service: addrs on port.
func (c *cluster) endpoints(t *testing.T, ns, service, portName string, port int32, addrs ...string) {
	t.Helper()
	c.EndpointSlice(t, ns, service, portName, port, addrs...)
}

// notReady marks every endpoint of a Service's EndpointSlice not ready, as
// the EndpointSlice controller does when its pods go (terminating, or
// failing readiness): istiod then pushes the outbound cluster without them.
func (c *cluster) notReady(t *testing.T, ns, service string) {
	t.Helper()
	var s discoveryv1.EndpointSlice
	if err := c.Client.Get(gatewaytest.Ctx(t), client.ObjectKey{Namespace: ns, Name: service + "-test"}, &s); err != nil {
		t.Fatal(err)
	}
	for i := range s.Endpoints {
		s.Endpoints[i].Conditions.Ready = ptr.To(false)
	}
	if err := c.Client.Update(gatewaytest.Ctx(t), &s); err != nil {
		t.Fatal(err)
	}
}
