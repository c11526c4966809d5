package gatewaytest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"

	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/test/helmrender"
)

// Istio's control plane as the tests run it.
const (
	IstioNamespace  = "istio-system"
	IstioController = "istio.io/gateway-controller"
	// IstioXDS is where istiod serves plaintext xDS inside the namespace.
	IstioXDS = "127.0.0.1:15010"
	// IstioVersion is what the stand-ins report as their ISTIO_VERSION.
	IstioVersion = "1.30.0"
	// IstioHTTP is istiod's HTTP address: readiness and /debug.
	IstioHTTP  = "127.0.0.1:8080"
	istioReady = "http://" + IstioHTTP + "/ready"
)

// IstioDir holds pilot-discovery, Istio's CRDs (crds/) and the
// istio-discovery chart (charts/istio-discovery): $INFERGATE_ISTIO (make
// test sets it), or what hack/istio.sh builds once and caches.
func IstioDir(t *testing.T) string {
	t.Helper()
	return Built(t, "INFERGATE_ISTIO", "istio.sh")
}

// Istiod configures StartIstiod.
type Istiod struct {
	// DeploymentController lets istiod deploy each Gateway (a Deployment
	// and a Service from its kube-gateway template; InstallIstioInjector
	// provides the template). Without it nothing runs the Gateways.
	DeploymentController bool
}

// StartIstiod runs pilot-discovery with Gateway API inference support on
// until the test ends, and waits for it to be ready. The namespace
// IstioNamespace must exist.
func StartIstiod(t *testing.T, c *Cluster, dir string, o Istiod) {
	t.Helper()
	c.Run(t, "istiod", []string{
		"POD_NAMESPACE=" + IstioNamespace, "POD_NAME=istiod-0", "CLUSTER_ID=Kubernetes", "REVISION=default",
		"ENABLE_GATEWAY_API_INFERENCE_EXTENSION=true",
		fmt.Sprintf("PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER=%t", o.DeploymentController),
		"PILOT_ENABLE_ANALYSIS=false", "VALIDATION_WEBHOOK_CONFIG_NAME=", "INJECTION_WEBHOOK_CONFIG_NAME=", "ISTIOD_CUSTOM_HOST=istiod.istio-system.svc",
	}, filepath.Join(dir, "pilot-discovery"), "discovery",
		"--kubeconfig", c.Kubeconfig, "--domain", "cluster.local",
		"--grpcAddr", IstioXDS, "--httpAddr", IstioHTTP, "--monitoringAddr", "127.0.0.1:15014",
		"--secureGRPCAddr", "127.0.0.1:15012", "--httpsAddr", "127.0.0.1:15017")
	WaitFor(t, "istiod ready", 90*time.Second, func() bool {
		resp, err := http.Get(istioReady)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// InstallIstioInjector applies the ConfigMaps of Istio's istio-discovery
// chart, rendered with its defaults: the injection templates and values
// (istio-sidecar-injector, which holds kube-gateway, the template istiod's
// deployment controller renders each Gateway's Deployment and Service
// from) and the mesh configuration (istio).
func InstallIstioInjector(t *testing.T, c *Cluster, dir string) {
	t.Helper()
	ch, err := loader.Load(filepath.Join(dir, "charts", "istio-discovery"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := helmrender.RenderThirdParty(ch, "istiod", IstioNamespace, map[string]any{}, c.KubeVersion(t))
	if err != nil {
		t.Fatalf("render istio-discovery: %v", err)
	}
	want := map[string]bool{"istio-sidecar-injector": true, "istio": true}
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || !want[o.GetName()] {
			continue
		}
		if err := c.Client.Create(Ctx(t), o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create ConfigMap %s/%s: %v", o.GetNamespace(), o.GetName(), err)
		}
		delete(want, o.GetName())
	}
	if len(want) != 0 {
		t.Fatalf("istio-discovery rendered no ConfigMap %v", want)
	}
}

// KubeVersion is the API server's version, as charts render for it.
func (c *Cluster) KubeVersion(t *testing.T) chartutil.KubeVersion {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(c.Env.Config)
	if err != nil {
		t.Fatal(err)
	}
	v, err := dc.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	return chartutil.KubeVersion{Version: v.GitVersion, Major: v.Major, Minor: v.Minor}
}

// CreateIstioNamespace creates IstioNamespace.
func CreateIstioNamespace(t *testing.T, c *Cluster) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: IstioNamespace}}
	if err := c.Client.Create(Ctx(t), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// IstioNode is the xDS identity of a Gateway's Envoy as Istio's gateway
// Pods present it (pilot-agent's bootstrap): a router at the Pod's address
// whose labels name the Gateway; istiod finds the configuration the node
// is for from them.
func IstioNode(podIP, podName, namespace, workload string, labels map[string]string) xdsclient.Config {
	l := make(map[string]any, len(labels))
	for k, v := range labels {
		l[k] = v
	}
	md, err := structpb.NewStruct(map[string]any{
		"NAMESPACE":     namespace,
		"CLUSTER_ID":    "Kubernetes",
		"NAME":          podName,
		"ISTIO_VERSION": IstioVersion,
		"LABELS":        l,
		"WORKLOAD_NAME": workload,
	})
	if err != nil {
		panic(err) // unreachable: strings only
	}
	return xdsclient.Config{
		Server:       IstioXDS,
		NodeID:       fmt.Sprintf("router~%s~%s.%s~%s.svc.cluster.local", podIP, podName, namespace, namespace),
		NodeCluster:  workload + "." + namespace,
		NodeMetadata: md,
	}
}

// IstioAgentPorts serves at ip what an Istio gateway Pod serves besides
// its listeners, until the test ends: the readiness endpoint the Pod's
// probe asks (15021 /healthz/ready, Envoy's static listener in front of
// pilot-agent), pilot-agent's status port (15020) and Envoy's Prometheus
// port (15090). ready says whether the proxy has its configuration.
// A stand-in for pilot-agent, which cannot run here; it answers from
// ready alone.
func IstioAgentPorts(t *testing.T, ip string, ready func() bool) {
	t.Helper()
	health := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz/ready" && ready() {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	empty := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	for port, h := range map[int]http.Handler{15021: health, 15020: health, 15090: empty} {
		ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
		if err != nil {
			t.Fatalf("pilot-agent's port %d: %v", port, err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
}
