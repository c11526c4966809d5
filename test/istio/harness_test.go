package istio

import (
	"path/filepath"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/infergate/infergate/test/gatewaytest"
)

type cluster struct {
	*gatewaytest.Cluster
	istio       string // hack/istio.sh's folder: pilot-discovery, crds/
	kubeVersion chartutil.KubeVersion
}

// testTimeout bounds each wait for istiod.
const testTimeout = 60 * time.Second

// startCluster brings up the API server with the Gateway API, InferencePool
// and Istio CRDs, and writes a kubeconfig for istiod.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	dir := gatewaytest.IstioDir(t)
	gc := gatewaytest.StartCluster(t, "istiod", filepath.Join(dir, "crds"))
	cl := &cluster{Cluster: gc, istio: dir, kubeVersion: gc.KubeVersion(t)}
	gatewaytest.CreateIstioNamespace(t, gc)
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

// startIstiod runs pilot-discovery with Gateway API inference support on,
// its own deployment controller off (the test stands for the Gateway's
// Deployment itself, gatewayPod), until the test ends.
func (c *cluster) startIstiod(t *testing.T) {
	t.Helper()
	gatewaytest.StartIstiod(t, c.Cluster, c.istio, gatewaytest.Istiod{})
}
