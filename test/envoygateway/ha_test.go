package envoygateway

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/loopback"
)

// startReplica runs one replica of the extension with leader election in
// ns, until stop or the test's end; it returns its address.
func (c *cluster) startReplica(t *testing.T, ns string) (addr string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	addr = loopback.Serve(t, func(sctx context.Context, ln net.Listener) error {
		defer close(done)
		ctx, cancel2 := context.WithCancel(ctx)
		defer cancel2()
		go func() { <-sctx.Done(); cancel2() }()
		return envoygateway.Run(ctx, envoygateway.Options{Listener: ln, EDSAddress: ln.Addr().String(), Kube: c.Env.Config,
			Logger: logr.Discard(), LeaderElectionNamespace: ns})
	})
	return addr, func() { cancel(); <-done }
}

// assignment asks the EDS service at addr for one load assignment.
func assignment(t *testing.T, addr, name string) *endpointv3.ClusterLoadAssignment {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(gatewaytest.Ctx(t), 10*time.Second)
	defer cancel()
	s, err := endpointservice.NewEndpointDiscoveryServiceClient(conn).StreamEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "ha-test"}, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatalf("EDS at %s: %v", addr, err)
	}
	for _, r := range resp.GetResources() {
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := r.UnmarshalTo(cla); err == nil && cla.GetClusterName() == name {
			return cla
		}
	}
	return nil
}

func hosts(cla *endpointv3.ClusterLoadAssignment) []string {
	var out []string
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			out = append(out, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
		}
	}
	slices.Sort(out)
	return out
}

// TestExtensionReplicas: two replicas of the extension run side by side.
// Both serve EDS, the pools' endpoints and their pickers' replicas (one
// host per ready address of the picker Service), whether they lead or
// not; the first holds the status Lease and writes pool status, and when
// it stops the other takes the Lease and writes the status of a pool
// created after.
func TestExtensionReplicas(t *testing.T) {
	c := startCluster(t)
	const home = "infergate-system"
	c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: home}})
	// The first replica starts alone, so it takes the Lease; Envoy
	// Gateway calls the second (the route's acceptance, which the pool's
	// status reports, comes from Envoy Gateway).
	first, stopFirst := c.startReplica(t, home)
	gatewaytest.WaitFor(t, "the first replica to take the Lease", 30*time.Second, func() bool {
		var l coordinationv1.Lease
		err := c.Client.Get(gatewaytest.Ctx(t), client.ObjectKey{Namespace: home, Name: envoygateway.LeaderElectionID}, &l)
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
	})
	second, _ := c.startReplica(t, home)
	c.startEG(t, second)
	ns := "replicas"
	c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	c.create(t, gatewayObjects(ns)...)
	c.create(t, pickerObjects(ns, "llama")...)
	c.create(t, inferencePool(ns, "llama", inferencev1.EndpointPickerFailOpen), poolRoute(ns, "llm-route", "llama"))
	c.poolParent(t, ns, "llama", "inference-gateway", "written by the first replica", func(a, r *metav1.Condition) bool {
		return a != nil && r != nil && r.Status == metav1.ConditionTrue
	})

	pool := &envoygateway.Pool{Namespace: ns, Name: "llama"}
	want := []string{pickerAddr}
	for _, addr := range []string{first, second} {
		gatewaytest.WaitFor(t, "the picker's replicas over EDS from "+addr, 30*time.Second, func() bool {
			return slices.Equal(hosts(assignment(t, addr, envoygateway.PickerEDSName(pool))), want)
		})
	}

	stopFirst()
	c.create(t, inferencePool(ns, "qwen", inferencev1.EndpointPickerFailOpen), poolRoute(ns, "qwen-route", "qwen"))
	c.poolParent(t, ns, "qwen", "inference-gateway", "written by the second replica once the first stopped", func(a, r *metav1.Condition) bool {
		return a != nil && a.Status == metav1.ConditionTrue
	})
	if got := hosts(assignment(t, second, envoygateway.PickerEDSName(pool))); !slices.Equal(got, want) {
		t.Fatalf("the second replica serves the picker's hosts %v, want %v", got, want)
	}
}

