package gateway

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// TestParentProblem: what the status test takes and what it refuses, with
// the reason it gives.
func TestParentProblem(t *testing.T) {
	gw := types.NamespacedName{Name: "gw", Namespace: "infra"}
	ref := inferencev1.ParentReference{Group: ptr.To(inferencev1.Group("gateway.networking.k8s.io")), Kind: "Gateway", Name: "gw", Namespace: "infra"}
	cond := func(typ inferencev1.InferencePoolConditionType, status metav1.ConditionStatus, reason inferencev1.InferencePoolReason, gen int64) metav1.Condition {
		return metav1.Condition{Type: string(typ), Status: status, Reason: string(reason), ObservedGeneration: gen}
	}
	accepted := cond(inferencev1.InferencePoolConditionAccepted, metav1.ConditionTrue, inferencev1.InferencePoolReasonAccepted, 2)
	resolved := cond(inferencev1.InferencePoolConditionResolvedRefs, metav1.ConditionTrue, inferencev1.InferencePoolReasonResolvedRefs, 2)
	want := []wantCondition{
		{inferencev1.InferencePoolConditionAccepted, metav1.ConditionTrue, inferencev1.InferencePoolReasonAccepted},
		{inferencev1.InferencePoolConditionResolvedRefs, metav1.ConditionTrue, inferencev1.InferencePoolReasonResolvedRefs},
	}
	with := func(r inferencev1.ParentReference, conds ...metav1.Condition) inferencev1.ParentStatus {
		return inferencev1.ParentStatus{ParentRef: r, Conditions: conds}
	}
	noNamespace, otherKind, defaulted := ref, ref, ref
	noNamespace.Namespace = ""
	otherKind.Kind = "Mesh"
	defaulted.Group, defaulted.Kind = nil, ""
	cases := []struct {
		name    string
		parents []inferencev1.ParentStatus
		problem string // "" when none
	}{
		{"as it should be", []inferencev1.ParentStatus{with(ref, accepted, resolved)}, ""},
		{"group and kind left to their defaults", []inferencev1.ParentStatus{with(defaulted, accepted, resolved)}, ""},
		{"other parents are not its business", []inferencev1.ParentStatus{with(inferencev1.ParentReference{Name: "other", Namespace: "infra"}), with(ref, accepted, resolved)}, ""},
		{"no entry", nil, "no entry for Gateway infra/gw"},
		{"no namespace", []inferencev1.ParentStatus{with(noNamespace, accepted, resolved)}, "without parentRef.namespace"},
		{"twice", []inferencev1.ParentStatus{with(ref, accepted, resolved), with(ref, accepted, resolved)}, "2 entries"},
		{"another kind", []inferencev1.ParentStatus{with(otherKind, accepted, resolved)}, `parentRef.kind "Mesh"`},
		{"a condition missing", []inferencev1.ParentStatus{with(ref, accepted)}, "no ResolvedRefs condition"},
		{"no reason", []inferencev1.ParentStatus{with(ref, accepted, cond(inferencev1.InferencePoolConditionResolvedRefs, metav1.ConditionTrue, "", 2))}, `True/""`},
		{"stale", []inferencev1.ParentStatus{with(ref, accepted, cond(inferencev1.InferencePoolConditionResolvedRefs, metav1.ConditionTrue, inferencev1.InferencePoolReasonResolvedRefs, 1))}, "observedGeneration 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool := &inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Generation: 2}, Status: inferencev1.InferencePoolStatus{Parents: tc.parents}}
			err := parentProblem(pool, gw, want)
			switch {
			case tc.problem == "" && err != nil:
				t.Fatalf("unexpected problem: %v", err)
			case tc.problem != "" && (err == nil || !strings.Contains(err.Error(), tc.problem)):
				t.Fatalf("problem %v, want one saying %q", err, tc.problem)
			}
		})
	}
}
