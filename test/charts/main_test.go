// Package charts tests the Helm charts under charts/ the way an install
// would meet them: values checked against values.schema.json, templates
// rendered by Helm's own engine, `helm lint`'s rules, and every rendered
// object submitted to a real kube-apiserver (envtest, see test/controlplane)
// with server-side dry-run and strict field validation, so the API server's
// own validation (schemas, CRD CEL rules, RBAC) judges them. No helm binary
// is needed.
//
// Istio's CRDs (DestinationRule, EnvoyFilter) are Istio's own, from the
// istio.io/istio module (hack/istio.sh). Prometheus Operator's PodMonitor is
// not available as a Go module here; testdata/crds holds a minimal stand-in,
// marked as such. agentgateway's AgentgatewayPolicy CRD in testdata/crds is
// agentgateway's own published schema (v1.4.0, the payload chart's minimum
// release), trimmed to the parts the chart renders: its header says how.
package charts

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/test/controlplane"
)

// fixture is shared by the tests of this binary: one control plane.
type fixture struct {
	env    *controlplane.Env
	client client.Client
	// kubeVersion is the API server's, so rendering and linting see the
	// cluster the objects are checked against.
	kubeVersion chartutil.KubeVersion
	// runs numbers namespaces, so that -count=N reruns do not collide.
	runs atomic.Int32
}

var fx fixture // set once in TestMain, read by the tests

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	istio, err := istioCRDs(ctx)
	if err != nil {
		cancel()
		fmt.Fprintln(os.Stderr, "Istio's CRDs:", err)
		return 1
	}
	env, err := controlplane.Start(ctx, filepath.Join("testdata", "crds"), istio)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "control plane:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
		}
	}()
	if err := setUp(env); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// istioCRDs is the folder of Istio's CRDs: under $INFERGATE_ISTIO (make
// test sets it), or where hack/istio.sh crds fetches them.
func istioCRDs(ctx context.Context) (string, error) {
	dir := os.Getenv("INFERGATE_ISTIO")
	if dir == "" {
		root, err := controlplane.ModuleRoot(ctx)
		if err != nil {
			return "", err
		}
		out, err := exec.CommandContext(ctx, filepath.Join(root, "hack", "istio.sh"), "crds").Output()
		if err != nil {
			return "", fmt.Errorf("hack/istio.sh crds: %w", err)
		}
		dir = strings.TrimSpace(string(out))
	}
	return filepath.Join(dir, "crds"), nil
}

func setUp(env *controlplane.Env) error {
	cfg := rest.CopyConfig(env.Config)
	// Warnings (unknown fields, deprecated APIs) go to the request that
	// caused them, so a test can fail on them.
	cfg.WarningHandlerWithContext = warningCollector{}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := inferencev1.Install(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	v, err := dc.ServerVersion()
	if err != nil {
		return fmt.Errorf("server version: %w", err)
	}
	fx = fixture{env: env, client: c, kubeVersion: chartutil.KubeVersion{Version: v.GitVersion, Major: v.Major, Minor: v.Minor}}
	return nil
}

// namespace creates a namespace of its own for a test.
func namespace(t *testing.T, name string) string {
	t.Helper()
	name = fmt.Sprintf("%s-%d", name, fx.runs.Add(1))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := fx.client.Create(context.Background(), ns); err != nil {
		t.Fatalf("namespace %s: %v", name, err)
	}
	return name
}

// warningCollector hands API server warnings to the *warnings in the
// request's context.
type warningCollector struct{}

type warningsKey struct{}

type warnings struct {
	mu   sync.Mutex
	list []string
}

func (warningCollector) HandleWarningHeaderWithContext(ctx context.Context, _ int, _ string, text string) {
	if w, ok := ctx.Value(warningsKey{}).(*warnings); ok {
		w.mu.Lock()
		w.list = append(w.list, text)
		w.mu.Unlock()
	}
}

func withWarnings(ctx context.Context) (context.Context, *warnings) {
	w := &warnings{}
	return context.WithValue(ctx, warningsKey{}, w), w
}

func (w *warnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.list...)
}
