// Package kgateway runs kgateway's own controller (built from the
// github.com/kgateway-dev/kgateway/v2 module by hack/kgateway.sh) against the
// test control plane with its Envoy InferencePool support on, and checks
// the xDS it serves a Gateway's Envoy for an HTTPRoute to an InferencePool:
// the picker's ext_proc filter with the pool's failure mode, the
// header_to_metadata filter that copies the picker's answer into the
// envoy.lb namespace, and the pool's STATIC cluster whose subset load
// balancer picks the host that answer names.
//
// kgateway binds every interface (xDS 9977, health 9093, metrics 9092), and
// reads endpoints from Pods and EndpointSlices, which the API server refuses
// to hold loopback addresses in; so the test binary re-runs itself in a
// network namespace of its own (unshare, as root), where a bridge with no
// ports carries 192.0.2.0/24, as test/istio does.
package kgateway

import (
	"os"
	"testing"

	"github.com/infergate/infergate/test/gatewaytest"
)

// namespaceAddr is the bridge's own address, the Gateway's pod's.
const namespaceAddr = gatewaytest.BridgeAddr

// podAddr is the address of the i-th model server's or picker's pod.
func podAddr(i int) string { return gatewaytest.PodAddr(i) }

func TestMain(m *testing.M) {
	os.Exit(gatewaytest.Main(m, []string{"--net"}, setUpNamespace))
}

func setUpNamespace() error { return gatewaytest.SetUpPodAddrs(8) }
