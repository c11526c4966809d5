package envoygateway

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
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
