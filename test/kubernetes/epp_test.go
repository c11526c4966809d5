// Package kubernetes tests the endpoint picker in Kubernetes mode against a
// real kube-apiserver and etcd (envtest; see test/controlplane). The API
// server runs no kubelet, so the tests create Pods and set their status;
// each fake Pod gets its own 127.0.0.0/8 address with a simulator bound to
// it, so requests go through the Envoy stand-in and the picker to real servers.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/extproc/epp"
	"github.com/infergate/infergate/extproc/epp/kube"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/controlplane"
	"github.com/infergate/infergate/test/loopback"
)

// fixture is shared by the tests of this binary: one control plane, and
// the next free pod address.
type fixture struct {
	env    *controlplane.Env
	client client.Client
	nextIP atomic.Int32
	nextNS atomic.Int32
}

var fx fixture // set once in TestMain, read by the tests

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	// The InferenceObjective CRD infergate ships.
	env, err := controlplane.Start(ctx, "../../config/crd")
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "control plane:", err)
		os.Exit(1)
	}
	scheme, err := controlplane.Scheme()
	if err == nil {
		fx.client, err = client.New(env.Config, client.Options{Scheme: scheme})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = env.Stop()
		os.Exit(1)
	}
	fx.env = env
	fx.nextIP.Store(1)
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
	}
	os.Exit(code)
}

// namespace creates a namespace of its own for a test.
func namespace(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("t%d", fx.nextNS.Add(1))
	if err := fx.client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	return name
}

// podIP hands out 127.0.0.2, 127.0.0.3, …
func podIP() string {
	n := fx.nextIP.Add(1)
	return fmt.Sprintf("127.0.%d.%d", n/250, n%250+2)
}

// freePort finds a port that is free on 127.0.0.1; other loopback
// addresses have their own port space, so it is free there too.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startSim runs a simulator named like its pod at ip:port, serving the
// default model and the given LoRA adapters.
func startSim(t *testing.T, name, ip string, port int, adapters ...string) *sim.Server {
	t.Helper()
	s, err := sim.New(sim.Config{Name: name, TimeScale: 50, LoRAAdapters: adapters})
	if err != nil {
		t.Fatal(err)
	}
	loopback.ServeAt(t, net.JoinHostPort(ip, strconv.Itoa(port)), s.Serve)
	return s
}

func createPool(t *testing.T, ns, name string, selector map[string]string, ports ...int) *inferencev1.InferencePool {
	t.Helper()
	p := &inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	p.Spec.Selector.MatchLabels = map[inferencev1.LabelKey]inferencev1.LabelValue{}
	for k, v := range selector {
		p.Spec.Selector.MatchLabels[inferencev1.LabelKey(k)] = inferencev1.LabelValue(v)
	}
	for _, port := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, inferencev1.Port{Number: inferencev1.PortNumber(port)})
	}
	if err := fx.client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

// picker is an endpoint picker in Kubernetes mode, run in-process.
type picker struct {
	*epp.Service
	ready func() bool
	stop  func() // stops the picker and waits for it; also run at cleanup
}

func startPicker(t *testing.T, cfg *rest.Config, ns, pool string, leaderElection bool) *picker {
	t.Helper()
	s, err := epp.NewService(epp.Config{
		Server:           server.Options{GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", DrainTimeout: time.Second},
		Kube:             &epp.KubeConfig{RestConfig: cfg, Namespace: ns, PoolName: pool, LeaderElection: leaderElection},
		MetricsStaleness: 2 * time.Second,
		Logger:           logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("picker: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	conn, err := grpc.NewClient(s.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	health := healthpb.NewHealthClient(conn)
	return &picker{Service: s, stop: stop, ready: func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: server.HealthReadiness})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}}
}

func (p *picker) addresses() []string {
	var out []string
	for _, e := range p.Store().Endpoints() {
		out = append(out, e.Address)
	}
	return out
}

// eventually retries check for up to 15 s.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func wantAddresses(p *picker, want ...string) func() error {
	return func() error {
		got := p.addresses()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("endpoints %v, want %v", got, want)
		}
		return nil
	}
}

