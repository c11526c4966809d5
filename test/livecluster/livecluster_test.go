package livecluster_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/infergate/infergate/test/childproc"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/livecluster"
)

func TestMain(m *testing.M) {
	os.Exit(gatewaytest.Main(m, []string{"--net"}, setUp))
}

func setUp() error {
	if err := gatewaytest.SetUpBridge(); err != nil {
		return err
	}
	return livecluster.SetUpAddresses()
}

const image = "infergate.test/infergate:dev"

// TestDeploymentServesThroughItsService: a Deployment's replicas run as
// processes on their own Pod IPs, its Service's cluster IP spreads
// connections over them, a LoadBalancer Service gets an ingress address
// that answers, and a Service whose selector matches nothing refuses.
func TestDeploymentServesThroughItsService(t *testing.T) {
	c := gatewaytest.StartCluster(t, "live")
	l := livecluster.Start(t, c, livecluster.Config{Images: map[string]string{image: childproc.Command(t, "infergate")}})
	ctx := gatewaytest.Ctx(t)
	ns := "live"
	labels := map[string]string{"app": "echo"}
	replicas := int32(2)
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns}, Spec: appsv1.DeploymentSpec{
			Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "echo", Image: image, Args: []string{"sim", "--echo", "--address", "$(POD_IP)", "--port", "3000"},
				Ports: []corev1.ContainerPort{{ContainerPort: 3000}},
				Env: []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			}}}},
		}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns}, Spec: corev1.ServiceSpec{
			Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(3000)}}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "echo-lb", Namespace: ns}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, Selector: labels, Ports: []corev1.ServicePort{{Port: 8080, TargetPort: intstr.FromInt32(3000)}}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "nothing", Namespace: ns}, Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "none"}, Ports: []corev1.ServicePort{{Port: 80}}}},
	}
	for _, o := range objs {
		if err := c.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	var svc corev1.Service
	gatewaytest.WaitFor(t, "the LoadBalancer Service's ingress", time.Minute, func() bool {
		return c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "echo-lb"}, &svc) == nil && len(svc.Status.LoadBalancer.Ingress) > 0
	})
	clusterIPs, err := l.Lookup(ctx, "echo."+ns+".svc.cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	clusterIP := clusterIPs[0]
	// A connection per request: the proxy balances connections.
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, base := range []string{"http://" + clusterIP + ":80", "http://" + svc.Status.LoadBalancer.Ingress[0].IP + ":8080"} {
		pods := map[string]bool{}
		gatewaytest.WaitFor(t, "both replicas answer at "+base, 40*time.Second, func() bool {
			resp, err := hc.Get(base + "/")
			if err != nil {
				return false
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, `"pod"`) {
					pods[line] = true
				}
			}
			return len(pods) == 2
		})
		for p := range pods {
			if !strings.Contains(p, "echo-") {
				t.Fatalf("%s: pod %s", base, p)
			}
		}
	}
	nothingIPs, err := l.Lookup(ctx, "nothing."+ns+".svc")
	if err != nil {
		t.Fatal(err)
	}
	nothing := nothingIPs[0]
	gatewaytest.WaitFor(t, "the proxy listens for the empty Service", 30*time.Second, func() bool {
		_, err := hc.Get(fmt.Sprintf("http://%s:80/", nothing))
		return err != nil && strings.Contains(err.Error(), "reset")
	})
	var pods corev1.PodList
	if err := c.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil || len(pods.Items) != 2 {
		t.Fatalf("pods: %v %d", err, len(pods.Items))
	}
	for _, p := range pods.Items {
		if !strings.HasPrefix(p.Status.PodIP, "10.244.") || p.Status.Phase != corev1.PodRunning {
			t.Fatalf("pod %s: %s %s", p.Name, p.Status.Phase, p.Status.PodIP)
		}
	}
}

// TestHoldKeepsAPodPending: a Pod the node's Hold holds stays Pending with
// no address while a Pod beside it runs, and starts once released.
func TestHoldKeepsAPodPending(t *testing.T) {
	c := gatewaytest.StartCluster(t, "hold")
	var released atomic.Bool
	livecluster.Start(t, c, livecluster.Config{Hold: func(_ context.Context, _ client.Client, p *corev1.Pod) bool {
		return p.Labels["held"] == "true" && !released.Load()
	}})
	ctx := gatewaytest.Ctx(t)
	pod := func(name, held string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"held": held}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none.test/none"}}}}
	}
	for _, p := range []*corev1.Pod{pod("held", "true"), pod("free", "false")} {
		if err := c.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	get := func(name string) corev1.Pod {
		var p corev1.Pod
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gatewaytest.WaitFor(t, "the free Pod runs", 30*time.Second, func() bool { return get("free").Status.PodIP != "" })
	// The free Pod was scheduled and started beside it: several syncs have
	// asked about the held one since.
	time.Sleep(time.Second)
	if p := get("held"); p.Spec.NodeName != livecluster.NodeName || p.Status.PodIP != "" || p.Status.Phase != corev1.PodPending {
		t.Fatalf("held Pod: node %q, IP %q, phase %s; want scheduled, no IP, Pending", p.Spec.NodeName, p.Status.PodIP, p.Status.Phase)
	}
	released.Store(true)
	gatewaytest.WaitFor(t, "the released Pod runs", 30*time.Second, func() bool {
		p := get("held")
		return p.Status.PodIP != "" && p.Status.Phase == corev1.PodRunning
	})
}
