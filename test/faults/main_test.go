// Package faults is the fault-injection suite: the Envoy stand-in, run
// from the bootstrap `infergate envoy-bootstrap` renders, in front of real
// picker and payload processor processes (two replicas each, reached by a
// name that resolves to every ready replica, as a headless Service's does)
// and sims, in a network namespace of its own. Each scenario takes a
// processor away as operations do (a crash, a silent loss of its node, a
// rolling restart) while two gateways, one FailOpen and one FailClose,
// carry traffic, and prints what every request got.
package faults

import (
	"os"
	"testing"

	"github.com/infergate/infergate/test/gatewaytest"
)

// Replica addresses: pods on the namespace's bridge.
var (
	pickerIPs  = []string{"192.0.2.11", "192.0.2.12", "192.0.2.13", "192.0.2.14"}
	payloadIPs = []string{"192.0.2.21", "192.0.2.22", "192.0.2.23", "192.0.2.24"}
)

func TestMain(m *testing.M) {
	os.Exit(gatewaytest.Main(m, []string{"--net"}, func() error {
		return gatewaytest.SetUpBridge(append(append([]string{}, pickerIPs...), payloadIPs...)...)
	}))
}