// proxy runs the stand-in in front of the picker once it is ready: the
// stand-in health-checks the picker as a gateway does, and one that finds
// it not ready yet takes it in only at its next check, 2 s on.
func proxy(t *testing.T, picker *picker) string {
	t.Helper()
	eventually(t, "the picker ready", func() error {
		if !picker.ready() {
			return errors.New("not ready")
		}
		return nil
	})
	p, err := envoysim.New(envoysim.Config{
		Filters:  []extprocfilter.FilterConfig{{Name: "epp", Target: picker.GRPCAddr()}},
		Timeouts: envoysim.Timeouts{Route: 10 * time.Second, Connect: time.Second, Shutdown: time.Second},
		Logger:   logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + loopback.Serve(t, p.Serve)
}

// chat sends one request for the default model through the proxy and
// returns the status and the pod that answered; headers are name, value pairs.
func chat(t *testing.T, base string, headers ...string) (int, string) {
	t.Helper()
	status, pod, _ := chatModel(t, base, sim.DefaultModel, headers...)
	return status, pod
}

// chatModel is chat for a given model; it also returns the response body.
func chatModel(t *testing.T, base, model string, headers ...string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("x-inference-pod"), string(body)
}

// TestPoolLifecycle follows one pool through the changes a cluster makes:
// pods appearing, readiness flips, an IP change, a selector change, and
// the pool's deletion and return; requests through the proxy reach the
// pods the picker sees, and get 503 while there is no pool.
func TestPoolLifecycle(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	port := freePort(t)
	labels := map[string]string{"app": "model"}
	ipA, ipB, ipC := podIP(), podIP(), podIP()
	for name, ip := range map[string]string{"pod-a": ipA, "pod-b": ipB, "pod-c": ipC} {
		startSim(t, name, ip, port)
	}
	ep := func(ip string) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

	p := startPicker(t, fx.env.Config, ns, "pool", false)
	base := proxy(t, p)

	// No pool yet: ready (synced) with no endpoints, and requests get 503.
	eventually(t, "ready without a pool", func() error {
		if !p.ready() {
			return errors.New("not ready")
		}
		return nil
	})
	if status, _ := chat(t, base); status != http.StatusServiceUnavailable {
		t.Fatalf("without a pool: status %d, want 503", status)
	}

	createPool(t, ns, "pool", labels, port)
	podA, err := controlplane.CreatePod(ctx, fx.client, ns, "pod-a", labels, ipA, true)
	if err != nil {
		t.Fatal(err)
	}
	podB, err := controlplane.CreatePod(ctx, fx.client, ns, "pod-b", labels, ipB, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := controlplane.CreatePod(ctx, fx.client, ns, "other", map[string]string{"app": "other"}, podIP(), true); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pods appear", wantAddresses(p, ep(ipA), ep(ipB)))
	seen := map[string]bool{}
	eventually(t, "both pods serve", func() error {
		status, pod := chat(t, base)
		if status != 200 {
			return fmt.Errorf("status %d", status)
		}
		seen[pod] = true
		if !seen["pod-a"] || !seen["pod-b"] {
			return fmt.Errorf("answered by %v so far", seen)
		}
		return nil
	})

	// Readiness flips.
	if err := controlplane.SetPodStatus(ctx, fx.client, podB, ipB, false); err != nil {
		t.Fatal(err)
	}
	eventually(t, "unready pod removed", wantAddresses(p, ep(ipA)))
	for range 5 {
		if status, pod := chat(t, base); status != 200 || pod != "pod-a" {
			t.Fatalf("with pod-b unready: status %d from %q", status, pod)
		}
	}
	if err := controlplane.SetPodStatus(ctx, fx.client, podB, ipB, true); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready again", wantAddresses(p, ep(ipA), ep(ipB)))

	// An IP change replaces the endpoint.
	if err := controlplane.SetPodStatus(ctx, fx.client, podA, ipC, true); err != nil {
		t.Fatal(err)
	}
	eventually(t, "IP change", wantAddresses(p, ep(ipB), ep(ipC)))

	// The selector changes: now only pods labelled tier=gold.
	podB.Labels["tier"] = "gold"
	if err := fx.client.Update(ctx, podB); err != nil {
		t.Fatal(err)
	}
	var pool inferencev1.InferencePool
	if err := fx.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool"}, &pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.Selector.MatchLabels["tier"] = "gold"
	if err := fx.client.Update(ctx, &pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, "selector change", wantAddresses(p, ep(ipB)))

	// Deleting the pool empties the set: 503 until it returns.
	if err := fx.client.Delete(ctx, &pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pool deleted", wantAddresses(p))
	if status, _ := chat(t, base); status != http.StatusServiceUnavailable {
		t.Fatalf("after the pool was deleted: status %d, want 503", status)
	}
	createPool(t, ns, "pool", labels, port)
	eventually(t, "pool back", wantAddresses(p, ep(ipB), ep(ipC)))
	if !p.ready() {
		t.Error("picker not ready after the pool came back")
	}
}

// TestObjectivesSetPriorities creates InferenceObjectives for the pool
// with the pool saturated: the sheddable objective's requests get 429,
// others are served, and raising its priority lets them through.
func TestObjectivesSetPriorities(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	port := freePort(t)
	ip := podIP()
	s := startSim(t, "busy", ip, port)
	full := 1.0
	s.SetFakeMetrics(&sim.FakeMetrics{KVCacheUsage: &full}) // saturated
	labels := map[string]string{"app": "busy"}
	createPool(t, ns, "pool", labels, port)
	if _, err := controlplane.CreatePod(ctx, fx.client, ns, "busy", labels, ip, true); err != nil {
		t.Fatal(err)
	}
	objective := func(name, pool string, priority int64) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"spec": map[string]any{"poolRef": map[string]any{"name": pool}, "priority": priority},
		}}
		u.SetGroupVersionKind(kube.ObjectiveGVK)
		u.SetNamespace(ns)
		u.SetName(name)
		return u
	}
	batch := objective("batch", "pool", -1)
	if err := fx.client.Create(ctx, batch); err != nil {
		t.Fatal(err)
	}
	// Same name pattern, other pool: must not apply here.
	if err := fx.client.Create(ctx, objective("other-pools-batch", "elsewhere", -5)); err != nil {
		t.Fatal(err)
	}
	p := startPicker(t, fx.env.Config, ns, "pool", false)
	base := proxy(t, p)
	eventually(t, "sheddable objective refused when saturated", func() error {
		if status, _ := chat(t, base, "x-llm-d-inference-objective", "batch"); status != http.StatusTooManyRequests {
			return fmt.Errorf("batch: status %d, want 429", status)
		}
		return nil
	})
	for _, obj := range []string{"interactive", "other-pools-batch"} {
		if status, _ := chat(t, base, "x-llm-d-inference-objective", obj); status != 200 {
			t.Errorf("%s: status %d, want 200 (priority 0 here)", obj, status)
		}
	}
	if err := unstructured.SetNestedField(batch.Object, int64(0), "spec", "priority"); err != nil {
		t.Fatal(err)
	}
	if err := fx.client.Update(ctx, batch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "priority raised", func() error {
		if status, _ := chat(t, base, "x-gateway-inference-objective", "batch"); status != 200 {
			return fmt.Errorf("batch: status %d, want 200", status)
		}
		return nil
	})
}

// TestModelRewrites creates an InferenceModelRewrite that sends all of
// sql-lora's traffic to sql-lora-v2, which is the only adapter the server
// has: requests for sql-lora are served as sql-lora-v2 once the picker
// rewrites the body, and fail again when the rewrite is deleted.
func TestModelRewrites(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	port := freePort(t)
	ip := podIP()
	startSim(t, "lora", ip, port, "sql-lora-v2")
	labels := map[string]string{"app": "lora"}
	createPool(t, ns, "pool", labels, port)
	if _, err := controlplane.CreatePod(ctx, fx.client, ns, "lora", labels, ip, true); err != nil {
		t.Fatal(err)
	}
	p := startPicker(t, fx.env.Config, ns, "pool", false)
	base := proxy(t, p)
	eventually(t, "pool synced", wantAddresses(p, net.JoinHostPort(ip, strconv.Itoa(port))))
	if status, _, _ := chatModel(t, base, "sql-lora"); status != http.StatusNotFound {
		t.Fatalf("without a rewrite: status %d, want the server's 404 for an adapter it lacks", status)
	}
	rw := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"poolRef": map[string]any{"name": "pool"},
		"rules": []any{map[string]any{
			"matches": []any{map[string]any{"model": map[string]any{"value": "sql-lora"}}},
			"targets": []any{map[string]any{"modelRewrite": "sql-lora-v2", "weight": int64(100)}, map[string]any{"modelRewrite": "sql-lora-v3", "weight": int64(0)}},
		}},
	}}}
	rw.SetGroupVersionKind(kube.RewriteGVK)
	rw.SetNamespace(ns)
	rw.SetName("canary")
	if err := fx.client.Create(ctx, rw); err != nil {
		t.Fatal(err)
	}
	eventually(t, "rewritten", func() error {
		status, _, body := chatModel(t, base, "sql-lora")
		if status != 200 || !strings.Contains(body, `"sql-lora-v2"`) {
			return fmt.Errorf("status %d body %.120s", status, body)
		}
		return nil
	})
	if status, _ := chat(t, base); status != 200 {
		t.Errorf("a model no rule names: status %d", status)
	}
	if err := fx.client.Delete(ctx, rw); err != nil {
		t.Fatal(err)
	}
	eventually(t, "rewrite removed", func() error {
		if status, _, _ := chatModel(t, base, "sql-lora"); status != http.StatusNotFound {
			return fmt.Errorf("status %d, want 404 again", status)
		}
		return nil
	})
}

