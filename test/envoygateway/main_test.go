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
	"os/exec"
	"syscall"
	"testing"
)

// netnsEnv marks the re-run inside the namespaces.
const netnsEnv = "INFERGATE_TEST_NETNS"

func TestMain(m *testing.M) {
	if os.Getenv(netnsEnv) == "" {
		os.Exit(reexec())
	}
	if err := setUpNamespace(); err != nil {
		fmt.Fprintln(os.Stderr, "envoygateway tests:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// reexec runs this test binary again in new network and mount namespaces.
func reexec() int {
	// The mount point must exist; what is mounted on it stays inside.
	if err := os.MkdirAll("/certs", 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "envoygateway tests need root (Envoy Gateway reads /certs; the test gives it a private one):", err)
		return 1
	}
	args := append([]string{"--net", "--mount", "--propagation", "private", "--", os.Args[0]}, os.Args[1:]...)
	cmd := exec.Command("unshare", args...)
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "envoygateway tests: unshare (needs root):", err)
		return 1
	}
	return 0
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
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %w: %s", args, err, out)
		}
	}
	if err := syscall.Mount("tmpfs", "/certs", "tmpfs", 0, "size=1m"); err != nil {
		return fmt.Errorf("mount a private /certs: %w", err)
	}
	return nil
}
