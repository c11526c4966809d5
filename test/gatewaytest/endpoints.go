package gatewaytest

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// EndpointSlice writes the EndpointSlice of a Service ("<service>-test"),
// as the EndpointSlice controller would list its ready pods: addrs on
// port, named portName.
func (c *Cluster) EndpointSlice(t *testing.T, ns, service, portName string, port int32, addrs ...string) {
	t.Helper()
	var eps []discoveryv1.Endpoint
	for _, a := range addrs {
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: service + "-test", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if err := c.Client.Create(Ctx(t), s); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create EndpointSlice %s/%s: %v", ns, s.Name, err)
	}
}
