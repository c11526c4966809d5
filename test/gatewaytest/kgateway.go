package gatewaytest

import (
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/infergate/infergate/envoysim/xdsclient"
)

// kgateway's control plane as the tests run it.
const (
	KgatewayNamespace  = "kgateway-system"
	KgatewayController = "kgateway.dev/kgateway"
	KgatewayClass      = "kgateway"
	// KgatewayXDS is where kgateway serves plaintext xDS; it binds every
	// interface (KGW_XDS_SERVICE_PORT), so it runs inside the test's
	// network namespace.
	KgatewayXDS = "127.0.0.1:9977"
	// kgatewayReady is controller-runtime's readiness endpoint on the
	// manager's health port (setup.go, HealthProbeBindAddress ":9093").
	kgatewayReady = "http://127.0.0.1:9093/readyz"
)

// KgatewayDir holds the kgateway controller and kgateway's own CRDs
// (crds/): $INFERGATE_KGATEWAY (make test sets it), or what
// hack/kgateway.sh builds once and caches.
func KgatewayDir(t *testing.T) string {
	t.Helper()
	return Built(t, "INFERGATE_KGATEWAY", "kgateway.sh")
}

// StartKgateway creates kgateway's namespace (POD_NAMESPACE, where it keeps
// objects of its own, its JWKS store's ConfigMaps say) and runs kgateway's
// controller there with its Envoy InferencePool support on until the test
// ends, and waits for it to be ready. Settings
// come from its KGW_ environment (api/settings/settings.go):
//   - KGW_ENABLE_INFER_EXT registers the InferencePool plugin;
//   - KGW_ENABLE_AGENTGATEWAY=false, as kgateway's chart sets it, keeps
//     it from needing agentgateway's CRDs and a second xDS port;
//   - KGW_XDS_AUTH=false: the Envoy's role is read from its node metadata
//     rather than from a service-account token, which kgateway's own
//     bootstrap sends over plaintext and the stand-in's xDS client will
//     not;
//   - KGW_LISTENER_BIND_IPV6=false: listeners on 0.0.0.0, the namespace
//     has no IPv6.
func StartKgateway(t *testing.T, c *Cluster, dir string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KgatewayNamespace}}
	if err := c.Client.Create(Ctx(t), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	c.Run(t, "kgateway", []string{
		"KUBECONFIG=" + c.Kubeconfig, "POD_NAMESPACE=" + KgatewayNamespace, "POD_NAME=kgateway-0",
		"KGW_ENABLE_INFER_EXT=true", "KGW_ENABLE_AGENTGATEWAY=false", "KGW_XDS_AUTH=false",
		"KGW_LISTENER_BIND_IPV6=false", "KGW_DISABLE_LEADER_ELECTION=true", "KGW_DEFAULT_IMAGE_TAG=v2.2.0",
	}, filepath.Join(dir, "kgateway"))
	// Its readiness check waits for its informers to sync before it
	// answers, so each poll is bounded.
	hc := &http.Client{Timeout: 2 * time.Second}
	WaitFor(t, "kgateway ready", 90*time.Second, func() bool {
		resp, err := hc.Get(kgatewayReady)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// KgatewayNode is the xDS identity of a Gateway's Envoy as kgateway's own
// bootstrap gives it (pkg/kgateway/helm/envoy/templates/configmap.yaml):
// node id "<pod>.<namespace>", which kgateway splits to find the Pod (it
// must exist), cluster "<gateway>.<namespace>", and the role
// "kgateway-kube-gateway-api~<namespace>~<gateway>" its snapshot cache is
// keyed on.
func KgatewayNode(podName, namespace, gateway string) xdsclient.Config {
	md, err := structpb.NewStruct(map[string]any{
		"role": fmt.Sprintf("kgateway-kube-gateway-api~%s~%s", namespace, gateway),
	})
	if err != nil {
		panic(err) // unreachable: strings only
	}
	return xdsclient.Config{
		Server:       KgatewayXDS,
		NodeID:       podName + "." + namespace,
		NodeCluster:  gateway + "." + namespace,
		NodeMetadata: md,
	}
}
