// Package brokentest is how the conformance profiles prove each spec can
// fail: a profile's tests run the suite in a child process against
// deliberately broken implementations and read ginkgo's report to check
// that exactly the specs covering each defect failed. Child runs the suite
// against any other implementation the same way (ginkgo runs one suite
// per process).
package brokentest

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/onsi/ginkgo/v2/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/internal/testcert"
)

// In a child process, variantEnv names the broken variant to run the
// suite against and reportEnv the file ginkgo's report goes to.
const (
	variantEnv = "INFERGATE_CONFORMANCE_BROKEN"
	reportEnv  = "INFERGATE_CONFORMANCE_REPORT"
)

// Variant is the broken variant this process is to run the suite
// against, "" in the parent test.
func Variant() string { return os.Getenv(variantEnv) }

// WriteReport writes ginkgo's report where the parent test reads it; call
// it from a ReportAfterSuite node. Nothing is written in the parent.
func WriteReport(r types.Report) error {
	path := os.Getenv(reportEnv)
	if path == "" {
		return nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// Check runs the test binary's TestConformance once per variant (name →
// the specs it must fail) in a child process, and checks from the report
// that exactly those of all specs failed and every other passed, and that
// each spec fails for some variant.
func Check(t *testing.T, all []string, variants map[string][]string) {
	t.Helper()
	covered := map[string]bool{}
	for name, fail := range variants {
		for _, spec := range fail {
			covered[spec] = true
		}
		t.Run(name, func(t *testing.T) {
			r, out, err := Child(t, variantEnv+"="+name)
			if exitErr := (*exec.ExitError)(nil); !errors.As(err, &exitErr) {
				t.Fatalf("the suite against a broken implementation must fail, got err %v\n%s", err, out)
			}
			states := States(r)
			for _, s := range r.SpecReports {
				if s.LeafNodeType == types.NodeTypeIt && s.State == types.SpecStateFailed {
					t.Logf("%s: %s", s.LeafNodeText, s.Failure.Message)
				}
			}
			for _, spec := range all {
				want := types.SpecStatePassed
				if slices.Contains(fail, spec) {
					want = types.SpecStateFailed
				}
				if states[spec] != want {
					t.Errorf("spec %q: state %v, want %v", spec, states[spec], want)
				}
			}
			if len(states) != len(all) {
				t.Errorf("report has %d specs, want %d: %v", len(states), len(all), states)
			}
		})
	}
	for _, spec := range all {
		if !covered[spec] {
			t.Errorf("no broken variant makes spec %q fail", spec)
		}
	}
}

// States is each spec's state in r, by its text.
func States(r types.Report) map[string]types.SpecState {
	out := map[string]types.SpecState{}
	for _, s := range r.SpecReports {
		if s.LeafNodeType == types.NodeTypeIt {
			out[s.LeafNodeText] = s.State
		}
	}
	return out
}

// Child runs the test binary's TestConformance in a child process with
// env added to this one's, and returns ginkgo's report of it, the child's
// output, and how it exited (an *exec.ExitError when the suite failed).
func Child(t *testing.T, env ...string) (types.Report, []byte, error) {
	t.Helper()
	report := filepath.Join(t.TempDir(), "report.json")
	cmd := exec.Command(os.Args[0], "-test.run=^TestConformance$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), env...), reportEnv+"="+report)
	out, runErr := cmd.CombinedOutput()
	var r types.Report
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("no report: %v (the child exited with %v)\n%s", err, runErr, out)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r, out, runErr
}

// Serve runs a gRPC server on 127.0.0.1 over TLS (a test certificate)
// until the test ends, with what register adds and, when healthServices
// are given, grpc.health.v1 SERVING for each of them. It returns the
// address.
func Serve(t *testing.T, register func(*grpc.Server), healthServices ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cert := testcert.NewCA(t, "broken").Server(t)
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	register(gs)
	if len(healthServices) > 0 {
		hs := health.NewServer()
		for _, svc := range healthServices {
			hs.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
		}
		healthpb.RegisterHealthServer(gs, hs)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

// SendBody re-emits a request body the way a FULL_DUPLEX_STREAMED
// processor does once it has decided: the chunks it received (an empty
// body as one empty chunk), the last marked end of stream; dropFirst
// leaves out the first of several chunks, a defect the chunked-body specs
// must catch.
func SendBody(srv extprocv3.ExternalProcessor_ProcessServer, chunks [][]byte, dropFirst bool) error {
	if len(chunks) == 0 {
		chunks = [][]byte{nil}
	}
	if dropFirst && len(chunks) > 1 {
		chunks = chunks[1:]
	}
	for i, c := range chunks {
		if err := srv.Send(fakeproc.Streamed(false, c, i == len(chunks)-1)); err != nil {
			return err
		}
	}
	return nil
}
