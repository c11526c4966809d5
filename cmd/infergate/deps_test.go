package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoTestFrameworks holds the image's binary to what it runs: no test
// framework (ginkgo, gomega, testify: the conformance suite is
// cmd/infergate-conformance), none of the test harness (the Envoy
// stand-in and its ext_proc filter model in envoysim/, the proxy-wasm host
// wasm/wasmtest, test/), and no package of this module that imports
// "testing" outside its tests. The standard library's testing package
// itself is linked, by third-party code: prometheus/common's expfmt
// (through pandatix/go-abnf) and client-go's gentype (client-go/testing).
// The conformance binary, which does link ginkgo, shows the check sees.
func TestNoTestFrameworks(t *testing.T) {
	if bad := testCode(t, "infergate"); len(bad) > 0 {
		t.Errorf("cmd/infergate links test code:\n%s", strings.Join(bad, "\n"))
	}
	if bad := testCode(t, "infergate-conformance"); !slices.Contains(bad, "github.com/onsi/ginkgo/v2") {
		t.Errorf("the check does not see ginkgo in cmd/infergate-conformance (it found %q)", bad)
	}
}

// testCode lists the test frameworks and harness packages cmd/<binary>
// links.
func testCode(t *testing.T, binary string) []string {
	t.Helper()
	const module = "github.com/infergate/infergate/"
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"cmd/"+binary).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 100 {
		t.Fatalf("go list -deps gave %d packages for %s; a check over them would prove nothing", len(lines), binary)
	}
	forbidden := []string{"github.com/onsi/ginkgo", "github.com/onsi/gomega", "github.com/stretchr/testify",
		module + "envoysim", module + "wasm/wasmtest", module + "test/", module + "conformance"}
	var bad []string
	for _, line := range lines {
		pkg, imports, _ := strings.Cut(line, " ")
		ours := strings.HasPrefix(pkg, module)
		if slices.ContainsFunc(forbidden, func(f string) bool { return strings.HasPrefix(pkg, f) }) ||
			ours && (strings.HasSuffix(pkg, "test") || slices.Contains(strings.Fields(imports), "testing")) {
			bad = append(bad, pkg)
		}
	}
	return bad
}
