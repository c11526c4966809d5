package kube

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
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
