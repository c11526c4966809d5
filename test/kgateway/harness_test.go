package kgateway

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/test/controlplane"
	"github.com/infergate/infergate/test/gatewaytest"
)

// The installation under test: a Gateway of class kgateway and an
// HTTPRoute to the pool, beside the pool's picker Service and pods.
const (
	gatewayName = "inference-gateway"
	modelsNS    = "models"
	poolName    = "llama"
	pickerName  = "llama-epp"
	pickerHost  = pickerName + "." + modelsNS + ".svc"
	pickerPort  = 9002
	modelPort   = 8000
	pickerIndex = 7 // podAddr of the picker's pod
)

// testTimeout bounds each wait for kgateway.
const testTimeout = 60 * time.Second

type cluster struct {
	*gatewaytest.Cluster
}

// startCluster brings up the API server with the Gateway API,
// InferencePool and kgateway's CRDs, and kgateway's controller on it. The
// Gateway API is the experimental channel: kgateway v2.2.0, built on
// Gateway API v1.4.1, lists TLSRoute and TCPRoute v1alpha2, which the
// standard channel no longer serves, and it is not ready until those
// lists succeed.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	dir := gatewaytest.KgatewayDir(t)
	c := &cluster{Cluster: gatewaytest.StartClusterChannel(t, "kgateway", controlplane.ExperimentalChannel, filepath.Join(dir, "crds"))}
	gatewaytest.StartKgateway(t, c.Cluster, dir)
	return c
}

func (c *cluster) create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Client.Create(gatewaytest.Ctx(t), o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// install creates the pool (n model server pods, its picker's Service at
// the picker's pod), the Gateway, the HTTPRoute to the pool, and the
// Gateway's pod as kgateway's deployer would run it.
func (c *cluster) install(t *testing.T, failureMode inferencev1.EndpointPickerFailureMode, n int) {
	t.Helper()
	c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: modelsNS}})
	c.create(t,
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: modelsNS, Name: pickerName},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": pickerName}, Ports: []corev1.ServicePort{
				{Name: "grpc", Port: pickerPort, TargetPort: intstr.FromInt32(pickerPort), AppProtocol: ptr.To("kubernetes.io/h2c")},
			}},
		},
		&inferencev1.InferencePool{
			ObjectMeta: metav1.ObjectMeta{Namespace: modelsNS, Name: poolName},
			Spec: inferencev1.InferencePoolSpec{
				Selector:    inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": poolName}},
				TargetPorts: []inferencev1.Port{{Number: modelPort}},
				EndpointPickerRef: &inferencev1.EndpointPickerRef{
					Name: pickerName, Port: &inferencev1.Port{Number: pickerPort}, FailureMode: failureMode,
				},
			},
		},
		&gatewayv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Namespace: modelsNS, Name: gatewayName},
			Spec: gatewayv1.GatewaySpec{GatewayClassName: gatewaytest.KgatewayClass, Listeners: []gatewayv1.Listener{{
				Name: "http", Port: 80, Protocol: gatewayv1.HTTPProtocolType,
			}}},
		},
		&gatewayv1.HTTPRoute{
			ObjectMeta: metav1.ObjectMeta{Namespace: modelsNS, Name: poolName},
			Spec: gatewayv1.HTTPRouteSpec{
				CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: gatewayName}}},
				Rules: []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{
					BackendObjectReference: gatewayv1.BackendObjectReference{
						Group: ptr.To(gatewayv1.Group(inferencev1.GroupVersion.Group)), Kind: ptr.To(gatewayv1.Kind("InferencePool")), Name: poolName,
					},
				}}}}},
			},
		},
	)
	c.EndpointSlice(t, modelsNS, pickerName, "grpc", pickerPort, podAddr(pickerIndex))
	// The model servers' pods come once kgateway has the pool: it finds a
	// pool's pods through an index of pods keyed by the pools that exist
	// when each pod is indexed, and does not index a pod again when a pool
	// comes (inferencepool/collections.go, podIdx), so a pod it indexed
	// before the pool is never routed to. kgateway writes the pool's
	// status once it has it.
	gatewaytest.WaitFor(t, "kgateway's status on the pool", testTimeout, func() bool {
		var p inferencev1.InferencePool
		return c.Client.Get(gatewaytest.Ctx(t), client.ObjectKey{Namespace: modelsNS, Name: poolName}, &p) == nil && len(p.Status.Parents) > 0
	})
	for i := range n {
		if _, err := controlplane.CreatePod(gatewaytest.Ctx(t), c.Client, modelsNS, fmt.Sprintf("%s-%d", poolName, i), map[string]string{"app": poolName}, podAddr(i), true); err != nil {
			t.Fatal(err)
		}
	}
	// The Gateway's pod, as kgateway's deployer names it: kgateway finds
	// the Pod from the node id, "<pod>.<namespace>", and drops a node
	// whose Pod does not exist.
	if _, err := controlplane.CreatePod(gatewaytest.Ctx(t), c.Client, modelsNS, gatewayPod,
		map[string]string{"gateway.networking.k8s.io/gateway-name": gatewayName}, namespaceAddr, true); err != nil {
		t.Fatal(err)
	}
}

// gatewayPod is the Gateway's Envoy's pod.
const gatewayPod = gatewayName + "-0"
