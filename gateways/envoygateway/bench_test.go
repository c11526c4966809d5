package envoygateway

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"testing"

	pb "github.com/envoyproxy/gateway/proto/extension"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/infergate/infergate/envoysim/xdstest"
)

// translation builds what Envoy Gateway hands PostTranslateModify for
// routes routes spread over pools pools on listeners listeners.
func translation(b *testing.B, routes, pools, listeners int) ([]*clusterv3.Cluster, []*listenerv3.Listener, []*routev3.RouteConfiguration) {
	b.Helper()
	var (
		cs  []*clusterv3.Cluster
		ls  []*listenerv3.Listener
		rcs []*routev3.RouteConfiguration
	)
	for l := range listeners {
		name := fmt.Sprintf("default/eg/http-%d", l)
		ls = append(ls, xdstest.Listener(name, uint32(10080+l), name))
		rcs = append(rcs, &routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{{Name: name, Domains: []string{"*"}}}})
	}
	for i := range routes {
		p := &Pool{Namespace: "default", Name: fmt.Sprintf("pool-%d", i%pools), TargetPorts: []int32{8000},
			Selector: map[string]string{"app": "x"}, EPPService: "epp", EPPPort: 9002, FailOpen: i%2 == 0}
		cluster := fmt.Sprintf("httproute/default/r%d/rule/0", i)
		r, err := ModifyRoute(&routev3.Route{
			Name:   cluster + "/match/0/*",
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: fmt.Sprintf("/r%d", i)}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}},
		}, p, nil)
		if err != nil {
			b.Fatal(err)
		}
		vh := rcs[i%listeners].VirtualHosts[0]
		vh.Routes = append(vh.Routes, r)
		c, err := ModifyCluster(&clusterv3.Cluster{Name: cluster}, p, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
	}
	return cs, ls, rcs
}

// BenchmarkPostTranslateModify: one translation hook over 100 routes to 20
// pools on 2 listeners (target ≤ 5 ms).
func BenchmarkPostTranslateModify(b *testing.B) {
	cs, ls, rcs := translation(b, 100, 20, 2)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ModifyTranslation(context.Background(), cs, ls, rcs, Config{}, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPostTranslateModifyGRPC is the same hook as Envoy Gateway calls
// it: over gRPC on loopback, the whole translation marshalled both ways.
func BenchmarkPostTranslateModifyGRPC(b *testing.B) {
	cs, ls, rcs := translation(b, 100, 20, 2)
	g := grpc.NewServer()
	NewServer(nil, nil, Config{}, logr.Discard()).Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	defer g.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewEnvoyGatewayExtensionClient(conn)
	req := &pb.PostTranslateModifyRequest{Clusters: cs, Listeners: ls, Routes: rcs}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := client.PostTranslateModify(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemory1000Pools reports the heap the translation of 1,000 pools
// (one route each, on 4 listeners) holds while Envoy Gateway's request and
// the extension's answer are both alive.
func BenchmarkMemory1000Pools(b *testing.B) {
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		cs, ls, rcs := translation(b, 1000, 1000, 4)
		outC, outL, err := ModifyTranslation(context.Background(), cs, ls, rcs, Config{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "MiB-held")
		runtime.KeepAlive(outC)
		runtime.KeepAlive(outL)
	}
}
