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

func setUpNamespace() error {
	// Test servers bind 127.0.0.1 but the picker, whose address goes
	// into an EndpointSlice (the API server refuses loopback there); the
	// bridge is for the API server and the picker.
	if err := gatewaytest.SetUpBridge(pickerIP); err != nil {
		return err
	}
	if err := syscall.Mount("tmpfs", "/certs", "tmpfs", 0, "size=1m"); err != nil {
		return fmt.Errorf("mount a private /certs: %w", err)
	}
	return nil
}
