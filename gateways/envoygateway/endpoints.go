package envoygateway

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/extproc/epp/kube"
)

// KubeEndpoints lists a pool's endpoints from its Pods, as the picker's
// own Kubernetes mode does: every Running, Ready pod with an IP that is not
// terminating, once per target port.
type KubeEndpoints struct {
	Reader client.Reader
}

// Endpoints implements Endpoints.
func (k KubeEndpoints) Endpoints(ctx context.Context, p *Pool) ([]string, error) {
	var pods corev1.PodList
	if err := k.Reader.List(ctx, &pods, client.InNamespace(p.Namespace), client.MatchingLabels(p.Selector)); err != nil {
		return nil, fmt.Errorf("list pods of pool %s: %w", p.Key(), err)
	}
	ports := make([]inferencev1.Port, len(p.TargetPorts))
	for i, tp := range p.TargetPorts {
		ports[i] = inferencev1.Port{Number: inferencev1.PortNumber(tp)}
	}
	specs := kube.Specs(pods.Items, ports, "")
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.Address
	}
	return out, nil
}

// PickerEndpoints lists where pool p's endpoint picker answers: every
// ready address of its Service's EndpointSlices, at the port that serves
// the Service port the pool names. Each is a host of the picker's cluster,
// so that Envoy checks every replica and fails over between them; a
// cluster IP would be one host, down whenever the pod its checks reach is.
// A Service that does not exist (yet) has none: the pool's status says so.
func (k KubeEndpoints) PickerEndpoints(ctx context.Context, p *Pool) ([]string, error) {
	var svc corev1.Service
	if err := k.Reader.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: p.EPPService}, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("picker Service of pool %s: %w", p.Key(), err)
	}
	portName, found := "", false
	for _, sp := range svc.Spec.Ports {
		if uint32(sp.Port) == p.EPPPort {
			portName, found = sp.Name, true
		}
	}
	if !found {
		return nil, nil // the status names the missing port
	}
	var epSlices discoveryv1.EndpointSliceList
	if err := k.Reader.List(ctx, &epSlices, client.InNamespace(p.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: p.EPPService}); err != nil {
		return nil, fmt.Errorf("EndpointSlices of the picker of pool %s: %w", p.Key(), err)
	}
	var out []string
	for _, es := range epSlices.Items {
		if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		port := int32(0)
		for _, ep := range es.Ports {
			if ep.Port != nil && (ep.Name == nil && portName == "" || ep.Name != nil && *ep.Name == portName) {
				port = *ep.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range es.Endpoints {
			// Ready unset means ready (discovery/v1 EndpointConditions);
			// a terminating pod is not ready, and Envoy keeps a host that
			// leaves EDS while it passes its checks.
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				out = append(out, net.JoinHostPort(a, strconv.Itoa(int(port))))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// KubeRules reads HTTPRoute rules from the API server (through a cache).
type KubeRules struct {
	Reader client.Reader
}

// PoolWeights implements Rules: every backendRef of the rule must be an
// InferencePool (Envoy Gateway renders a rule as one cluster, and one
// cluster cannot mix pools with other backends here); a backendRef without
// a weight has weight 1, and a pool named twice gets the sum.
func (k KubeRules) PoolWeights(ctx context.Context, ref RuleRef) (map[string]uint32, error) {
	var route gatewayv1.HTTPRoute
	if err := k.Reader.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &route); err != nil {
		return nil, err
	}
	if ref.Rule >= len(route.Spec.Rules) {
		return nil, fmt.Errorf("the HTTPRoute has %d rules", len(route.Spec.Rules))
	}
	out := map[string]uint32{}
	for i, b := range route.Spec.Rules[ref.Rule].BackendRefs {
		if b.Group == nil || string(*b.Group) != inferencev1.GroupVersion.Group || b.Kind == nil || *b.Kind != "InferencePool" {
			return nil, fmt.Errorf("backendRefs[%d] is not an InferencePool: a rule split between InferencePools cannot also name other backends", i)
		}
		ns := ref.Namespace
		if b.Namespace != nil {
			ns = string(*b.Namespace)
		}
		w := uint32(1)
		if b.Weight != nil {
			w = uint32(max(*b.Weight, 0))
		}
		out[ns+"/"+string(b.Name)] += w
	}
	return out, nil
}
