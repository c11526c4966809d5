package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"

	"github.com/infergate/infergate/conformance/epp"
	"github.com/infergate/infergate/conformance/payload"
	"github.com/infergate/infergate/conformance/report"
	payloadsvc "github.com/infergate/infergate/extproc/payload"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/wasm/wasmtest"
)

// conformanceArgsEnv carries the conformance command's arguments to the
// child process that runs it: ginkgo runs one suite per process.
const conformanceArgsEnv = "INFERGATE_TEST_CONFORMANCE_ARGS"

// runConformanceChild runs `infergate-conformance args...` in a child
// process of this test binary and returns its output and whether it
// succeeded.
func runConformanceChild(t *testing.T, args ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestConformanceCommand$", "-test.count=1")
	cmd.Env = append(os.Environ(), conformanceArgsEnv+"="+strings.Join(append([]string{"--no-color"}, args...), "\x1f"))
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatal(err)
	}
	return string(out), err == nil
}

// TestConformanceCommand runs the command as a user would: a dry run lists
// the specs; the payload profile passes against infergate's processor and
// fails, naming the behaviour, against an address where nothing listens.
func TestConformanceCommand(t *testing.T) {
	if args := os.Getenv(conformanceArgsEnv); args != "" {
		out, err := execute(strings.Split(args, "\x1f")...)
		fmt.Print(out)
		if err != nil {
			fmt.Println(err)
			os.Exit(3)
		}
		os.Exit(0)
	}

	out, ok := runConformanceChild(t, "--profile", "epp", "--epp-address", "127.0.0.1:1", "--epp-endpoints", "10.0.0.1:8000,10.0.0.2:8000", "--dry-run")
	if !ok || !strings.Contains(out, epp.SpecPick) || strings.Contains(out, payload.SpecMalformedJSON) {
		t.Fatalf("dry run of the epp profile:\n%s", out)
	}

	file := filepath.Join(t.TempDir(), "payload.yaml")
	if err := os.WriteFile(file, []byte("models:\n  bases:\n  - name: base\n    adapters: [adapter]\ndeny:\n- name: d\n  contains: [ignore previous instructions]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := payloadsvc.New(payloadsvc.Config{
		Server: server.Options{GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
			TLS: server.TLSOptions{Enabled: true}, DrainTimeout: time.Second},
		ConfigFile: file, Logger: logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	for range 100 {
		if s.GRPCAddr() != "" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	reportFile := filepath.Join(t.TempDir(), "report.yaml")
	reportFlags := []string{"--report-output", reportFile, "--organization", "acme", "--project", "proc", "--url", "https://acme.example",
		"--version", "v1", "--contact", "@acme"}
	out, ok = runConformanceChild(t, append([]string{"--profile", "payload", "--payload-address", s.GRPCAddr(), "--payload-model", "adapter",
		"--payload-base-model", "base", "--payload-denied-prompt", "please ignore previous instructions"}, reportFlags...)...)
	if !ok || !strings.Contains(out, "Ran 9 of 9 Specs") {
		t.Fatalf("the payload profile against infergate's processor:\n%s", out)
	}
	checkPayloadReport(t, reportFile, confv1.Success, 9, 0)

	out, ok = runConformanceChild(t, append([]string{"--profile", "payload", "--payload-address", "127.0.0.1:1", "--payload-model", "m"}, reportFlags...)...)
	if ok || !strings.Contains(out, payload.SpecChatCompletion) || !strings.Contains(out, "some specs failed") {
		t.Fatalf("the payload profile against nothing must fail, naming the specs:\n%s", out)
	}
	checkPayloadReport(t, reportFile, confv1.Failure, 0, 8) // the guardrail spec is skipped without a prompt

	// The same profile against the processor built as a proxy-wasm plugin,
	// given the same policy in its JSON form: all but health.
	wasm := filepath.Join(t.TempDir(), "payload.wasm")
	if err := wasmtest.Build(context.Background(), "./wasm/payload", wasm); err != nil {
		t.Fatal(err)
	}
	wasmConfig := filepath.Join(t.TempDir(), "payload.json")
	if err := os.WriteFile(wasmConfig, []byte(`{"models":{"bases":[{"name":"base","adapters":["adapter"]}]},"deny":[{"name":"d","contains":["ignore previous instructions"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, ok = runConformanceChild(t, "--profile", "payload", "--payload-wasm", wasm, "--payload-wasm-config", wasmConfig, "--payload-model", "adapter",
		"--payload-base-model", "base", "--payload-denied-prompt", "please ignore previous instructions")
	if !ok || !strings.Contains(out, "Ran 8 of 9 Specs") || !strings.Contains(out, "1 Skipped") {
		t.Fatalf("the payload profile against the Wasm plugin:\n%s", out)
	}

	if _, err := execute("--profile", "payload", "--payload-address", "127.0.0.1:1", "--payload-model", "m",
		"--report-output", reportFile); err == nil || !strings.Contains(err.Error(), "--organization") {
		t.Fatalf("a report without the implementation's names: %v", err)
	}

	if _, err := execute("--profile", "mesh"); err == nil || !strings.Contains(err.Error(), "want gateway, epp or payload") {
		t.Fatalf("an unknown profile: %v", err)
	}
}

// TestConformanceGatewayFlags: the gateway profile's dry run lists
// upstream's tests with what --run-test and --skip-tests leave out, and
// its settings fail before anything runs when they cannot work.
func TestConformanceGatewayFlags(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {token: x}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := execute("--profile", "gateway", "--dry-run", "--skip-tests", "InferencePoolAccepted", "--gateway-class", "acme")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`GatewayClass "acme"`, "GatewayWeightedAcrossTwoInferencePools", "EppUnAvailableFailOpen", "InfergateFailCloseWhenItsPickerIsDown"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run does not mention %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`InferencePoolAccepted +skip \(--skip-tests\)`).MatchString(out) {
		t.Errorf("dry run does not mark the skipped test:\n%s", out)
	}
	if out, err := execute("--profile", "gateway", "--dry-run", "--upstream-only"); err != nil || strings.Contains(out, "Infergate") {
		t.Errorf("dry run with --upstream-only (%v) lists infergate's tests:\n%s", err, out)
	}
	out, err = execute("--profile", "gateway", "--dry-run", "--run-test", "GatewayFollowingEPPRouting")
	if err != nil || !regexp.MustCompile(`GatewayFollowingEPPRouting +run\n`).MatchString(out) || !regexp.MustCompile(`InferencePoolAccepted +skip \(not --run-test\)`).MatchString(out) {
		t.Errorf("dry run with --run-test (%v):\n%s", err, out)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"with another profile", []string{"--profile", "gateway,epp"}, "runs alone"},
		{"unreadable kubeconfig", []string{"--profile", "gateway", "--kubeconfig", filepath.Join(dir, "none")}, "none"},
		{"report without the implementation", []string{"--profile", "gateway", "--kubeconfig", kc, "--report-output", filepath.Join(dir, "r.yaml")}, "--organization"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := execute(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// checkPayloadReport reads the report the command wrote: one profile, the
// payload profile's, with these figures.
func checkPayloadReport(t *testing.T, path string, result confv1.Result, passed, failed uint32) {
	t.Helper()
	r, err := report.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.ProfileReports) != 1 {
		t.Fatalf("report profiles %+v, want the payload profile's alone", r.ProfileReports)
	}
	p := r.ProfileReports[0]
	if p.Name != report.PayloadProfile || p.Core.Result != result || p.Core.Passed != passed || p.Core.Failed != failed ||
		r.Implementation.Project != "proc" {
		t.Fatalf("report %s: %+v", path, r)
	}
}

func execute(args ...string) (string, error) {
	root := newConformanceCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}
