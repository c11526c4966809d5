package kgateway

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headertometadatav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/test/gatewaytest"
)

// kgateway's names for what it adds to a listener that routes to a pool
// (wellknown/constants.go, and Envoy's name for header_to_metadata).
const (
	poolExtProc      = "inferencepool.backend.transformation.kgateway.io"
	headerToMetadata = "envoy.filters.http.header_to_metadata"
)

func gatewayHCM(x *gatewaytest.XDS) *hcmv3.HttpConnectionManager {
	x.Mu.Lock()
	defer x.Mu.Unlock()
	for _, l := range x.Listeners {
		if hcms := gatewaytest.ListenerHCMs(l); len(hcms) > 0 && l.GetAddress().GetSocketAddress().GetPortValue() == 80 {
			return hcms[0]
		}
	}
	return nil
}

func filterNames(hcm *hcmv3.HttpConnectionManager) []string {
	var names []string
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
	}
	return names
}

// dump is everything the node got, as JSON, for reading.
func dump(x *gatewaytest.XDS) string {
	x.Mu.Lock()
	defer x.Mu.Unlock()
	var b strings.Builder
	m := protojson.MarshalOptions{Multiline: true}
	for name, l := range x.Listeners {
		fmt.Fprintf(&b, "listener %s:\n%s\n", name, m.Format(l))
	}
	for name, r := range x.Routes {
		fmt.Fprintf(&b, "route %s:\n%s\n", name, m.Format(r))
	}
	for name, c := range x.Clusters {
		fmt.Fprintf(&b, "cluster %s:\n%s\n", name, m.Format(c))
	}
	return b.String()
}

// TestKgatewayServesThePool installs a Gateway of class kgateway and an
// HTTPRoute to an InferencePool, and reads what kgateway sends the
// Gateway's Envoy, per failure mode:
//   - on the listener, ext_proc (not disabled, failure_mode_allow on, its
//     gRPC service a cluster that does not exist, so that routes to no pool
//     pass), then header_to_metadata copying the picker's
//     x-gateway-destination-endpoint header into envoy.lb, then the router;
//   - on the pool's route, an ExtProcPerRoute override that points ext_proc
//     at the pool's picker cluster with the pool's failure mode;
//   - the pool's cluster, STATIC over the pool's pods, each with its
//     address in envoy.lb metadata, and a subset load balancer on that key
//     falling back to any endpoint;
//   - the picker's cluster, STRICT_DNS on the Service's name, over TLS.
//
// It then connects the Envoy stand-in as the same node, which must take all
// of it: it NACKs whatever it does not reproduce, so a kgateway that sends
// something new fails here.
func TestKgatewayServesThePool(t *testing.T) {
	for _, mode := range []inferencev1.EndpointPickerFailureMode{inferencev1.EndpointPickerFailClose, inferencev1.EndpointPickerFailOpen} {
		t.Run(string(mode), func(t *testing.T) { checkPoolXDS(t, mode) })
	}
}

func checkPoolXDS(t *testing.T, mode inferencev1.EndpointPickerFailureMode) {
	c := startCluster(t)
	c.install(t, mode, 2)
	n := standIn(t)
	x := gatewaytest.CaptureXDS(t, gatewaytest.KgatewayNode(gatewayPod, modelsNS, gatewayName))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("xDS the Gateway's node got:\n%s", dump(x))
		}
	})
	var hcm *hcmv3.HttpConnectionManager
	gatewaytest.WaitFor(t, "the Gateway's listener with the pool's filters", testTimeout, func() bool {
		hcm = gatewayHCM(x)
		return slices.Contains(filterNames(hcm), poolExtProc)
	})
	if got, want := filterNames(hcm), []string{poolExtProc, headerToMetadata, "envoy.filters.http.router"}; !slices.Equal(got, want) {
		t.Fatalf("listener filters %v, want %v", got, want)
	}
	checkListenerExtProc(t, hcm.GetHttpFilters()[0])
	checkHeaderToMetadata(t, hcm.GetHttpFilters()[1])

	var pool, picker *clusterv3.Cluster
	gatewaytest.WaitFor(t, "the pool's and the picker's clusters, the pool's with its two pods", testTimeout, func() bool {
		x.Mu.Lock()
		defer x.Mu.Unlock()
		pool, picker = x.Clusters[poolCluster], x.Clusters[pickerCluster]
		// kgateway sends the pool's cluster before it has the pods, with
		// no hosts.
		return pool != nil && picker != nil && len(pool.GetLoadAssignment().GetEndpoints()) > 0 &&
			len(pool.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()) == 2
	})
	checkPoolCluster(t, pool, []string{podAddr(0), podAddr(1)})
	checkPickerCluster(t, picker)
	checkPoolRoute(t, x, mode)
	if refused := standInRefusals(t, n); len(refused) > 0 {
		t.Errorf("the stand-in refuses kgateway's configuration: %q", refused)
	}
}

// kgateway's names for the pool's clusters (backends.go and plugin.go):
// endpoint-picker_<ns>_<pool>_<port> and endpointpicker_<pool>_<ns>_ext_proc.
const (
	poolCluster   = "endpoint-picker_" + modelsNS + "_" + poolName + "_8000"
	pickerCluster = "endpointpicker_" + poolName + "_" + modelsNS + "_ext_proc"
)

