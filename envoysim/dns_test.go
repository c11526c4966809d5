package envoysim

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/envoysim/xdstest"
	"github.com/infergate/infergate/inference/wire"
)

// dnsCluster is a STRICT_DNS cluster of host:port, resolved again every
// refresh.
func dnsCluster(name, host string, port uint32, refresh time.Duration) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		DnsRefreshRate:       durationpb.New(refresh),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
				}}},
			}}}},
		}}},
	}
}

// TestStrictDNSHostPerAddress: a STRICT_DNS name is a host per address it
// resolves to, and is recorded to be resolved again; LOGICAL_DNS takes
// the first address (dns_cluster.cc, logical_dns_cluster.cc).
func TestStrictDNSHostPerAddress(t *testing.T) {
	env := buildEnv{
		resolve: func(string) ([]string, error) { return []string{"10.0.0.2", "10.0.0.1", "10.0.0.3"}, nil },
		dns:     newDNSSeen(),
		log:     logr.Discard(),
	}
	cla := dnsCluster("c", "picker.test", 9002, time.Second).GetLoadAssignment()
	for _, tc := range []struct {
		name    string
		refresh time.Duration
		want    []string
	}{
		{"STRICT_DNS", 3 * time.Second, []string{"10.0.0.1:9002", "10.0.0.2:9002", "10.0.0.3:9002"}},
		{"LOGICAL_DNS", 0, []string{"10.0.0.2:9002"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := clusterEndpoints(cla, &transportSelector{}, env, tc.refresh)
			got := a.endpoints
			if err != nil {
				t.Fatal(err)
			}
			if slices.Sort(got); !slices.Equal(got, tc.want) {
				t.Fatalf("hosts %v, want %v", got, tc.want)
			}
		})
	}
	names, every := env.dns.snapshot()
	if every != 3*time.Second || !slices.Equal(names["picker.test"], []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}) {
		t.Fatalf("recorded %v every %v, want the three addresses every 3s", names, every)
	}
}

// TestDNSRefreshUpdatesHosts: a STRICT_DNS name that does not resolve
// leaves the cluster without hosts (503 "no healthy upstream"); once it
// resolves, the next refresh gives the cluster its host, and a failed
// lookup after that keeps it.
func TestDNSRefreshUpdatesHosts(t *testing.T) {
	up := fakeproc.StartUpstream(t, nil)
	host, portStr, _ := net.SplitHostPort(up.Addr)
	port, _ := net.LookupPort("tcp", portStr)
	var answer atomic.Value // []string; nil: the lookup fails
	srv := xdstest.Start(t)
	n, err := NewNode(NodeConfig{
		XDS:       xdsclient.Config{Server: srv.Addr, NodeID: xdstest.NodeID},
		FreePorts: true,
		Lookup: func(context.Context, string) ([]string, error) {
			if a, _ := answer.Load().([]string); a != nil {
				return a, nil
			}
			return nil, errors.New("NXDOMAIN")
		},
		Timeouts: Timeouts{Route: 10 * time.Second, Connect: time.Second, Shutdown: time.Second},
		Logger:   testr.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	srv.Set(t, "1", xdstest.Listener("l", 80, "r"), xdstest.CatchAllRoutes("r", "up"), dnsCluster("up", "up.test", uint32(port), 100*time.Millisecond))
	url := listenerURL(t, n, "l")
	if resp, body := get(t, url); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("unresolved: %d %q, want 503", resp.StatusCode, body)
	}
	answer.Store([]string{host})
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, _ := get(t, url)
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d 5s after the name resolved", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
	answer.Store([]string(nil))
	time.Sleep(300 * time.Millisecond) // three refreshes that fail
	if resp, body := get(t, url); resp.StatusCode != http.StatusOK {
		t.Fatalf("after failed lookups: %d %q, want the host kept", resp.StatusCode, body)
	}
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestHealthCheckReuseConnection: Envoy's gRPC health checker keeps one
// connection to a host (reuse_connection unset) or opens one per check
// (false), which is what lets a check reach a host's new owner.
func TestHealthCheckReuseConnection(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reuse *wrapperspb.BoolValue
		check func(accepted int64) bool
	}{
		{"unset", nil, func(n int64) bool { return n == 1 }},
		{"false", wrapperspb.Bool(false), func(n int64) bool { return n >= 5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			cl := &countingListener{Listener: ln}
			gs := grpc.NewServer()
			hs := health.NewServer()
			hs.SetServingStatus(wire.ExtProcHealthService, healthpb.HealthCheckResponse_SERVING)
			healthpb.RegisterHealthServer(gs, hs)
			go func() { _ = gs.Serve(cl) }()
			t.Cleanup(gs.Stop)

			c := xdstest.StaticCluster("p", ln.Addr().String())
			every := durationpb.New(100 * time.Millisecond)
			c.HealthChecks = []*corev3.HealthCheck{{
				Timeout: durationpb.New(time.Second), Interval: every, NoTrafficInterval: every, NoTrafficHealthyInterval: every,
				UnhealthyThreshold: wrapperspb.UInt32(2), HealthyThreshold: wrapperspb.UInt32(1), ReuseConnection: tc.reuse,
				HealthChecker: &corev3.HealthCheck_GrpcHealthCheck_{GrpcHealthCheck: &corev3.HealthCheck_GrpcHealthCheck{ServiceName: wire.ExtProcHealthService}},
			}}
			srv := xdstest.Start(t)
			testNode(t, srv)
			srv.Set(t, "1", xdstest.Listener("l", 80, "r"), xdstest.CatchAllRoutes("r", "p"), c)
			time.Sleep(time.Second)
			if got := cl.n.Load(); !tc.check(got) {
				t.Fatalf("%d connections for about 10 checks", got)
			}
		})
	}
}
