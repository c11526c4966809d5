package controlplane

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CreatePod creates a pod with one container and marks it as a kubelet
// would once it runs: phase Running, Ready as given, podIP ip. The API
// server accepts loopback pod IPs, so a process bound to ip can serve it.
func CreatePod(ctx context.Context, c client.Client, namespace, name string, labels map[string]string, ip string, ready bool) (*corev1.Pod, error) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "model", Image: "model-server"}}},
	}
	if err := c.Create(ctx, p); err != nil {
		return nil, fmt.Errorf("create pod %s: %w", name, err)
	}
	return p, SetPodStatus(ctx, c, p, ip, ready)
}

// SetPodStatus writes phase Running, the Ready condition and the pod IP
// through the status subresource.
func SetPodStatus(ctx context.Context, c client.Client, p *corev1.Pod, ip string, ready bool) error {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{
		Phase:      corev1.PodRunning,
		PodIP:      ip,
		PodIPs:     []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}},
	}
	if err := c.Status().Update(ctx, p); err != nil {
		return fmt.Errorf("pod %s status: %w", p.Name, err)
	}
	return nil
}
