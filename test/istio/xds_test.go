package istio

import (
	"fmt"
	"slices"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/test/gatewaytest"
)

// gatewayNode is the xDS identity of a pod of the inference Gateway, as
// Istio's gateway deployment would run it: a router whose labels name the
// Gateway (the EnvoyFilter's workloadSelector and Istio's own selection of
// the Gateway's configuration read them).
func gatewayNode() xdsclient.Config {
	return gatewaytest.IstioNode(namespaceAddr, gatewayName+"-istio-0", modelsNS, gatewayName+"-istio", map[string]string{
		"gateway.networking.k8s.io/gateway-name": gatewayName,
		"service.istio.io/canonical-name":        gatewayName + "-istio",
	})
}

// gatewayHCM is the connection manager of the Gateway's port-80 listener.
func gatewayHCM(x *gatewaytest.XDS) *hcmv3.HttpConnectionManager {
	x.Mu.Lock()
	defer x.Mu.Unlock()
	for _, l := range x.Listeners {
		if l.GetAddress().GetSocketAddress().GetPortValue() != 80 {
			continue
		}
		if hcms := gatewaytest.ListenerHCMs(l); len(hcms) > 0 {
			return hcms[0]
		}
	}
	return nil
}

// summary lists the listeners the node got, for a failure message.
func summary(x *gatewaytest.XDS) string {
	x.Mu.Lock()
	defer x.Mu.Unlock()
	out := fmt.Sprintf("%d listeners, %d routes, %d clusters:", len(x.Listeners), len(x.Routes), len(x.Clusters))
	for name, l := range x.Listeners {
		for _, hcm := range gatewaytest.ListenerHCMs(l) {
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
// Istio's InferencePool ext_proc, kept there once by the picker chart's
// EnvoyFilter where istiod puts it, and the router), to its outbound cluster,
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
	x := gatewaytest.CaptureXDS(t, gatewayNode())

	var hcm *hcmv3.HttpConnectionManager
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("xDS the Gateway's node got: %s", summary(x))
		}
	})
	gatewaytest.WaitFor(t, "the Gateway's listener with the payload and InferencePool filters", testTimeout, func() bool {
		hcm = gatewayHCM(x)
		names := filterNames(hcm)
		return slices.Contains(names, payloadFilter) && slices.Contains(names, istioExtProc)
	})
	names := filterNames(hcm)
	t.Logf("the Gateway's HTTP filters: %v", names)
	// The payload filter first (INSERT_FIRST); Istio's InferencePool filter
	// where istiod puts its own, right before grpc_stats and so ahead of
	// fault and cors (pilot/pkg/networking/core/listener_builder.go,
	// buildHTTPConnectionManager); the router last.
	i := slices.Index(names, istioExtProc)
	if slices.Index(names, payloadFilter) != 0 || i < 0 || i+1 == len(names) || names[i+1] != "envoy.filters.http.grpc_stats" ||
		slices.Index(names, "envoy.filters.http.fault") < i || slices.Index(names, "envoy.filters.http.cors") < i ||
		names[len(names)-1] != "envoy.filters.http.router" {
		t.Fatalf("filter order %v: want %s first, %s right before envoy.filters.http.grpc_stats (before fault and cors), the router last",
			names, payloadFilter, istioExtProc)
	}
	// The picker chart's EnvoyFilter replaces istiod's InferencePool filter
	// with its own copy (two picker releases here, each removing what was
	// there): one filter, or each request would call the picker once per
	// copy (the route's override is keyed on the name).
	if n := len(slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s != istioExtProc })); n != 1 {
		t.Fatalf("filters %v: %d named %s, want 1", names, n, istioExtProc)
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
	gatewaytest.WaitFor(t, "the payload processor's cluster", testTimeout, func() bool {
		x.Mu.Lock()
		defer x.Mu.Unlock()
		return x.Clusters[wantCluster] != nil
	})
	x.Mu.Lock()
	ts := x.Clusters[wantCluster].GetTransportSocket()
	x.Mu.Unlock()
	utc := &tlsv3.UpstreamTlsContext{}
	if ts == nil || ts.GetTypedConfig().UnmarshalTo(utc) != nil {
		t.Fatalf("cluster %s has no TLS transport socket: %v", wantCluster, ts)
	}

	// The pool's route turns Istio's ext_proc on toward the picker, with
	// the pool's failure mode.
	var pr *extprocv3.ExtProcPerRoute
	gatewaytest.WaitFor(t, "the pool's route", testTimeout, func() bool {
		x.Mu.Lock()
		defer x.Mu.Unlock()
		for _, rc := range x.Routes {
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