func checkListenerExtProc(t *testing.T, f *hcmv3.HttpFilter) {
	t.Helper()
	ep := &extprocv3.ExternalProcessor{}
	if err := f.GetTypedConfig().UnmarshalTo(ep); err != nil {
		t.Fatalf("%s: %v", f.GetName(), err)
	}
	if f.GetDisabled() || !ep.GetFailureModeAllow() || ep.GetProcessingMode().GetRequestBodyMode() != extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED ||
		ep.GetGrpcService().GetEnvoyGrpc().GetClusterName() == pickerCluster {
		t.Fatalf("listener ext_proc: disabled %t, %s", f.GetDisabled(), ep)
	}
}

func checkHeaderToMetadata(t *testing.T, f *hcmv3.HttpFilter) {
	t.Helper()
	h := &headertometadatav3.Config{}
	if err := f.GetTypedConfig().UnmarshalTo(h); err != nil {
		t.Fatalf("%s: %v", f.GetName(), err)
	}
	rules := h.GetRequestRules()
	if len(rules) != 1 || rules[0].GetHeader() != "x-gateway-destination-endpoint" ||
		rules[0].GetOnHeaderPresent().GetMetadataNamespace() != "envoy.lb" || rules[0].GetOnHeaderPresent().GetKey() != "x-gateway-destination-endpoint" {
		t.Fatalf("header_to_metadata: %s", h)
	}
}

func checkPoolCluster(t *testing.T, cl *clusterv3.Cluster, pods []string) {
	t.Helper()
	sub := cl.GetLbSubsetConfig()
	if cl.GetType() != clusterv3.Cluster_STATIC || sub.GetFallbackPolicy() != clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT ||
		len(sub.GetSubsetSelectors()) != 1 || !slices.Equal(sub.GetSubsetSelectors()[0].GetKeys(), []string{"x-gateway-destination-endpoint"}) {
		t.Fatalf("pool cluster: type %s, subsets %s", cl.GetType(), sub)
	}
	var got []string
	for _, le := range cl.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints() {
		addr := fmt.Sprintf("%s:%d", le.GetEndpoint().GetAddress().GetSocketAddress().GetAddress(), le.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue())
		if md := le.GetMetadata().GetFilterMetadata()["envoy.lb"].GetFields()["x-gateway-destination-endpoint"].GetStringValue(); md != addr {
			t.Fatalf("pool endpoint %s carries envoy.lb metadata %q", addr, md)
		}
		got = append(got, addr)
	}
	slices.Sort(got)
	var want []string
	for _, p := range pods {
		want = append(want, fmt.Sprintf("%s:%d", p, modelPort))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pool endpoints %v, want %v", got, want)
	}
}

func checkPickerCluster(t *testing.T, cl *clusterv3.Cluster) {
	t.Helper()
	ep := cl.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if cl.GetType() != clusterv3.Cluster_STRICT_DNS || ep.GetAddress() != pickerHost || ep.GetPortValue() != pickerPort ||
		cl.GetTransportSocket().GetName() != "envoy.transport_sockets.tls" {
		t.Fatalf("picker cluster: %s", cl)
	}
}

func checkPoolRoute(t *testing.T, x *gatewaytest.XDS, mode inferencev1.EndpointPickerFailureMode) {
	t.Helper()
	x.Mu.Lock()
	defer x.Mu.Unlock()
	for _, rc := range x.Routes {
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if r.GetRoute().GetCluster() != poolCluster {
					continue
				}
				per := &extprocv3.ExtProcPerRoute{}
				if err := r.GetTypedPerFilterConfig()[poolExtProc].UnmarshalTo(per); err != nil {
					t.Fatalf("pool route's %s config: %v", poolExtProc, err)
				}
				o := per.GetOverrides()
				if o.GetGrpcService().GetEnvoyGrpc().GetClusterName() != pickerCluster ||
					o.GetFailureModeAllow().GetValue() != (mode == inferencev1.EndpointPickerFailOpen) {
					t.Fatalf("pool route's ext_proc override for %s: %s", mode, o)
				}
				return
			}
		}
	}
	t.Fatalf("no route to %s", poolCluster)
}

// standIn runs the stand-in as the Gateway's Envoy.
func standIn(t *testing.T) *envoysim.Node {
	t.Helper()
	return gatewaytest.StandIn(t, envoysim.NodeConfig{
		XDS: gatewaytest.KgatewayNode(gatewayPod, modelsNS, gatewayName), FreePorts: true,
		Resolve: map[string]string{pickerHost: podAddr(pickerIndex)}, ResolveOnly: true,
		Timeouts:      envoysim.Timeouts{Route: 20 * time.Second, Connect: time.Second, Shutdown: time.Second},
		DebugMetadata: true,
	})
}

// standInRefusals returns what the stand-in NACKed of the clusters and
// listeners kgateway sent it, once it has answered both.
func standInRefusals(t *testing.T, n *envoysim.Node) []string {
	t.Helper()
	var out []string
	gatewaytest.WaitFor(t, "the stand-in's answers to kgateway", testTimeout, func() bool {
		out = out[:0]
		st := n.XDS().Status()
		for _, typ := range []string{xdsclient.ClusterType, xdsclient.ListenerType} {
			s := st[typ]
			if s.ACKs+s.NACKs == 0 {
				return false
			}
			if s.NACKs > 0 {
				out = append(out, s.LastError)
			}
		}
		return true
	})
	return out
}