// TestRouteToPoolIsValid checks that the Gateway API CRDs the control
// plane installs accept an HTTPRoute whose backend is an InferencePool,
// the object every gateway integration starts from.
func TestRouteToPoolIsValid(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	createPool(t, ns, "pool", map[string]string{"app": "x"}, 8000)
	group := gatewayv1.Group(inferencev1.GroupName)
	kind := gatewayv1.Kind("InferencePool")
	route := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "inference-gateway"}}},
			Rules: []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{
				BackendObjectReference: gatewayv1.BackendObjectReference{Group: &group, Kind: &kind, Name: "pool"},
			}}}}},
		},
	}
	if err := fx.client.Create(ctx, route); err != nil {
		t.Fatalf("HTTPRoute to an InferencePool refused: %v", err)
	}
}

// TestTargetPortsAreRanks gives the pool two target ports: two endpoints
// per pod, both serving.
func TestTargetPortsAreRanks(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	p0, p1 := freePort(t), freePort(t)
	ip := podIP()
	startSim(t, "dp-pod", ip, p0)
	startSim(t, "dp-pod", ip, p1)
	labels := map[string]string{"app": "dp"}
	createPool(t, ns, "dp", labels, p0, p1)
	if _, err := controlplane.CreatePod(ctx, fx.client, ns, "dp-pod", labels, ip, true); err != nil {
		t.Fatal(err)
	}
	p := startPicker(t, fx.env.Config, ns, "dp", false)
	want := []string{net.JoinHostPort(ip, strconv.Itoa(p0)), net.JoinHostPort(ip, strconv.Itoa(p1))}
	if p1 < p0 {
		want[0], want[1] = want[1], want[0]
	}
	eventually(t, "two ranks", wantAddresses(p, want...))
	var names []string
	for _, e := range p.Store().Endpoints() {
		names = append(names, e.Name)
	}
	if fmt.Sprint(names) != "[dp-pod-rank-0 dp-pod-rank-1]" && fmt.Sprint(names) != "[dp-pod-rank-1 dp-pod-rank-0]" {
		t.Errorf("endpoint names %v", names)
	}
}

