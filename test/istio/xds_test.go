package istio

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/extproc/devproxy/xdsclient"
)

// gatewayNode is the xDS identity of a pod of the inference Gateway, as
// Istio's gateway deployment would run it: a router whose labels name the
// Gateway (the EnvoyFilter's workloadSelector and Istio's own selection of
// the Gateway's configuration read them).
func gatewayNode() xdsclient.Config {
	pod := gatewayName + "-istio-0"
	md, err := structpb.NewStruct(map[string]any{
		"NAMESPACE":     modelsNS,
		"CLUSTER_ID":    "Kubernetes",
		"NAME":          pod,
		"ISTIO_VERSION": "1.30.0",
		"LABELS": map[string]any{
			"gateway.networking.k8s.io/gateway-name": gatewayName,
			"service.istio.io/canonical-name":        gatewayName + "-istio",
		},
		"WORKLOAD_NAME": gatewayName + "-istio",
	})
	if err != nil {
		panic(err)
	}
	return xdsclient.Config{
		Server:       istiodXDS,
		NodeID:       fmt.Sprintf("router~%s~%s.%s~%s.svc.cluster.local", namespaceAddr, pod, modelsNS, modelsNS),
		NodeCluster:  gatewayName + "-istio." + modelsNS,
		NodeMetadata: md,
	}
}

// xdsCapture keeps the last resources of each type istiod sent the node.
type xdsCapture struct {
	mu        sync.Mutex
	listeners map[string]*listenerv3.Listener
	routes    map[string]*routev3.RouteConfiguration
	clusters  map[string]*clusterv3.Cluster
}

func captureXDS(t *testing.T) *xdsCapture {
	t.Helper()
	x := &xdsCapture{}
	var client *xdsclient.Client
	h := xdsclient.HandlerFunc(func(_ context.Context, typ, _ string, rs []*anypb.Any) error {
		x.mu.Lock()
		defer x.mu.Unlock()
		switch typ {
		case xdsclient.ListenerType:
			x.listeners = map[string]*listenerv3.Listener{}
			var rds []string
			for _, r := range rs {
				l := &listenerv3.Listener{}
				if err := r.UnmarshalTo(l); err != nil {
					return err
				}
				x.listeners[l.GetName()] = l
				for _, hcm := range listenerHCMs(l) {
					if hcm.GetRds() != nil {
						rds = append(rds, hcm.GetRds().GetRouteConfigName())
					}
				}
			}
			client.Subscribe(xdsclient.RouteType, rds)
		case xdsclient.RouteType:
			x.routes = map[string]*routev3.RouteConfiguration{}
			for _, r := range rs {
				rc := &routev3.RouteConfiguration{}
				if err := r.UnmarshalTo(rc); err != nil {
					return err
				}
				x.routes[rc.GetName()] = rc
			}
		case xdsclient.ClusterType:
			x.clusters = map[string]*clusterv3.Cluster{}
			for _, r := range rs {
				cl := &clusterv3.Cluster{}
				if err := r.UnmarshalTo(cl); err != nil {
					return err
				}
				x.clusters[cl.GetName()] = cl
			}
		}
		return nil
	})
	cfg := gatewayNode()
	cfg.Logger = logr.Discard()
	client, err := xdsclient.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	client.Subscribe(xdsclient.ClusterType, nil)
	client.Subscribe(xdsclient.ListenerType, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = client.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return x
}

func listenerHCMs(l *listenerv3.Listener) []*hcmv3.HttpConnectionManager {
	var out []*hcmv3.HttpConnectionManager
	chains := slices.Clone(l.GetFilterChains())
	if l.GetDefaultFilterChain() != nil {
		chains = append(chains, l.GetDefaultFilterChain())
	}
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			hcm := &hcmv3.HttpConnectionManager{}
			if f.GetTypedConfig().UnmarshalTo(hcm) == nil {
				out = append(out, hcm)
			}
		}
	}
	return out
}

// gatewayHCM is the connection manager of the Gateway's port-80 listener.
func (x *xdsCapture) gatewayHCM() *hcmv3.HttpConnectionManager {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, l := range x.listeners {
		if l.GetAddress().GetSocketAddress().GetPortValue() != 80 {
			continue
		}
		if hcms := listenerHCMs(l); len(hcms) > 0 {
			return hcms[0]
		}
	}
	return nil
}

// summary lists the listeners the node got, for a failure message.
func (x *xdsCapture) summary() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := fmt.Sprintf("%d listeners, %d routes, %d clusters:", len(x.listeners), len(x.routes), len(x.clusters))
	for name, l := range x.listeners {
		for _, hcm := range listenerHCMs(l) {
			out += fmt.Sprintf("\n  %s (port %d): %v", name, l.GetAddress().GetSocketAddress().GetPortValue(), filterNames(hcm))
		}
	}
	return out
}

