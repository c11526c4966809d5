package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/envoysim/xdstest"
	"github.com/infergate/infergate/test/gatewaytest"
)

// startNode runs the stand-in as an xDS node of srv until the test ends and
// returns the base URL of listener once it serves.
func startNode(t testing.TB, srv *xdstest.Server, listener string) (*envoysim.Node, string) {
	t.Helper()
	return startNodeResolving(t, srv, listener, map[string]string{xdstest.EGEPPHost: "127.0.0.1"})
}

// startNodeResolving is startNode with the stand-in's table of host names.
func startNodeResolving(t testing.TB, srv *xdstest.Server, listener string, resolve map[string]string) (*envoysim.Node, string) {
	t.Helper()
	n := gatewaytest.StandIn(t, envoysim.NodeConfig{
		XDS:           xdsclient.Config{Server: srv.Addr, NodeID: xdstest.NodeID},
		FreePorts:     true,
		Resolve:       resolve,
		Timeouts:      envoysim.Timeouts{Route: 10 * time.Second, Connect: time.Second, Shutdown: time.Second},
		DebugMetadata: true,
	})
	return n, gatewaytest.ListenerURL(t, n, listener)
}

// waitVersion waits until the stand-in applied version of typ.
func waitVersion(t *testing.T, n *envoysim.Node, typ, version string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n.XDS().Status()[typ].Version != version {
		if time.Now().After(deadline) {
			t.Fatalf("the stand-in never applied %s version %s: %+v", typ, version, n.XDS().Status()[typ])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// requireNoNACK fails the test with the stand-in's reason for any rejected update.
func requireNoNACK(t *testing.T, n *envoysim.Node) {
	t.Helper()
	for typ, st := range n.XDS().Status() {
		if st.NACKs > 0 {
			t.Fatalf("stand-in NACKed %s version %q: %s", typ, st.RejectedVersion, st.LastError)
		}
	}
}

type gatewayShape struct {
	name     string
	listener string
	build    func(p xdstest.Pool) []proto.Message
	// stoppedOpen is what a request with a body gets when the picker is
	// gone and the pool fails open. Istio's picker cluster is EDS: its
	// control plane takes the stopped pod out (pickerGone), the stream
	// fails at its start and override_host falls back to round robin.
	// This Envoy Gateway shape reaches the picker through a STRICT_DNS
	// cluster without health checks: its one host stays, the connection
	// fails after the body reached the filter, and Envoy answers 500
	// whatever the failure mode (ProcessorState::canFailOpen) — why
	// infergate's own clusters are health checked.
	stoppedOpen int
	// pickerGone is what the control plane sends once the picker's pod is
	// gone (nil: nothing changes).
	pickerGone func(rs []proto.Message) []proto.Message
}

var gatewayShapes = []gatewayShape{
	{name: "Istio", listener: xdstest.IstioListener, build: xdstest.Istio, stoppedOpen: 200, pickerGone: func(rs []proto.Message) []proto.Message {
		out := make([]proto.Message, 0, len(rs))
		for _, r := range rs {
			if cla, ok := r.(*endpointv3.ClusterLoadAssignment); ok && cla.GetClusterName() == xdstest.IstioEPPCluster {
				r = &endpointv3.ClusterLoadAssignment{ClusterName: cla.GetClusterName()}
			}
			out = append(out, r)
		}
		return out
	}},
	{name: "EnvoyGateway", listener: xdstest.EGListener, stoppedOpen: 500, build: func(p xdstest.Pool) []proto.Message {
		return xdstest.EnvoyGateway(p, p.Endpoints[0])
	}},
}

func TestXDSRequestsReachThePickersChoice(t *testing.T) {
	for _, shape := range gatewayShapes {
		for _, failOpen := range []bool{true, false} {
			name := shape.name + map[bool]string{true: "/FailOpen", false: "/FailClose"}[failOpen]
			t.Run(name, func(t *testing.T) {
				sims, pool := newPool(t, 3)
				e := startEPP(t, pool)
				srv := xdstest.Start(t)
				p := xdstest.Pool{EPP: e.GRPCAddr(), EPPTLS: true, FailOpen: failOpen, ListenerPort: 80}
				for _, s := range sims {
					p.Endpoints = append(p.Endpoints, s.addr)
				}
				rs := shape.build(p)
				srv.Set(t, "1", rs...)
				n, base := startNode(t, srv, shape.listener)
				byAddr := map[string]string{}
				for _, s := range sims {
					byAddr[s.addr] = s.name
				}
				served := map[string]int{}
				for range 20 {
					r, err := post(t, base, completion)
					if err != nil {
						t.Fatal(err)
					}
					if r.status != 200 {
						t.Fatalf("status %d: %s", r.status, r.body)
					}
					var lb struct {
						Dest string `json:"x-gateway-destination-endpoint"`
					}
					if err := json.Unmarshal([]byte(r.debug), &lb); err != nil {
						t.Fatalf("debug metadata %q: %v", r.debug, err)
					}
					if lb.Dest == "" || lb.Dest != r.upstream || byAddr[r.upstream] != r.pod {
						t.Fatalf("picker chose %q, the stand-in went to %q, %q answered", lb.Dest, r.upstream, r.pod)
					}
					served[r.upstream]++
				}
				requireNoNACK(t, n)
				t.Logf("served by: %v", served)

				e.stop()
				if shape.pickerGone != nil {
					srv.Set(t, "2", shape.pickerGone(rs)...)
					waitVersion(t, n, xdsclient.EndpointType, "2")
				}
				want := 500
				if failOpen {
					want = shape.stoppedOpen
				}
				for range 6 {
					r, err := post(t, base, completion)
					if err != nil {
						t.Fatal(err)
					}
					if r.status != want {
						t.Fatalf("picker stopped, %s: got %d (%q), want %d", name, r.status, r.body, want)
					}
					if r.status == 200 && byAddr[r.upstream] == "" {
						t.Fatalf("failed open to %q, not a pool endpoint", r.upstream)
					}
				}
			})
		}
	}
}

// TestXDSLiveUpdate moves the pool between listener versions while requests
// flow: none may fail, and requests after the update reach only the new
// endpoint set.
func TestXDSLiveUpdate(t *testing.T) {
	sims, pool := newPool(t, 2)
	e := startEPP(t, pool)
	srv := xdstest.Start(t)
	p := xdstest.Pool{EPP: e.GRPCAddr(), EPPTLS: true, ListenerPort: 80, Endpoints: []string{sims[0].addr, sims[1].addr}}
	srv.Set(t, "1", xdstest.Istio(p)...)
	n, base := startNode(t, srv, xdstest.IstioListener)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			r, err := post(t, base, completion)
			if err == nil && r.status != 200 {
				err = errors.New(r.body)
			}
			if err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	time.Sleep(200 * time.Millisecond)
	// Only sim-1 stays in the Service; the picker still knows both, so a
	// pick of sim-0 is skipped by override_host and the fallback chooses.
	p.Endpoints = []string{sims[1].addr}
	srv.Set(t, "2", xdstest.Istio(p)...)
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := n.XDS().WaitVersion(wctx, xdsclient.EndpointType, "2"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("a request failed across the update: %v", err)
	}
	for range 10 {
		r, err := post(t, base, completion)
		if err != nil || r.status != 200 || r.upstream != sims[1].addr {
			t.Fatalf("after the update: %v %d via %q", err, r.status, r.upstream)
		}
	}
	requireNoNACK(t, n)
}

// TestXDSUnsupportedFieldIsNACKed checks that a field that would change
// routing and that the stand-in does not reproduce is refused with its name,
// and that the node keeps serving its last good configuration.
func TestXDSUnsupportedFieldIsNACKed(t *testing.T) {
	sims, pool := newPool(t, 1)
	e := startEPP(t, pool)
	srv := xdstest.Start(t)
	p := xdstest.Pool{EPP: e.GRPCAddr(), EPPTLS: true, ListenerPort: 80, Endpoints: []string{sims[0].addr}}
	good := xdstest.EnvoyGateway(p, sims[0].addr)
	srv.Set(t, "1", good...)
	n, base := startNode(t, srv, xdstest.EGListener)

	bad := xdstest.EnvoyGateway(p, sims[0].addr)
	for _, m := range bad {
		if c, ok := m.(*clusterv3.Cluster); ok && c.GetName() == xdstest.EGRouteCluster {
			// upstream_port_override changes where ORIGINAL_DST connects.
			c.GetOriginalDstLbConfig().UpstreamPortOverride = wrapperspb.UInt32(1)
		}
	}
	srv.Set(t, "2", bad...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := n.XDS().WaitVersion(ctx, xdsclient.ClusterType, "2")
	var nack *xdsclient.NACKError
	if !errors.As(err, &nack) || !strings.Contains(nack.Message, "upstream_port_override") {
		t.Fatalf("want a NACK naming upstream_port_override, got %v", err)
	}
	t.Logf("NACK: %s", nack.Message)
	if r, err := post(t, base, completion); err != nil || r.status != 200 {
		t.Fatalf("after the NACK the last good config must serve: %v %+v", err, r)
	}
}
