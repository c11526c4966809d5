// Package envoygateway runs Envoy Gateway's own controller (v1.9.1, built
// from its Go module by hack/envoygateway.sh) against the test control
// plane, with and without infergate's extension server, and checks what it
// does with an HTTPRoute whose backendRef is an InferencePool: the route
// status, the xDS it serves its Envoy, and traffic through the Envoy
// stand-in configured from that xDS.
//
// Envoy Gateway reads its TLS material from the fixed paths /certs/*, and
// some of its servers bind every interface; so the test binary re-runs
// itself in a network and mount namespace of its own (unshare, as root):
// everything — the API server, Envoy Gateway, the extension, the picker,
// the simulators and the stand-in — talks over that namespace's loopback,
// and /certs is a tmpfs no other process sees.
package envoygateway

import (
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/infergate/infergate/test/gatewaytest"
)

func TestMain(m *testing.M) {
	// The mount point must exist; what is mounted on it stays inside.
	if err := os.MkdirAll("/certs", 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "envoygateway tests need root (Envoy Gateway reads /certs; the test gives it a private one):", err)
		os.Exit(1)
	}
	os.Exit(gatewaytest.Main(m, []string{"--net", "--mount", "--propagation", "private"}, setUpNamespace))
}

// namespaceAddr is the address of the namespace's own (portless bridge) interface: the API
// server wants a default route and an address to advertise. Nothing is
// sent to it; every test server binds 127.0.0.1.
const namespaceAddr = "192.0.2.1"

func setUpNamespace() error {
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "infergate0", "type", "bridge"}, // a bridge with no ports: this kernel has no dummy driver
		{"addr", "add", namespaceAddr + "/24", "dev", "infergate0"},
		{"link", "set", "infergate0", "up"},
		{"route", "add", "default", "dev", "infergate0"},
	} {
		if err := gatewaytest.IP(args...); err != nil {
			return err
		}
	}
	if err := syscall.Mount("tmpfs", "/certs", "tmpfs", 0, "size=1m"); err != nil {
		return fmt.Errorf("mount a private /certs: %w", err)
	}
	return nil
}
