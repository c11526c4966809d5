package envoygateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/controlplane"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/loopback"
)

// modelServers runs simulators as the pool's pods: app=<pool> pods whose
// IPs (127.0.1.x, inside the namespace) the simulators listen on.
func (c *cluster) modelServers(t *testing.T, ns, pool string, n int) map[string]string {
	t.Helper()
	return c.modelServersFrom(t, ns, pool, 0, n)
}

// modelServersFrom is modelServers for pods first … first+n-1.
func (c *cluster) modelServersFrom(t *testing.T, ns, pool string, first, n int) map[string]string {
	t.Helper()
	byAddr := map[string]string{}
	for i := first; i < first+n; i++ {
		name := fmt.Sprintf("%s-%d", pool, i)
		ip := fmt.Sprintf("127.0.1.%d", i+1)
		s, err := sim.New(sim.Config{Name: name, TimeScale: 50})
		if err != nil {
			t.Fatal(err)
		}
		addr := loopback.ServeAt(t, ip+":8000", s.Serve)
		if _, err := controlplane.CreatePod(gatewaytest.Ctx(t), c.Client, ns, name, map[string]string{"app": pool}, ip, true); err != nil {
			t.Fatal(err)
		}
		byAddr[addr] = name
	}
	return byAddr
}

// standIn runs the Envoy stand-in as the Gateway's Envoy: an xDS node of
// Envoy Gateway, with the certificate Envoy Gateway issued, whose node
// cluster names the Gateway.
func (c *cluster) standIn(t *testing.T, ns, gateway string, pools ...string) *envoysim.Node {
	t.Helper()
	// The pickers' Service names resolve to the picker's address, for an
	// extension without EDS; no other name resolves (there is no DNS
	// server in the namespace).
	resolve := map[string]string{}
	for _, p := range append([]string{"llama"}, pools...) {
		resolve[fmt.Sprintf("%s-epp.%s.svc.cluster.local", p, ns)] = pickerIP
	}
	return gatewaytest.StandIn(t, envoysim.NodeConfig{
		XDS: xdsclient.Config{
			Server: gatewaytest.EnvoyGatewayXDS, NodeID: "envoy-" + gateway, NodeCluster: ns + "/" + gateway, TLS: gatewaytest.EnvoyGatewayTLS(t, c.Cluster),
		},
		BootstrapClusters: gatewaytest.EnvoyGatewayBootstrapClusters(t),
		FreePorts:         true,
		Resolve:           resolve,
		ResolveOnly:       true,
		Timeouts:          envoysim.Timeouts{Route: 20 * time.Second, Connect: time.Second, Shutdown: time.Second},
		DebugMetadata:     true,
	})
}

// pickerAddr is where the pools' picker listens: the pools'
// endpointPickerRef port, at an address of the namespace's bridge that the
// pickers' EndpointSlices (pickerObjects) name.
const (
	pickerIP   = "192.0.2.2"
	pickerAddr = pickerIP + ":9002"
)

// post sends a completion to base's /v1/completions.
func post(t *testing.T, base string) gatewaytest.Reply {
	t.Helper()
	return postPath(t, base, "/v1/completions")
}

// postPath sends a completion to base's path.
func postPath(t *testing.T, base, path string) gatewaytest.Reply {
	t.Helper()
	return gatewaytest.Send(t, http.MethodPost, base+path, `{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Say hello","max_tokens":4}`)
}

// TestTrafficThroughEnvoyGatewayXDS: the stand-in takes its configuration
// from Envoy Gateway's xDS server, as the Gateway's Envoy would; requests
// reach the simulator the picker chose; with the picker stopped the
// FailOpen pool still answers from its endpoints; flipping the live pool
// to FailClose reaches the xDS and the same outage answers 500.
func TestTrafficThroughEnvoyGatewayXDS(t *testing.T) {
	c := startCluster(t)
	c.startEG(t, c.startExtension(t))
	ns := "traffic"
	c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	servers := c.modelServers(t, ns, "llama", 3)
	stopPicker := gatewaytest.StartPicker(t, pickerAddr, servers)
	c.create(t, gatewayObjects(ns)...)
	c.create(t, pickerObjects(ns, "llama")...)
	c.create(t, inferencePool(ns, "llama", inferencev1.EndpointPickerFailOpen), poolRoute(ns, "llm-route", "llama"))
	if cond := c.routeCondition(t, ns, "llm-route", "ResolvedRefs"); cond.Status != metav1.ConditionTrue {
		t.Fatalf("ResolvedRefs = %s %s (%s)", cond.Status, cond.Reason, cond.Message)
	}
	n := c.standIn(t, ns, "inference-gateway")
	listener := ns + "/inference-gateway/http"
	var base string
	gatewaytest.WaitFor(t, "the stand-in serves Envoy Gateway's listener "+listener, 60*time.Second, func() bool {
		for typ, st := range n.XDS().Status() {
			if st.NACKs > 0 {
				t.Fatalf("stand-in NACKed Envoy Gateway's %s: %s", typ, st.LastError)
			}
		}
		addr, ok := n.ListenerAddr(listener)
		base = "http://" + addr
		return ok
	})
	for range 20 {
		r := post(t, base)
		if r.Status != 200 || r.Picked == "" || r.Picked != r.Upstream || servers[r.Upstream] != r.Pod {
			t.Fatalf("%d %q: picker chose %q, went to %q, %q answered", r.Status, r.Body, r.Picked, r.Upstream, r.Pod)
		}
	}
	stopPicker()
	for range 6 {
		if r := post(t, base); r.Status != 200 || servers[r.Upstream] == "" {
			t.Fatalf("FailOpen, picker stopped: %d via %q: %s", r.Status, r.Upstream, r.Body)
		}
	}
	// Scale out while the picker is down: Envoy Gateway translates nothing
	// (it does not watch the pool's pods), yet the new pod takes its share
	// of the FailOpen round robin, through the extension's EDS.
	for addr, name := range c.modelServersFrom(t, ns, "llama", 3, 1) {
		servers[addr] = name
		gatewaytest.WaitFor(t, "the scaled-out pod "+name+" serves", 30*time.Second, func() bool {
			r := post(t, base)
			if r.Status != 200 {
				t.Fatalf("during the scale-out: %d %s", r.Status, r.Body)
			}
			return r.Upstream == addr
		})
	}
	var pool inferencev1.InferencePool
	c.change(t, client.ObjectKey{Namespace: ns, Name: "llama"}, &pool, func() {
		pool.Spec.EndpointPickerRef.FailureMode = inferencev1.EndpointPickerFailClose
	})
	gatewaytest.WaitFor(t, "FailClose reaches the xDS", 60*time.Second, func() bool { return post(t, base).Status == 500 })
}

