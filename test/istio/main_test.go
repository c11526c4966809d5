// Package istio runs Istio's own control plane, pilot-discovery (built from
// the istio.io/istio module by hack/istio.sh), against the test control
// plane with Gateway API inference support on, installs the charts' output
// for provider istio, and checks the xDS it serves the inference Gateway's
// Envoy: the payload processor's filter where it must be, and the
// InferencePool route's picker override; then traffic through the Envoy
// stand-in configured from that xDS.
//
// pilot-discovery binds every interface, and Istio reads endpoints from
// EndpointSlices, which the API server refuses to hold loopback addresses
// in; so the test binary re-runs itself in a network namespace of its own
// (unshare, as root), where a bridge with no ports carries 192.0.2.0/24:
// the model servers listen on addresses of that block, inside the
// namespace, and nothing else sees them.
package istio

import (
	"os"
	"testing"

	"github.com/infergate/infergate/test/gatewaytest"
)

// namespaceAddr is the bridge's own address; podAddrs are more addresses
// on it for the model servers' pods.
const namespaceAddr = gatewaytest.BridgeAddr

func podAddr(i int) string { return gatewaytest.PodAddr(i) }

func TestMain(m *testing.M) {
	os.Exit(gatewaytest.Main(m, []string{"--net"}, setUpNamespace))
}

func setUpNamespace() error { return gatewaytest.SetUpPodAddrs(8) }
