package istio

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/infergate/infergate/test/controlplane"
)

// istioNamespace is where istiod runs.
const istioNamespace = "istio-system"

type cluster struct {
	env         *controlplane.Env
	client      client.Client
	kubeconfig  string
	dir         string
	istio       string // hack/istio.sh's folder: pilot-discovery, crds/
	kubeVersion chartutil.KubeVersion
	rendered    []*unstructured.Unstructured // what install applied from the charts
}

// testTimeout bounds each wait for istiod.
const testTimeout = 60 * time.Second

// istioDir is $INFERGATE_ISTIO (make test sets it), or the folder
// hack/istio.sh builds once and caches.
func istioDir(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("INFERGATE_ISTIO"); dir != "" {
		return dir
	}
	ctx := testCtx(t)
	root, err := controlplane.ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "istio.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/istio.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// startCluster brings up the API server with the Gateway API, InferencePool
// and Istio CRDs, and writes a kubeconfig for istiod.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	ctx := testCtx(t)
	dir := istioDir(t)
	env, err := controlplane.Start(ctx, filepath.Join(dir, "crds"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme, err := controlplane.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := env.AddUser("istiod", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	kc := filepath.Join(tmp, "kubeconfig")
	if err := writeKubeconfig(kc, admin); err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	v, err := dc.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	cl := &cluster{env: env, client: c, kubeconfig: kc, dir: tmp, istio: dir,
		kubeVersion: chartutil.KubeVersion{Version: v.GitVersion, Major: v.Major, Minor: v.Minor}}
	cl.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: istioNamespace}})
	return cl
}

func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	return clientcmd.WriteToFile(*kc, path)
}

func (c *cluster) create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.client.Create(testCtx(t), o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// istiodXDS is where istiod serves plaintext xDS inside the namespace.
const istiodXDS = "127.0.0.1:15010"

// startIstiod runs pilot-discovery with Gateway API inference support on,
// its own deployment controller off (nothing would run the Deployments it
// makes), until the test ends, and waits for it to be ready.
func (c *cluster) startIstiod(t *testing.T) {
	t.Helper()
	logPath := filepath.Join(c.dir, "istiod.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, filepath.Join(c.istio, "pilot-discovery"), "discovery",
		"--kubeconfig", c.kubeconfig, "--domain", "cluster.local",
		"--grpcAddr", istiodXDS, "--httpAddr", "127.0.0.1:8080", "--monitoringAddr", "127.0.0.1:15014",
		"--secureGRPCAddr", "127.0.0.1:15012", "--httpsAddr", "127.0.0.1:15017")
	cmd.Env = append(os.Environ(),
		"POD_NAMESPACE="+istioNamespace, "POD_NAME=istiod-0", "CLUSTER_ID=Kubernetes", "REVISION=default",
		"ENABLE_GATEWAY_API_INFERENCE_EXTENSION=true",
		"PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER=false",
		"PILOT_ENABLE_ANALYSIS=false", "VALIDATION_WEBHOOK_CONFIG_NAME=", "ISTIOD_CUSTOM_HOST=istiod.istio-system.svc",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		_ = logf.Close()
		if t.Failed() || testing.Verbose() {
			out, _ := os.ReadFile(logPath)
			t.Logf("istiod log (last 8 KiB):\n%s", tail(out, 8192))
		}
	})
	waitFor(t, "istiod ready", 90*time.Second, func() bool {
		resp, err := http.Get("http://127.0.0.1:8080/ready")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