// flakyEndpoints is the extension's endpoint source with a switch that
// makes it fail, as a Kubernetes API outage would.
type flakyEndpoints struct {
	inner envoygateway.Endpoints
	fail  atomic.Bool
}

func (f *flakyEndpoints) Endpoints(ctx context.Context, p *envoygateway.Pool) ([]string, error) {
	if f.fail.Load() {
		return nil, errors.New("pods cannot be listed")
	}
	return f.inner.Endpoints(ctx, p)
}

// TestHookErrorKeepsTheLastConfig: when the extension cannot answer a hook
// (here: the pool's endpoints cannot be read, without --eds-address),
// Envoy Gateway keeps serving the configuration it had; once the
// extension recovers, the next translation goes through.
func TestHookErrorKeepsTheLastConfig(t *testing.T) {
	c := startCluster(t)
	eps := &flakyEndpoints{inner: envoygateway.KubeEndpoints{Reader: c.Client}}
	g := grpc.NewServer()
	envoygateway.NewServer(eps, nil, envoygateway.Config{}, logr.Discard()).Register(g)
	ext := loopback.Serve(t, func(ctx context.Context, ln net.Listener) error {
		go func() { <-ctx.Done(); g.Stop() }()
		return g.Serve(ln)
	})
	c.startEG(t, ext)
	ns := "hookerror"
	c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	servers := c.modelServers(t, ns, "llama", 2)
	stopPicker := gatewaytest.StartPicker(t, pickerAddr, servers)
	c.create(t, gatewayObjects(ns)...)
	c.create(t, pickerObjects(ns, "llama")...)
	c.create(t, inferencePool(ns, "llama", inferencev1.EndpointPickerFailOpen), poolRoute(ns, "llm-route", "llama"))
	c.routeCondition(t, ns, "llm-route", "ResolvedRefs")
	n := c.standIn(t, ns, "inference-gateway")
	var base string
	gatewaytest.WaitFor(t, "the Gateway's listener", 60*time.Second, func() bool {
		addr, ok := n.ListenerAddr(ns + "/inference-gateway/http")
		base = "http://" + addr
		return ok
	})
	if r := post(t, base); r.Status != 200 {
		t.Fatalf("before: %d %s", r.Status, r.Body)
	}
	before := n.XDS().Status()

	eps.fail.Store(true)
	setFailureMode(t, c, ns, "llama", inferencev1.EndpointPickerFailClose)
	stopPicker()
	// Give Envoy Gateway time to translate (and fail); the config in use
	// must stay the FailOpen one.
	time.Sleep(3 * time.Second)
	for range 4 {
		if r := post(t, base); r.Status != 200 {
			t.Fatalf("while the hook fails the last config must stay (FailOpen): %d %s", r.Status, r.Body)
		}
	}
	if now := n.XDS().Status(); now[xdsclient.ClusterType].Version != before[xdsclient.ClusterType].Version {
		t.Errorf("Envoy Gateway published clusters %s → %s while the hook failed", before[xdsclient.ClusterType].Version, now[xdsclient.ClusterType].Version)
	}

	// Envoy Gateway does not retry a failed translation by itself, and an
	// annotation does not make it translate again (it watches
	// generations): a spec change does.
	eps.fail.Store(false)
	var route gatewayv1.HTTPRoute
	timeout := gatewayv1.Duration("300s")
	c.change(t, client.ObjectKey{Namespace: ns, Name: "llm-route"}, &route, func() {
		route.Spec.Rules[0].Timeouts = &gatewayv1.HTTPRouteTimeouts{Request: &timeout}
	})
	gatewaytest.WaitFor(t, "the recovered translation (FailClose) reaches the xDS", 60*time.Second, func() bool { return post(t, base).Status == 500 })
}

func setFailureMode(t *testing.T, c *cluster, ns, name string, mode inferencev1.EndpointPickerFailureMode) {
	t.Helper()
	var pool inferencev1.InferencePool
	c.change(t, client.ObjectKey{Namespace: ns, Name: name}, &pool, func() { pool.Spec.EndpointPickerRef.FailureMode = mode })
}
