package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

func pod(name, ip string, phase corev1.PodPhase, ready corev1.ConditionStatus, labels map[string]string) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	p.Status.Phase, p.Status.PodIP = phase, ip
	if ready != "" {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}
	}
	return p
}

func TestSpecs(t *testing.T) {
	deleting := pod("d", "10.0.0.9", corev1.PodRunning, corev1.ConditionTrue, nil)
	now := metav1.NewTime(time.Now())
	deleting.DeletionTimestamp = &now
	pods := []corev1.Pod{
		pod("b", "10.0.0.2", corev1.PodRunning, corev1.ConditionTrue, map[string]string{"llm-d.ai/engine-type": "sglang"}),
		pod("a", "10.0.0.1", corev1.PodRunning, corev1.ConditionTrue, nil),
		pod("not-ready", "10.0.0.3", corev1.PodRunning, corev1.ConditionFalse, nil),
		pod("no-ip", "", corev1.PodRunning, corev1.ConditionTrue, nil),
		pod("pending", "10.0.0.4", corev1.PodPending, corev1.ConditionTrue, nil),
		pod("no-condition", "10.0.0.5", corev1.PodRunning, "", nil),
		deleting,
	}
	cases := []struct {
		ports []int32
		want  []string
	}{
		{[]int32{8000}, []string{"a 10.0.0.1:8000 ", "b 10.0.0.2:8000 sglang"}},
		{[]int32{8000, 8001}, []string{"a-rank-0 10.0.0.1:8000 ", "a-rank-1 10.0.0.1:8001 ", "b-rank-0 10.0.0.2:8000 sglang", "b-rank-1 10.0.0.2:8001 sglang"}},
	}
	for _, tc := range cases {
		var ports []inferencev1.Port
		for _, n := range tc.ports {
			ports = append(ports, inferencev1.Port{Number: inferencev1.PortNumber(n)})
		}
		var got []string
		for _, s := range Specs(pods, ports, "llm-d.ai/engine-type") {
			got = append(got, fmt.Sprintf("%s %s %s", s.Name, s.Address, s.Engine))
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("ports %v: got %q, want %q", tc.ports, got, tc.want)
		}
	}
}

func unstructuredOf(gvk schema.GroupVersionKind, name string, created time.Time, spec map[string]any) *unstructured.Unstructured {
	u := newUnstructured(gvk)
	u.SetNamespace("ns")
	u.SetName(name)
	u.SetCreationTimestamp(metav1.NewTime(created))
	u.Object["spec"] = spec
	return u
}

// TestReconcileFillsTheStore checks that one reconcile writes the pool's
// endpoints, objectives and model rewrites into the store, leaving out
// the objects of other pools.
func TestReconcileFillsTheStore(t *testing.T) {
	scheme, err := newScheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, gvk := range []schema.GroupVersionKind{ObjectiveGVK, RewriteGVK} {
		scheme.AddKnownTypeWithName(gvk, &unstructured.Unstructured{})
		scheme.AddKnownTypeWithName(gvk.GroupVersion().WithKind(gvk.Kind+"List"), &unstructured.UnstructuredList{})
	}
	pool := &inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pool"}}
	pool.Spec.Selector.MatchLabels = map[inferencev1.LabelKey]inferencev1.LabelValue{"app": "llm"}
	pool.Spec.TargetPorts = []inferencev1.Port{{Number: 8000}}
	serving := pod("a", "10.0.0.1", corev1.PodRunning, corev1.ConditionTrue, map[string]string{"app": "llm"})
	serving.Namespace = "ns"
	t0 := time.Now().Add(-time.Hour)
	objs := []client.Object{pool, &serving,
		unstructuredOf(ObjectiveGVK, "batch", t0, map[string]any{"poolRef": map[string]any{"name": "pool"}, "priority": int64(-1)}),
		unstructuredOf(ObjectiveGVK, "plain", t0, map[string]any{"poolRef": map[string]any{"name": "pool"}}),
		unstructuredOf(ObjectiveGVK, "elsewhere", t0, map[string]any{"poolRef": map[string]any{"name": "other"}, "priority": int64(5)}),
		unstructuredOf(RewriteGVK, "newer", t0.Add(time.Minute), map[string]any{"poolRef": map[string]any{"name": "pool"}, "rules": []any{
			map[string]any{"targets": []any{map[string]any{"modelRewrite": "catch-all"}}},
		}}),
		unstructuredOf(RewriteGVK, "older", t0, map[string]any{"poolRef": map[string]any{"name": "pool"}, "rules": []any{
			map[string]any{
				"matches": []any{map[string]any{"model": map[string]any{"value": "sql-lora"}}},
				"targets": []any{map[string]any{"modelRewrite": "sql-lora-v1", "weight": int64(90)}, map[string]any{"modelRewrite": "sql-lora-v2", "weight": int64(10)}},
			},
		}}),
	}
	store := datastore.New()
	r := &reconciler{client: fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build(),
		key: types.NamespacedName{Namespace: "ns", Name: "pool"}, store: store, log: logr.Discard(),
		objectives: true, rewrites: true, first: make(chan struct{})}
	if _, err := r.Reconcile(context.Background(), reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	if eps := store.Endpoints(); len(eps) != 1 || eps[0].Address != "10.0.0.1:8000" {
		t.Errorf("endpoints %v", eps)
	}
	for _, tc := range []struct {
		name     string
		priority int
		ok       bool
	}{{"batch", -1, true}, {"plain", 0, true}, {"elsewhere", 0, false}} {
		if o, ok := store.Objective(tc.name); o.Priority != tc.priority || ok != tc.ok {
			t.Errorf("objective %s: %+v %v, want priority %d %v", tc.name, o, ok, tc.priority, tc.ok)
		}
	}
	for model, want := range map[string]string{"sql-lora": "[sql-lora] [{sql-lora-v1 90} {sql-lora-v2 10}]", "chat": "[] [{catch-all 1}]"} {
		rule, ok := store.ModelRewrite(model)
		if got := fmt.Sprint(rule.Models, " ", rule.Targets); !ok || got != want {
			t.Errorf("rewrite of %s: %s %v, want %s (the older object's rule first)", model, got, ok, want)
		}
	}
}
