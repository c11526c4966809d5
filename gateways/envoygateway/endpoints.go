package envoygateway

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

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