// TestLeaderElectionOneReady runs two replicas with leader election: once
// both are up exactly one reports ready; when it stops, the other takes over.
func TestLeaderElectionOneReady(t *testing.T) {
	ns := namespace(t)
	createPool(t, ns, "ha", map[string]string{"app": "ha"}, freePort(t))
	a := startPicker(t, fx.env.Config, ns, "ha", true)
	b := startPicker(t, fx.env.Config, ns, "ha", true)
	eventually(t, "one leader ready", func() error {
		if ra, rb := a.ready(), b.ready(); ra == rb {
			return fmt.Errorf("ready: a=%v b=%v", ra, rb)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond)
	if a.ready() == b.ready() {
		t.Fatalf("after settling both ready=%v", a.ready())
	}
	leader, standby := a, b
	if b.ready() {
		leader, standby = b, a
	}
	stopped := time.Now()
	leader.stop() // releases the Lease on the way out
	eventually(t, "standby takes over", func() error {
		if !standby.ready() {
			return errors.New("standby not ready")
		}
		return nil
	})
	t.Logf("standby ready %v after the leader began to stop", time.Since(stopped).Round(100*time.Millisecond))
}

// TestRoleIsEnough runs the picker as a user bound only to the Role the
// picker needs (pods, InferencePools, Leases in its namespace): it syncs,
// leads and serves, so the Role is sufficient.
func TestRoleIsEnough(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "infergate-epp"}, Rules: kube.RoleRules()}
	if err := fx.client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "infergate-epp"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "epp-" + ns}},
	}
	if err := fx.client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	cfg, err := fx.env.AddUser("epp-"+ns, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	ip := podIP()
	startSim(t, "rbac-pod", ip, port)
	createPool(t, ns, "pool", map[string]string{"app": "rbac"}, port)
	if _, err := controlplane.CreatePod(ctx, fx.client, ns, "rbac-pod", map[string]string{"app": "rbac"}, ip, true); err != nil {
		t.Fatal(err)
	}
	p := startPicker(t, cfg, ns, "pool", true)
	eventually(t, "synced as the Role's user", wantAddresses(p, net.JoinHostPort(ip, strconv.Itoa(port))))
	eventually(t, "leads as the Role's user", func() error {
		if !p.ready() {
			return errors.New("not ready")
		}
		return nil
	})
	base := proxy(t, p)
	if status, pod := chat(t, base); status != 200 || pod != "rbac-pod" {
		t.Fatalf("status %d from %q", status, pod)
	}
}
