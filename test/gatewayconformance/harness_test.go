package gatewayconformance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gie "sigs.k8s.io/gateway-api-inference-extension/conformance"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"

	"github.com/infergate/infergate/conformance/gateway"
	"github.com/infergate/infergate/conformance/report"
	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/test/childproc"
	"github.com/infergate/infergate/test/controlplane"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/livecluster"
	"github.com/infergate/infergate/test/loopback"
)

// image is the reference the base manifests run infergate under; the node
// runs it as the infergate binary the test builds.
const image = "infergate.test/infergate:conformance"

// gatewayClass is the class the runs test.
const gatewayClass = "conformance"

// run is one gateway control plane under test on a live cluster.
type run struct {
	*livecluster.Live
	name    string // the implementation's name in the report path
	version string // the implementation's version
	class   string // the GatewayClass under test (default gatewayClass)
	// withInfergate marks an implementation that includes infergate (its
	// extension): its version names infergate's too.
	withInfergate bool
}

// startLive brings up the API server (with crdDirs), the controllers and
// the node running infergate's binary.
func startLive(t *testing.T, crdDirs ...string) *livecluster.Live {
	t.Helper()
	return startLiveChannel(t, controlplane.StandardChannel, nil, crdDirs...)
}

// startLiveChannel is startLive with the Gateway API CRDs of channel
// (controlplane.StandardChannel or ExperimentalChannel) and the node's
// hold (livecluster.Config.Hold; nil for none).
func startLiveChannel(t *testing.T, channel string, hold func(context.Context, client.Client, *corev1.Pod) bool, crdDirs ...string) *livecluster.Live {
	t.Helper()
	c := gatewaytest.StartClusterChannel(t, "conformance", channel, crdDirs...)
	return livecluster.Start(t, c, livecluster.Config{
		Images: map[string]string{image: childproc.Command(t, "infergate")},
		Env:    []string{"KUBECONFIG=" + c.Kubeconfig},
		Hold:   hold,
	})
}

// startExtension runs infergate's Envoy Gateway extension on the
// namespace's loopback and returns its address. With eds it serves the
// pools' endpoints over EDS, as the chart deploys it; without, they are
// read when Envoy Gateway translates. It writes pool status for the
// Gateways of controller ("": Envoy Gateway's).
func startExtension(t *testing.T, l *livecluster.Live, eds bool, controller string) string {
	t.Helper()
	return loopback.Serve(t, func(ctx context.Context, ln net.Listener) error {
		o := envoygateway.Options{Listener: ln, Kube: l.Env.Config, Logger: logr.Discard(), ControllerName: controller}
		if eds {
			o.EDSAddress = ln.Addr().String()
		}
		return envoygateway.Run(ctx, o)
	})
}

// gatewayClassFor creates the class under test for controller.
func gatewayClassFor(t *testing.T, l *livecluster.Live, controller string) {
	t.Helper()
	gc := &gatewayv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: gatewayClass}, Spec: gatewayv1.GatewayClassSpec{ControllerName: gatewayv1.GatewayController(controller)}}
	if err := l.Client.Create(gatewaytest.Ctx(t), gc); err != nil {
		t.Fatal(err)
	}
}

// envoyGatewayProxies plays the Envoy of every Gateway Envoy Gateway
// deploys: for each of its Envoy Pods that runs, a stand-in bound to the
// Pod's address takes that Gateway's configuration from Envoy Gateway's
// xDS, authenticated as that Pod. It stops when the returned function is
// called.
func envoyGatewayProxies(t *testing.T, l *livecluster.Live, gatewayNamespaceMode bool) (stop func()) {
	t.Helper()
	return eachRunningPod(t, l, client.HasLabels{"gateway.envoyproxy.io/owning-gateway-name"}, func(p *corev1.Pod) {
		xds := gatewaytest.EnvoyGatewayProxyXDS(t, l.Cluster, p, gatewayNamespaceMode)
		t.Logf("stand-in for Gateway %s at %s (Pod %s/%s)", xds.NodeCluster, p.Status.PodIP, p.Namespace, p.Name)
		gatewaytest.StandIn(t, envoysim.NodeConfig{
			XDS:               xds,
			BootstrapClusters: gatewaytest.EnvoyGatewayBootstrapClusters(t),
			Address:           p.Status.PodIP,
			Lookup:            l.Lookup,
			Timeouts:          standInTimeouts,
		})
	})
}

// standInTimeouts are the stand-ins' timeouts.
var standInTimeouts = envoysim.Timeouts{Route: 20 * time.Second, Connect: 2 * time.Second, Shutdown: time.Second}

