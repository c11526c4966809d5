// Package livecluster makes the test control plane a live cluster, as the
// gateway conformance runs need one: Deployments get scheduled Pods that
// run, Services get EndpointSlices and addresses that answer, and
// LoadBalancer Services get an ingress address.
//
// The real kube-controller-manager (deployment, replicaset, endpointslice,
// garbage-collector and namespace controllers) and kube-scheduler, built by
// hack/controlplane.sh, do the controllers' work. The kubelet and kube-proxy
// cannot run here (no container runtime, no iptables), so a node agent
// stands in for both, written from their documented behaviour:
//   - as the kubelet, it runs each Pod bound to its Node as local processes,
//     one per container whose image it knows (Config.Images), bound to the
//     Pod's own IP, with the container's environment (downward-API fields
//     resolved, $(VAR) expanded in args); it reports the Pod Running with
//     its IP, Ready once every declared container port accepts
//     connections, and deletes a terminating Pod once its processes ended;
//   - as kube-proxy, it forwards each Service's cluster IP, and each
//     LoadBalancer Service's ingress address, port by port to the ready
//     endpoints of its EndpointSlices, refusing connections (a reset) when
//     there are none.
//
// Everything runs inside the test's network namespace: SetUpAddresses makes
// the Pod, Service and load-balancer ranges local there, so a process can
// bind any address in them and nothing outside the namespace is reached.
package livecluster

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/infergate/infergate/test/gatewaytest"
)

// Address ranges inside the test's namespace. ServiceCIDR is the API
// server's (envtest's) service-cluster-ip-range.
const (
	PodCIDR          = "10.244.0.0/16"
	ServiceCIDR      = "10.0.0.0/24"
	LoadBalancerCIDR = "10.96.0.0/24"
)

// NodeName is the one Node; NodeIP its address.
const (
	NodeName = "infergate-node"
	NodeIP   = "10.244.0.1"
)

// SetUpAddresses makes the three ranges local to the namespace (any
// address in them can be bound); call it from the namespace set-up, with
// the loopback up.
func SetUpAddresses() error {
	for _, cidr := range []string{PodCIDR, ServiceCIDR, LoadBalancerCIDR} {
		if err := gatewaytest.IP("route", "add", "local", cidr, "dev", "lo"); err != nil {
			return err
		}
	}
	return nil
}

// Config says how the node runs Pods.
type Config struct {
	// Images maps a container image to the program that runs it; the
	// container's args follow (its command is ignored). Containers of
	// other images get no process: the Pod still runs, for a test to serve
	// its address itself (a gateway's Envoy, which the stand-in plays).
	Images map[string]string
	// Env is added to every process's environment (e.g. KUBECONFIG, as a
	// Pod's service-account credentials).
	Env []string
	// Hold, when set, keeps a scheduled Pod Pending, with no address and
	// no process, for as long as it returns true; the node asks again at
	// each sync (every 200 ms, from one goroutine). A real node takes
	// seconds to start a Pod (sandbox, image pull), this one 200 ms: a run
	// whose control plane depends on that order says so here.
	Hold func(ctx context.Context, c client.Client, p *corev1.Pod) bool
}

// Live is a running live cluster.
type Live struct {
	*gatewaytest.Cluster
	agent *agent
	proxy *proxy
}

