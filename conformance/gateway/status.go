package gateway

import (
	"cmp"
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	"sigs.k8s.io/gateway-api-inference-extension/conformance/resources"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwk8s "sigs.k8s.io/gateway-api/conformance/utils/kubernetes"
	confsuite "sigs.k8s.io/gateway-api/conformance/utils/suite"
)

var poolStatus = strictTest(TestPoolStatus, "status.yaml",
	"A pool an HTTPRoute routes to names the Gateway once in status.parents, by group, kind, name and "+
		"namespace, with the API's reasons for the pool's current generation: Accepted/Accepted, and "+
		"ResolvedRefs/ResolvedRefs when its endpoint picker Service exists, ResolvedRefs=False/InvalidExtensionRef "+
		"when it does not, ResolvedRefs/ResolvedRefs again once the pool names one that does "+
		"(upstream's checks take any reason for ResolvedRefs and no generation)",
	func(t *testing.T, s *confsuite.ConformanceTestSuite) {
		ctx := context.Background()
		gw := resources.PrimaryGatewayNN
		ns := resources.AppBackendNamespace
		route := types.NamespacedName{Name: "httproute-infergate-status", Namespace: ns}
		resolved := types.NamespacedName{Name: "infergate-status-pool", Namespace: ns}
		unresolved := types.NamespacedName{Name: "infergate-status-pool-unresolved", Namespace: ns}
		gwk8s.HTTPRouteMustHaveCondition(t, s.Client, s.TimeoutConfig, route, gw, metav1.Condition{
			Type: string(gatewayv1.RouteConditionAccepted), Status: metav1.ConditionTrue, Reason: string(gatewayv1.RouteReasonAccepted)})

		accepted := wantCondition{inferencev1.InferencePoolConditionAccepted, metav1.ConditionTrue, inferencev1.InferencePoolReasonAccepted}
		refsOK := wantCondition{inferencev1.InferencePoolConditionResolvedRefs, metav1.ConditionTrue, inferencev1.InferencePoolReasonResolvedRefs}
		refsBad := wantCondition{inferencev1.InferencePoolConditionResolvedRefs, metav1.ConditionFalse, inferencev1.InferencePoolReasonInvalidExtensionRef}
		mustReport := func(pool types.NamespacedName, want ...wantCondition) {
			t.Helper()
			var last error
			err := waitFor(ctx, s.TimeoutConfig.HTTPRouteMustHaveCondition, func(ctx context.Context) (bool, error) {
				var p inferencev1.InferencePool
				if err := s.Client.Get(ctx, pool, &p); err != nil {
					if ctx.Err() == nil { // not the wait's own end: keep the last problem seen
						last = err
					}
					return false, nil
				}
				last = parentProblem(&p, gw, want)
				return last == nil, nil
			})
			if err != nil {
				require.NoError(t, cmp.Or(last, err), "pool %s status for Gateway %s", pool, gw)
			}
			t.Logf("pool %s: status.parents reports Gateway %s as it should", pool, gw)
		}
		mustReport(resolved, accepted, refsOK)
		mustReport(unresolved, refsBad)

		t.Logf("pointing pool %s at %s", unresolved, resources.PrimaryEppServiceNN.Name)
		var p inferencev1.InferencePool
		require.NoError(t, s.Client.Get(ctx, unresolved, &p))
		patch := client.MergeFrom(p.DeepCopy())
		p.Spec.EndpointPickerRef.Name = inferencev1.ObjectName(resources.PrimaryEppServiceNN.Name)
		require.NoError(t, s.Client.Patch(ctx, &p, patch))
		mustReport(unresolved, accepted, refsOK)
	})

// wantCondition is a condition a parent entry must carry.
type wantCondition struct {
	typ    inferencev1.InferencePoolConditionType
	status metav1.ConditionStatus
	reason inferencev1.InferencePoolReason
}

// parentProblem says what is wrong with pool's status.parents entry for
// Gateway gw, or nil when there is exactly one, naming gw fully, with the
// wanted conditions for the pool's current generation.
func parentProblem(pool *inferencev1.InferencePool, gw types.NamespacedName, want []wantCondition) error {
	var entries []inferencev1.ParentStatus
	unqualified := false
	for _, ps := range pool.Status.Parents {
		ref := ps.ParentRef
		if string(ref.Name) != gw.Name {
			continue
		}
		switch string(ref.Namespace) {
		case gw.Namespace:
			entries = append(entries, ps)
		case "":
			unqualified = true
		}
	}
	switch {
	case len(entries) == 0 && unqualified:
		return fmt.Errorf("status.parents names Gateway %s without parentRef.namespace: readers cannot tell which Gateway that is (upstream's suite ignores such entries)", gw.Name)
	case len(entries) == 0:
		return fmt.Errorf("status.parents has no entry for Gateway %s", gw)
	case len(entries) > 1:
		return fmt.Errorf("status.parents has %d entries for Gateway %s, want one", len(entries), gw)
	}
	ps := entries[0]
	if g := ps.ParentRef.Group; g != nil && string(*g) != gatewayv1.GroupName {
		return fmt.Errorf("status.parents entry for Gateway %s has parentRef.group %q, want %s", gw, *g, gatewayv1.GroupName)
	}
	if k := string(ps.ParentRef.Kind); k != "" && k != "Gateway" {
		return fmt.Errorf("status.parents entry for Gateway %s has parentRef.kind %q, want Gateway", gw, k)
	}
	for _, w := range want {
		c := meta.FindStatusCondition(ps.Conditions, string(w.typ))
		switch {
		case c == nil:
			return fmt.Errorf("status.parents entry for Gateway %s has no %s condition", gw, w.typ)
		case c.Status != w.status || c.Reason != string(w.reason):
			return fmt.Errorf("condition %s is %s/%q (%s), want %s/%s", w.typ, c.Status, c.Reason, c.Message, w.status, w.reason)
		case c.ObservedGeneration != pool.Generation:
			return fmt.Errorf("condition %s has observedGeneration %d, the pool is at generation %d: the status is stale or does not say what it observed",
				w.typ, c.ObservedGeneration, pool.Generation)
		}
	}
	return nil
}
