package envoygateway

import (
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/inference/wire"
	"github.com/infergate/infergate/test/gatewaytest"
)

// captureXDS records what Envoy Gateway sends the Gateway's Envoy.
func (c *cluster) captureXDS(t *testing.T, ns, gateway string) *gatewaytest.XDS {
	t.Helper()
	return gatewaytest.CaptureXDS(t, xdsclient.Config{Server: gatewaytest.EnvoyGatewayXDS, NodeID: "capture", NodeCluster: ns + "/" + gateway, TLS: gatewaytest.EnvoyGatewayTLS(t, c.Cluster)})
}

// listenerHCM is the first connection manager of l.
func listenerHCM(l *listenerv3.Listener) *hcmv3.HttpConnectionManager {
	if hcms := gatewaytest.ListenerHCMs(l); len(hcms) > 0 {
		return hcms[0]
	}
	return nil
}

// TestEnvoyGatewayServesTheExtensionsXDS reads what Envoy Gateway sends
// the Gateway's Envoy: the pool's cluster (EDS from the extension behind
// override_host), the picker's cluster, the strip filter and the pool's
// ext_proc filter before the router with the pool's failure mode, the
// route turning the filter on; and sees failure_mode_allow follow a
// change to the live pool.
func TestEnvoyGatewayServesTheExtensionsXDS(t *testing.T) {
	c := startCluster(t)
	edsAddr := c.startExtension(t)
	c.startEG(t, edsAddr)
	ns := "xds"
	c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	c.create(t, gatewayObjects(ns)...)
	c.create(t, pickerObjects(ns, "llama")...)
	c.create(t, inferencePool(ns, "llama", inferencev1.EndpointPickerFailOpen), poolRoute(ns, "llm-route", "llama"))
	c.routeCondition(t, ns, "llm-route", "ResolvedRefs")
	x := c.captureXDS(t, ns, "inference-gateway")
	pool := &envoygateway.Pool{Namespace: ns, Name: "llama"}
	listener, routeCluster := ns+"/inference-gateway/http", "httproute/"+ns+"/llm-route/rule/0"

	// failOpen returns the pool filter's failure_mode_allow on the
	// Gateway's listener, and whether the listener has it at all.
	failOpen := func() (bool, bool) {
		x.Mu.Lock()
		defer x.Mu.Unlock()
		fs := listenerHCM(x.Listeners[listener]).GetHttpFilters()
		for i, f := range fs {
			if f.GetName() != envoygateway.FilterName(pool) {
				continue
			}
			ep := &extprocv3.ExternalProcessor{}
			if err := f.GetTypedConfig().UnmarshalTo(ep); err != nil || f.GetDisabled() || i == 0 ||
				fs[i-1].GetName() != envoygateway.StripFilterName || fs[len(fs)-1].GetName() != "envoy.filters.http.router" ||
				ep.GetProcessingMode().GetRequestHeaderMode() != extprocv3.ProcessingMode_SKIP ||
				ep.GetGrpcService().GetEnvoyGrpc().GetClusterName() != envoygateway.EPPClusterName(pool) {
				t.Fatalf("pool filter on the listener: %v (filters %v)", ep, fs)
			}
			return ep.GetFailureModeAllow(), true
		}
		return false, false
	}
	gatewaytest.WaitFor(t, "the pool's filter, FailOpen, on the Gateway's listener", 60*time.Second, func() bool {
		open, ok := failOpen()
		return ok && open
	})

	x.Mu.Lock()
	cl := x.Clusters[routeCluster]
	if cl.GetType() != clusterv3.Cluster_EDS || cl.GetEdsClusterConfig().GetServiceName() != envoygateway.EDSName(pool) ||
		cl.GetEdsClusterConfig().GetEdsConfig().GetApiConfigSource().GetGrpcServices()[0].GetGoogleGrpc().GetTargetUri() != edsAddr {
		t.Errorf("pool cluster %v", cl)
	}
	oh := &overridehostv3.OverrideHost{}
	if err := cl.GetLoadBalancingPolicy().GetPolicies()[0].GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(oh); err != nil ||
		oh.GetOverrideHostSources()[0].GetMetadata().GetKey() != wire.LBNamespace {
		t.Errorf("pool cluster's override_host: %v %v", oh, err)
	}
	// The picker's replicas come over the same EDS service: a host each.
	if epp := x.Clusters[envoygateway.EPPClusterName(pool)]; epp.GetType() != clusterv3.Cluster_EDS ||
		epp.GetEdsClusterConfig().GetServiceName() != envoygateway.PickerEDSName(pool) || epp.GetTransportSocket() == nil ||
		len(epp.GetHealthChecks()) != 1 || epp.GetCommonLbConfig().GetHealthyPanicThreshold() == nil || epp.GetCommonLbConfig().GetHealthyPanicThreshold().GetValue() != 0 {
		t.Errorf("picker cluster %v", epp)
	}
	// Every config source Envoy would subscribe through is one Envoy
	// accepts beside Envoy Gateway's own bootstrap.
	if err := gatewaytest.CheckConfigSources(gatewaytest.EnvoyGatewayBootstrap(t), x); err != nil {
		t.Error(err)
	}
	x.Mu.Unlock()

	// The route comes over RDS after the listener that names it, so it
	// may not have arrived yet.
	gatewaytest.WaitFor(t, "the pool's route turning its filter on (FULL_DUPLEX_STREAMED bodies)", 60*time.Second, func() bool {
		x.Mu.Lock()
		defer x.Mu.Unlock()
		var perRoute *anypb.Any
		for _, vh := range x.Routes[listener].GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if r.GetRoute().GetCluster() == routeCluster {
					perRoute = r.GetTypedPerFilterConfig()[envoygateway.FilterName(pool)]
				}
			}
		}
		pr := &extprocv3.ExtProcPerRoute{}
		return perRoute != nil && perRoute.UnmarshalTo(pr) == nil &&
			pr.GetOverrides().GetProcessingMode().GetRequestBodyMode() == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED
	})

	setFailureMode(t, c, ns, "llama", inferencev1.EndpointPickerFailClose)
	gatewaytest.WaitFor(t, "failure_mode_allow false after the pool turned FailClose", 60*time.Second, func() bool {
		open, ok := failOpen()
		return ok && !open
	})
}
