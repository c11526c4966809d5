package e2e

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/envoyproxy/gateway/proto/extension"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/infergate/infergate/envoysim/xdstest"
	"github.com/infergate/infergate/extproc/epp"
	"github.com/infergate/infergate/extproc/payload"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/inference/wire"
	"github.com/infergate/infergate/internal/testcert"
	"github.com/infergate/infergate/test/loopback"
)

// staticEndpoints is the extension's endpoint source for a test without
// Kubernetes: the pool's simulators.
type staticEndpoints []string

func (s staticEndpoints) Endpoints(context.Context, *envoygateway.Pool) ([]string, error) {
	return s, nil
}

// egRendered runs the Envoy Gateway extension's hooks over gRPC, as Envoy
// Gateway calls them, on what Envoy Gateway renders for an HTTPRoute rule
// whose backendRef is the pool: a listener taking routes over RDS, the
// rule's route and its cluster.
func egRendered(t *testing.T, ext pb.EnvoyGatewayExtensionClient, poolJSON []byte) []proto.Message {
	t.Helper()
	return egRenderedMatching(t, ext, poolJSON, nil)
}

// egRenderedMatching is egRendered for a rule that matches headers too
// (e.g. the base-model header the payload processor sets), with a last
// route answering 404 "no model route" for every other request, as an
// HTTPRoute's unmatched requests get.
func egRenderedMatching(t *testing.T, ext pb.EnvoyGatewayExtensionClient, poolJSON []byte, headers []*routev3.HeaderMatcher) []proto.Message {
	t.Helper()
	const rcName, clusterName = "default/eg/http", "httproute/default/llm-route/rule/0"
	ctx := context.Background()
	res := []*pb.ExtensionResource{{UnstructuredBytes: poolJSON}}
	route := &routev3.Route{
		Name:   "httproute/default/llm-route/rule/0/match/0/*",
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: headers},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: clusterName}}},
	}
	rr, err := ext.PostRouteModify(ctx, &pb.PostRouteModifyRequest{Route: route, PostRouteContext: &pb.PostRouteExtensionContext{ExtensionResources: res}})
	if err != nil {
		t.Fatal(err)
	}
	cluster := &clusterv3.Cluster{
		Name:                 clusterName,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		ConnectTimeout:       durationpb.New(10 * time.Second),
	}
	cr, err := ext.PostClusterModify(ctx, &pb.PostClusterModifyRequest{Cluster: cluster, PostClusterContext: &pb.PostClusterExtensionContext{BackendExtensionResources: res}})
	if err != nil {
		t.Fatal(err)
	}
	routes := []*routev3.Route{rr.GetRoute()}
	if headers != nil {
		routes = append(routes, &routev3.Route{
			Name:  "no-model",
			Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 404,
				Body: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "no model route"}}}},
		})
	}
	rc := &routev3.RouteConfiguration{Name: rcName, VirtualHosts: []*routev3.VirtualHost{{
		Name: "default/eg/http/*", Domains: []string{"*"}, Routes: routes,
	}}}
	tr, err := ext.PostTranslateModify(ctx, &pb.PostTranslateModifyRequest{
		Clusters: []*clusterv3.Cluster{cr.GetCluster()}, Routes: []*routev3.RouteConfiguration{rc},
		Listeners: []*listenerv3.Listener{xdstest.Listener(rcName, 10080, rcName)},
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []proto.Message
	for _, c := range tr.GetClusters() {
		out = append(out, c)
	}
	for _, l := range tr.GetListeners() {
		out = append(out, l)
	}
	for _, r := range tr.GetRoutes() {
		out = append(out, r)
	}
	return out
}

// poolFixture is the pool llama in default over sims, with its picker at
// eppAddr's port: the endpoints, their names by address, and the pool as
// Envoy Gateway hands it to the extension.
func poolFixture(t *testing.T, sims []simProc, eppAddr, failureMode string) (staticEndpoints, map[string]string, []byte) {
	t.Helper()
	var eps staticEndpoints
	byAddr := map[string]string{}
	for _, s := range sims {
		eps = append(eps, s.addr)
		byAddr[s.addr] = s.name
	}
	_, eppPort, _ := net.SplitHostPort(eppAddr)
	poolJSON, err := json.Marshal(map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "llama", "namespace": "default"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts":       []any{map[string]any{"number": 8000}},
			"endpointPickerRef": map[string]any{"name": "llama-epp", "port": map[string]any{"number": json.Number(eppPort)}, "failureMode": failureMode},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return eps, byAddr, poolJSON
}

func startExtension(t *testing.T, endpoints envoygateway.Endpoints, cfg envoygateway.Config) pb.EnvoyGatewayExtensionClient {
	t.Helper()
	g := grpc.NewServer()
	envoygateway.NewServer(endpoints, nil, cfg, logr.Discard()).Register(g)
	addr := loopback.Serve(t, func(ctx context.Context, ln net.Listener) error {
		go func() { <-ctx.Done(); g.Stop() }()
		return g.Serve(ln)
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pb.NewEnvoyGatewayExtensionClient(conn)
}

// TestEnvoyGatewayExtensionConfigRoutes feeds what the extension renders to
// the Envoy stand-in: every request reaches the simulator the picker chose;
// with the picker stopped, FailOpen still answers from a pool endpoint
// (override_host falls back to round robin over the pool) and FailClose
// answers 500.
func TestEnvoyGatewayExtensionConfigRoutes(t *testing.T) {
	for _, failureMode := range []string{"FailOpen", "FailClose"} {
		t.Run(failureMode, func(t *testing.T) {
			sims, pool := newPool(t, 3)
			e := startEPP(t, pool, stopsAsCharted)
			eps, byAddr, poolJSON := poolFixture(t, sims, e.GRPCAddr(), failureMode)
			rs := egRendered(t, startExtension(t, eps, envoygateway.Config{}), poolJSON)
			srv := xdstest.Start(t)
			srv.Set(t, "1", rs...)
			n, base := startNodeResolving(t, srv, "default/eg/http", map[string]string{"llama-epp.default.svc.cluster.local": "127.0.0.1"})
			followsPicks(t, base, byAddr, 20)
			requireNoNACK(t, n)
			e.stop()
			want := map[string]int{"FailOpen": 200, "FailClose": 500}[failureMode]
			// A client naming its own upstream gets nothing for it: the
			// header is stripped and the cluster reads only the picker's
			// metadata, falling back to the pool's own endpoints.
			rogue := startSims(t, 1)[0]
			for range 6 {
				r, err := post(t, base, completion, wire.DestinationEndpointKey, rogue.addr)
				if err != nil {
					t.Fatal(err)
				}
				if r.status != want || (want == 200 && byAddr[r.upstream] == "") || r.upstream == rogue.addr {
					t.Fatalf("picker stopped, %s: %d via %q (%q), want %d from a pool endpoint", failureMode, r.status, r.upstream, r.body, want)
				}
			}
		})
	}
}

// TestEnvoyGatewayExtensionWithPayloadProcessor: with the payload processor
// in front (as egext adds it), a rule that matches the base-model header
// the processor sets is reached only after the route is matched again;
// the pool's picker still runs there (its filter is in every request's
// chain and turned on by the route), and requests reach its choice.
func TestEnvoyGatewayExtensionWithPayloadProcessor(t *testing.T) {
	sims, pool := newPool(t, 2)
	e := startEPP(t, pool)
	proc := startPayload(t, server.TLSOptions{Enabled: true})
	eps, byAddr, poolJSON := poolFixture(t, sims, e.GRPCAddr(), "FailClose")
	ext := startExtension(t, eps, envoygateway.Config{Payload: &envoygateway.Payload{Address: proc.GRPCAddr(), TLS: true}})
	byModel := []*routev3.HeaderMatcher{{Name: "x-gateway-base-model-name", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
		StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "meta-llama/Llama-3.1-8B-Instruct"}},
	}}}
	rs := egRenderedMatching(t, ext, poolJSON, byModel)
	srv := xdstest.Start(t)
	srv.Set(t, "1", rs...)
	n, base := startNodeResolving(t, srv, "default/eg/http", map[string]string{"llama-epp.default.svc.cluster.local": "127.0.0.1"})
	followsPicks(t, base, byAddr, 10)
	r, err := post(t, base, `{"model":"another-model","prompt":"hi"}`)
	if err != nil || r.status != 404 || r.body != "no model route" {
		t.Fatalf("a model no rule serves: %v %d %q", err, r.status, r.body)
	}
	requireNoNACK(t, n)
}

// startPayload runs a payload processor with the default policy on
// loopback until the test ends.
func startPayload(t *testing.T, tlsOpts server.TLSOptions) *payload.Service {
	t.Helper()
	proc, err := payload.New(payload.Config{
		Server: server.Options{GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
			TLS: tlsOpts, DrainTimeout: time.Second},
		Logger: logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- proc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return proc
}

// TestEnvoyGatewayMutualTLS: with the picker and the payload processor
// both requiring client certificates from one CA, the clusters egext
// renders present the certificate it was given and every request reaches
// the picker's choice; rendered without one, the handshakes fail and the
// FailClose pool answers 500.
func TestEnvoyGatewayMutualTLS(t *testing.T) {
	ca := testcert.NewCA(t, "processors")
	dir := t.TempDir()
	caFile, certFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	certPEM, keyPEM := ca.ClientPEM(t, "envoy-gateway")
	for file, data := range map[string][]byte{caFile: ca.PEM, certFile: certPEM, keyFile: keyPEM} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	mtls := server.TLSOptions{Enabled: true, ClientCAFile: caFile}
	sims, pool := newPool(t, 2)
	e := startEPP(t, pool, func(c *epp.Config) { c.Server.TLS = mtls })
	proc := startPayload(t, mtls)
	eps, byAddr, poolJSON := poolFixture(t, sims, e.GRPCAddr(), "FailClose")
	cert, err := envoygateway.LoadClientCert(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cert *envoygateway.ClientCert
	}{{"with the certificate", cert}, {"without", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			ext := startExtension(t, eps, envoygateway.Config{
				Payload: &envoygateway.Payload{Address: proc.GRPCAddr(), TLS: true}, ClientCert: tc.cert,
			})
			srv := xdstest.Start(t)
			srv.Set(t, "1", egRendered(t, ext, poolJSON)...)
			n, base := startNodeResolving(t, srv, "default/eg/http", map[string]string{"llama-epp.default.svc.cluster.local": "127.0.0.1"})
			requireNoNACK(t, n)
			if tc.cert != nil {
				followsPicks(t, base, byAddr, 10)
				return
			}
			r, err := post(t, base, `{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"hi"}`)
			if err != nil || r.status != 500 || r.pod != "" {
				t.Fatalf("without a client certificate: %v status %d pod %q, want 500 from the gateway", err, r.status, r.pod)
			}
		})
	}
}

// followsPicks sends n completions and checks each was answered 200 by the
// endpoint the picker chose (byAddr maps an endpoint to its pod's name).
func followsPicks(t *testing.T, base string, byAddr map[string]string, n int) {
	t.Helper()
	for range n {
		r, err := post(t, base, completion)
		if err != nil {
			t.Fatal(err)
		}
		var lb struct {
			Dest string `json:"x-gateway-destination-endpoint"`
		}
		_ = json.Unmarshal([]byte(r.debug), &lb)
		if r.status != 200 || lb.Dest == "" || lb.Dest != r.upstream || byAddr[r.upstream] != r.pod {
			t.Fatalf("%d %q: picker chose %q, went to %q, %q answered", r.status, r.body, lb.Dest, r.upstream, r.pod)
		}
	}
}
