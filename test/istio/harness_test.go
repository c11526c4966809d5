package istio

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/infergate/infergate/test/gatewaytest"
)

// istioNamespace is where istiod runs.
const istioNamespace = "istio-system"

type cluster struct {
	*gatewaytest.Cluster
	istio       string // hack/istio.sh's folder: pilot-discovery, crds/
	kubeVersion chartutil.KubeVersion
	rendered    []*unstructured.Unstructured // what install applied from the charts
}

// testTimeout bounds each wait for istiod.
const testTimeout = 60 * time.Second

// istioDir holds pilot-discovery and Istio's CRDs: $INFERGATE_ISTIO (make
// test sets it), or what hack/istio.sh builds once and caches.
func istioDir(t *testing.T) string {
	t.Helper()
	return gatewaytest.Built(t, "INFERGATE_ISTIO", "istio.sh")
}

// startCluster brings up the API server with the Gateway API, InferencePool
// and Istio CRDs, and writes a kubeconfig for istiod.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	dir := istioDir(t)
	gc := gatewaytest.StartCluster(t, "istiod", filepath.Join(dir, "crds"))
	dc, err := discovery.NewDiscoveryClientForConfig(gc.Env.Config)
	if err != nil {
		t.Fatal(err)
	}
	v, err := dc.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	cl := &cluster{Cluster: gc, istio: dir, kubeVersion: chartutil.KubeVersion{Version: v.GitVersion, Major: v.Major, Minor: v.Minor}}
	cl.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: istioNamespace}})
	return cl
}

func (c *cluster) create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Client.Create(gatewaytest.Ctx(t), o); err != nil && !apierrors.IsAlreadyExists(err) {
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
	c.Run(t, "istiod", []string{
		"POD_NAMESPACE=" + istioNamespace, "POD_NAME=istiod-0", "CLUSTER_ID=Kubernetes", "REVISION=default",
		"ENABLE_GATEWAY_API_INFERENCE_EXTENSION=true",
		"PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER=false",
		"PILOT_ENABLE_ANALYSIS=false", "VALIDATION_WEBHOOK_CONFIG_NAME=", "ISTIOD_CUSTOM_HOST=istiod.istio-system.svc",
	}, filepath.Join(c.istio, "pilot-discovery"), "discovery",
		"--kubeconfig", c.Kubeconfig, "--domain", "cluster.local",
		"--grpcAddr", istiodXDS, "--httpAddr", "127.0.0.1:8080", "--monitoringAddr", "127.0.0.1:15014",
		"--secureGRPCAddr", "127.0.0.1:15012", "--httpsAddr", "127.0.0.1:15017")
	gatewaytest.WaitFor(t, "istiod ready", 90*time.Second, func() bool {
		resp, err := http.Get("http://127.0.0.1:8080/ready")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}