// eachRunningPod calls start once for each Pod matching sel that has an
// address and is not terminating, as they come, until the returned
// function is called.
func eachRunningPod(t *testing.T, l *livecluster.Live, sel client.ListOption, start func(p *corev1.Pod)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		started := map[string]bool{}
		for ctx.Err() == nil {
			var pods corev1.PodList
			if err := l.Client.List(ctx, &pods, sel); err == nil {
				for i := range pods.Items {
					p := &pods.Items[i]
					key := p.Namespace + "/" + p.Name
					if started[key] || p.Status.PodIP == "" || p.DeletionTimestamp != nil {
						continue
					}
					started[key] = true
					start(p)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// options are the profile's options for a run on the test cluster: the
// suite's waits capped (the control planes here converge in seconds), the
// report written where $INFERGATE_CONFORMANCE_REPORTS says, else in the
// test's folder.
func (r *run) options(t *testing.T, maxWait time.Duration) gateway.Options {
	t.Helper()
	timeouts := gateway.CappedTimeouts(maxWait)
	// Not the wait for consistent responses: GatewayWeightedAcrossTwoInferencePools
	// warms each pod up by asking for it alone through a route that splits
	// 70/30, and waits for three answers from it in a row, so a correct
	// gateway needs about 37 s on average per secondary pod (1 s between
	// tries); upstream's 300 s makes a false failure about 1 in 1,500 runs.
	timeouts.MaxTimeToConsistency = gateway.DefaultTimeouts().MaxTimeToConsistency
	version := r.version
	if r.withInfergate {
		v, err := controlplane.Version(gatewaytest.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		version += "+infergate-" + v
	}
	return gateway.Options{
		RestConfig:           r.Env.Config,
		GatewayClass:         cmp.Or(r.class, gatewayClass),
		CleanupBaseResources: true,
		Images:               gateway.Images{EPP: image, ModelServer: image},
		Timeouts:             &timeouts,
		ReportOutput:         r.reportPath(t),
		// One test, while working on it.
		RunTest: os.Getenv("INFERGATE_CONFORMANCE_RUN_TEST"),
		Implementation: confv1.Implementation{
			Organization: "infergate", Project: r.name, URL: "https://github.com/infergate/infergate",
			Version: version, Contact: []string{"@infergate/maintainers"},
		},
	}
}

// reportPath is where the run's report goes: under
// $INFERGATE_CONFORMANCE_REPORTS, else in the test's folder.
func (r *run) reportPath(t *testing.T) string {
	dir := os.Getenv("INFERGATE_CONFORMANCE_REPORTS")
	if dir == "" {
		return filepath.Join(t.TempDir(), "report.yaml")
	}
	path := filepath.Join(dir, r.name, fmt.Sprintf("%s-default-gateway-report.yaml", r.version))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// command runs the profile as a user does, `infergate-conformance
// --profile gateway` against the cluster's kubeconfig with o's settings,
// and returns its report, its output and whether it passed.
func (r *run) command(t *testing.T, o gateway.Options, maxWait time.Duration) (*gie.GatewayAPIInferenceExtensionConformanceReport, string, bool) {
	t.Helper()
	impl := o.Implementation
	args := []string{"--profile", "gateway", "--kubeconfig", r.Kubeconfig, "--gateway-class", o.GatewayClass,
		"--epp-image", o.Images.EPP, "--model-server-image", o.Images.ModelServer, "--max-wait", maxWait.String(),
		"--report-output", o.ReportOutput, "--organization", impl.Organization, "--project", impl.Project, "--url", impl.URL,
		"--version", impl.Version, "--contact", strings.Join(impl.Contact, ",")}
	if o.RunTest != "" {
		args = append(args, "--run-test", o.RunTest)
	}
	if !o.CleanupBaseResources {
		args = append(args, "--cleanup-base-resources=false")
	}
	if len(o.SkipTests) > 0 {
		args = append(args, "--skip-tests", strings.Join(o.SkipTests, ","))
	}
	// Bounded by the run's own waits, not by a step's (gatewaytest.Ctx).
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, childproc.Command(t, "infergate-conformance"), args...)
	outB, err := cmd.CombinedOutput()
	out := string(outB)
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	// The run's verdicts, one line a test, for the log.
	for _, line := range strings.Split(out, "\n") {
		if trimmed := strings.TrimSpace(line); strings.HasPrefix(trimmed, "--- ") && strings.Count(trimmed, "/") == 1 {
			t.Log(trimmed)
		}
	}
	rep, rerr := report.Read(o.ReportOutput)
	if rerr != nil {
		t.Fatalf("infergate-conformance wrote no report (%v):\n%s", rerr, tail(out, 120))
	}
	return rep, out, err == nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// failureOutput is what to show for a run whose failed tests are not the
// expected ones: the run's own output of each unexpected failure (its
// story, which the run's tail may no longer hold), or else the tail's last
// n lines.
func failureOutput(out string, failed, expected []string, n int) string {
	unexpected := slices.DeleteFunc(slices.Clone(failed), func(name string) bool { return slices.Contains(expected, name) })
	return cmp.Or(testsOutput(out, unexpected), tail(out, n))
}

// testsOutput is what the run printed for each of the named tests, from
// its "=== RUN" line to the next test's.
func testsOutput(out string, names []string) string {
	const run = "=== RUN   " + gatewayProfileRun + "/"
	lines := strings.Split(out, "\n")
	var b strings.Builder
	for _, name := range names {
		in := false
		for _, line := range lines {
			trimmed := strings.TrimSpace(line)
			if rest, ok := strings.CutPrefix(trimmed, run); ok {
				in = rest == name || strings.HasPrefix(rest, name+"/")
			}
			if in {
				b.WriteString(line)
				b.WriteByte('\n')
			}
		}
	}
	return b.String()
}

// gatewayProfileRun is the name the command runs the profile under.
const gatewayProfileRun = "GatewayProfile"

// TestFailureOutput: a run that failed tests it should not have shows
// those tests' own output (their subtests too), not others'; with none to
// show, the run's tail.
func TestFailureOutput(t *testing.T) {
	out := strings.Join([]string{
		"    === RUN   GatewayProfile/A", "first", "    === RUN   GatewayProfile/A/sub", "second",
		"    === RUN   GatewayProfile/AB", "third", "    === RUN   GatewayProfile/B", "fourth", "end",
	}, "\n")
	got := failureOutput(out, []string{"A", "B"}, []string{"B"}, 1)
	if !strings.Contains(got, "first") || !strings.Contains(got, "second") || strings.Contains(got, "third") || strings.Contains(got, "fourth") {
		t.Errorf("unexpected failure A: got\n%s", got)
	}
	if got := failureOutput(out, []string{"B"}, []string{"B"}, 1); got != "end" {
		t.Errorf("no unexpected failure: got %q, want the tail", got)
	}
}