func filterNames(hcm *hcmv3.HttpConnectionManager) []string {
	var names []string
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
	}
	return names
}

// TestIstioServesThePayloadFilter installs the charts for provider istio
// beside an HTTPRoute to an InferencePool, and reads what istiod sends the
// Gateway's Envoy: the payload processor's ext_proc filter first (before
// Istio's InferencePool ext_proc and the router), to its outbound cluster,
// which originates TLS; and the pool's route turning Istio's ext_proc on
// toward the picker with the pool's failure mode.
func TestIstioServesThePayloadFilter(t *testing.T) {
	for _, mode := range []string{"FailClose", "FailOpen"} {
		t.Run(mode, func(t *testing.T) { checkIstioXDS(t, mode) })
	}
}

func checkIstioXDS(t *testing.T, failureMode string) {
	c := startCluster(t)
	c.startIstiod(t)
	c.install(t, failureMode, 2)
	x := captureXDS(t)

	var hcm *hcmv3.HttpConnectionManager
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("xDS the Gateway's node got: %s", x.summary())
		}
	})
	waitFor(t, "the Gateway's listener with the payload and InferencePool filters", testTimeout, func() bool {
		hcm = x.gatewayHCM()
		names := filterNames(hcm)
		return slices.Contains(names, payloadFilter) && slices.Contains(names, istioExtProc)
	})
	names := filterNames(hcm)
	if p, i, r := slices.Index(names, payloadFilter), slices.Index(names, istioExtProc), slices.Index(names, "envoy.filters.http.router"); !(p < i && i < r) {
		t.Fatalf("filter order %v: want %s before %s before the router", names, payloadFilter, istioExtProc)
	}
	ep := &extprocv3.ExternalProcessor{}
	for _, f := range hcm.GetHttpFilters() {
		if f.GetName() == payloadFilter {
			if err := f.GetTypedConfig().UnmarshalTo(ep); err != nil {
				t.Fatal(err)
			}
		}
	}
	wantCluster := fmt.Sprintf("outbound|%d||%s", payloadPort, payloadHost)
	if got := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != wantCluster || ep.GetFailureModeAllow() ||
		ep.GetProcessingMode().GetRequestBodyMode() != extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		t.Fatalf("payload filter: cluster %q (want %q), failure_mode_allow %v, mode %v", got, wantCluster, ep.GetFailureModeAllow(), ep.GetProcessingMode())
	}

	// The processor's cluster speaks TLS (the chart's DestinationRule).
	waitFor(t, "the payload processor's cluster", testTimeout, func() bool {
		x.mu.Lock()
		defer x.mu.Unlock()
		return x.clusters[wantCluster] != nil
	})
	x.mu.Lock()
	ts := x.clusters[wantCluster].GetTransportSocket()
	x.mu.Unlock()
	utc := &tlsv3.UpstreamTlsContext{}
	if ts == nil || ts.GetTypedConfig().UnmarshalTo(utc) != nil {
		t.Fatalf("cluster %s has no TLS transport socket: %v", wantCluster, ts)
	}

	// The pool's route turns Istio's ext_proc on toward the picker, with
	// the pool's failure mode.
	var pr *extprocv3.ExtProcPerRoute
	waitFor(t, "the pool's route", testTimeout, func() bool {
		x.mu.Lock()
		defer x.mu.Unlock()
		for _, rc := range x.routes {
			for _, vh := range rc.GetVirtualHosts() {
				for _, r := range vh.GetRoutes() {
					if a := r.GetTypedPerFilterConfig()[istioExtProc]; a != nil {
						pr = &extprocv3.ExtProcPerRoute{}
						return a.UnmarshalTo(pr) == nil
					}
				}
			}
		}
		return false
	})
	o := pr.GetOverrides()
	wantPicker := fmt.Sprintf("outbound|%d||%s", pickerPort, pickerHost)
	if got := o.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != wantPicker || o.GetFailureModeAllow() == nil ||
		o.GetFailureModeAllow().GetValue() != (failureMode == "FailOpen") {
		t.Fatalf("pool route override: picker cluster %q (want %q), failure_mode_allow %v (pool %s)", got, wantPicker, o.GetFailureModeAllow(), failureMode)
	}
}

// Filter names: the payload chart's default, and Istio's InferencePool filter.
const (
	payloadFilter = "envoy.filters.http.ext_proc.infergate-payload"
	istioExtProc  = "envoy.filters.http.ext_proc"
)