// TestProxyStartsWhileTheExtensionIsDown: a proxy that starts while no
// replica of the extension answers gets its listeners and clusters from
// Envoy Gateway, but no endpoints: its pool and picker clusters warm for
// the EDS source's initial fetch timeout (15 s), then serve with none: a
// FailOpen pool answers 503 ("no healthy upstream", nothing to fall back
// on), a FailClose pool 500 (no picker host). Once the extension is back,
// within Envoy's EDS retry back-off (30 s at most), the pool is routed by
// its picker again. It prints what the requests got.
func TestProxyStartsWhileTheExtensionIsDown(t *testing.T) {
	for _, mode := range []inferencev1.EndpointPickerFailureMode{inferencev1.EndpointPickerFailOpen, inferencev1.EndpointPickerFailClose} {
		t.Run(string(mode), func(t *testing.T) { proxyStartsWithoutExtension(t, mode) })
	}
}

func proxyStartsWithoutExtension(t *testing.T, mode inferencev1.EndpointPickerFailureMode) {
	c := startCluster(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	// The extension at addr, until stop.
	serve := func(ln net.Listener) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = envoygateway.Run(ctx, envoygateway.Options{Listener: ln, EDSAddress: addr, Kube: c.Env.Config, Logger: logr.Discard()})
		}()
		stop = func() { cancel(); <-done }
		t.Cleanup(stop)
		return stop
	}
	stopExtension := serve(ln)
	c.startEG(t, addr)
	ns := "extdown"
	c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	servers := c.modelServers(t, ns, "llama", 2)
	gatewaytest.StartPicker(t, pickerAddr, servers)
	c.create(t, gatewayObjects(ns)...)
	c.create(t, pickerObjects(ns, "llama")...)
	c.create(t, inferencePool(ns, "llama", mode), poolRoute(ns, "llm-route", "llama"))
	c.routeCondition(t, ns, "llm-route", "ResolvedRefs")
	// Envoy Gateway has translated the pool (its hooks answered); now the
	// extension goes away and a proxy starts.
	x := c.captureXDS(t, ns, "inference-gateway")
	gatewaytest.WaitFor(t, "Envoy Gateway's translation of the pool", 60*time.Second, func() bool {
		x.Mu.Lock()
		defer x.Mu.Unlock()
		_, ok := x.Clusters[envoygateway.EPPClusterName(&envoygateway.Pool{Namespace: ns, Name: "llama"})]
		return ok
	})
	stopExtension()
	start := time.Now()
	n := c.standIn(t, ns, "inference-gateway")
	var base string
	gatewaytest.WaitFor(t, "the proxy's listener", 60*time.Second, func() bool {
		a, ok := n.ListenerAddr(ns + "/inference-gateway/http")
		base = "http://" + a
		return ok
	})
	listening := time.Since(start)
	type result struct {
		at     time.Duration
		status int
		picked bool
	}
	var results []result
	send := func() result {
		r := post(t, base)
		res := result{at: time.Since(start), status: r.Status, picked: r.Picked != "" && servers[r.Upstream] != ""}
		results = append(results, res)
		return res
	}
	down := map[inferencev1.EndpointPickerFailureMode]int{inferencev1.EndpointPickerFailOpen: 503, inferencev1.EndpointPickerFailClose: 500}[mode]
	for time.Since(start) < 20*time.Second {
		if r := send(); r.status != down {
			t.Fatalf("%d at %v with the extension down, want %d", r.status, r.at, down)
		}
		time.Sleep(200 * time.Millisecond)
	}
	back := time.Since(start)
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the extension's address again: %v", err)
	}
	serve(ln2)
	var recovered time.Duration
	for time.Since(start) < back+45*time.Second {
		if r := send(); r.status == 200 && r.picked {
			recovered = r.at
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	byStatus := map[int]int{}
	for _, r := range results {
		byStatus[r.status]++
	}
	fmt.Printf("faults: %-32s %-9s listener after %.1fs; extension back at %.1fs; picked again at %.1fs (%.1fs after); sent %d, by status %v\n",
		"TestProxyStartsWhileTheExtensionIsDown", mode, listening.Seconds(), back.Seconds(), recovered.Seconds(), (recovered - back).Seconds(), len(results), byStatus)
	if recovered == 0 {
		t.Fatalf("not routed by the picker 45 s after the extension came back (%d requests, by status %v)", len(results), byStatus)
	}
	if d := recovered - back; d > 30*time.Second+5*time.Second {
		t.Errorf("routed again %v after the extension came back, want within Envoy's 30 s EDS back-off", d)
	}
}