// Start runs the controller-manager and the scheduler against c, registers
// the Node and runs its agent, until the test ends.
func Start(t *testing.T, c *gatewaytest.Cluster, cfg Config) *Live {
	t.Helper()
	bin := gatewaytest.Built(t, "KUBEBUILDER_ASSETS", "controlplane.sh")
	c.Run(t, "kube-controller-manager", nil, filepath.Join(bin, "kube-controller-manager"),
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--controllers=deployment-controller,replicaset-controller,endpointslice-controller,garbage-collector-controller,namespace-controller",
		"--use-service-account-credentials=false", "--concurrent-service-endpoint-syncs=5",
		"--endpoint-updates-batch-period=0s")
	c.Run(t, "kube-scheduler", nil, filepath.Join(bin, "kube-scheduler"),
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false", "--secure-port=0")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := registerNode(ctx, c); err != nil {
		t.Fatal(err)
	}
	l := &Live{Cluster: c, agent: newAgent(c, cfg, t.TempDir()), proxy: newProxy(c)}
	agentDone, proxyDone := make(chan struct{}), make(chan struct{})
	go func() { l.agent.run(ctx); close(agentDone) }()
	go func() { l.proxy.run(ctx); close(proxyDone) }()
	t.Cleanup(func() {
		cancel()
		<-agentDone
		<-proxyDone
		if t.Failed() {
			t.Log(l.pods() + l.agent.tails())
		}
	})
	return l
}

// registerNode creates the Node with room for every Pod a run makes, and
// reports it Ready (nothing else would: no node lifecycle controller runs).
func registerNode(ctx context.Context, c *gatewaytest.Cluster) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName, Labels: map[string]string{
		"kubernetes.io/hostname": NodeName, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
	}}, Spec: corev1.NodeSpec{PodCIDR: PodCIDR, PodCIDRs: []string{PodCIDR}}}
	if err := c.Client.Create(ctx, n); err != nil {
		return fmt.Errorf("create node: %w", err)
	}
	room := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods: resource.MustParse("500"),
	}
	now := metav1.Now()
	n.Status = corev1.NodeStatus{
		Capacity: room, Allocatable: room,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "infergate node agent", LastHeartbeatTime: now, LastTransitionTime: now}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: NodeIP}, {Type: corev1.NodeHostName, Address: NodeName}},
	}
	if err := c.Client.Status().Update(ctx, n); err != nil {
		return fmt.Errorf("node status: %w", err)
	}
	// The API server taints a new Node not-ready; the node lifecycle
	// controller, which would lift it once the Node reports Ready, is not
	// run (it would also evict Pods of a Node without a kubelet lease).
	n.Spec.Taints = nil
	if err := c.Client.Update(ctx, n); err != nil {
		return fmt.Errorf("node taints: %w", err)
	}
	return nil
}

// Lookup resolves a Service's cluster DNS name (name.namespace.svc, with or
// without .cluster.local) to its cluster IP, for the Envoy stand-in.
func (l *Live) Lookup(ctx context.Context, host string) ([]string, error) {
	ip, err := l.proxy.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	return []string{ip}, nil
}

// pods lists every Pod with its node, phase and IP, for a failed test.
func (l *Live) pods() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list corev1.PodList
	if err := l.Client.List(ctx, &list); err != nil {
		return fmt.Sprintf("pods: %v\n", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d pods:\n", len(list.Items))
	for _, p := range list.Items {
		ready := "false"
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				ready = string(c.Status)
			}
		}
		fmt.Fprintf(&b, "  %s/%s node=%q phase=%s ready=%s ip=%s\n", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase, ready, p.Status.PodIP)
	}
	var slices discoveryv1.EndpointSliceList
	if err := l.Client.List(ctx, &slices); err != nil {
		return b.String()
	}
	fmt.Fprintf(&b, "%d endpoint slices:\n", len(slices.Items))
	for _, s := range slices.Items {
		var eps []string
		for _, e := range s.Endpoints {
			eps = append(eps, fmt.Sprintf("%v ready=%v", e.Addresses, e.Conditions.Ready != nil && *e.Conditions.Ready))
		}
		fmt.Fprintf(&b, "  %s/%s %v\n", s.Namespace, s.Name, eps)
	}
	return b.String()
}

// ip4 returns the n-th address of cidr (n from 0).
func ip4(cidr string, n int) string {
	_, ipn, err := net.ParseCIDR(cidr)
	if err != nil {
		panic(err) // the constants above
	}
	ip := ipn.IP.To4()
	v := uint32(ip[0])<<24 | uint32(ip[1])<<16 | uint32(ip[2])<<8 | uint32(ip[3])
	v += uint32(n)
	return net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v)).String()
}
