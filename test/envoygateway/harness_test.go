package envoygateway

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/test/controlplane"
)

// egNamespace is where Envoy Gateway runs and keeps its certificates.
const egNamespace = "envoy-gateway-system"

// controllerName is Envoy Gateway's default GatewayClass controller.
const controllerName = "gateway.envoyproxy.io/gatewayclass-controller"

type cluster struct {
	env        *controlplane.Env
	client     client.Client
	kubeconfig string
	dir        string
}

// startCluster brings up the API server with the Gateway API, InferencePool
// and Envoy Gateway CRDs, and writes a kubeconfig for the processes.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	ctx := testCtx(t)
	egDir, err := controlplane.ModuleDir(ctx, "github.com/envoyproxy/gateway")
	if err != nil {
		t.Fatal(err)
	}
	env, err := controlplane.Start(ctx, filepath.Join(egDir, "charts", "gateway-helm", "charts", "crds", "crds", "generated"))
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
	admin, err := env.AddUser("envoy-gateway", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kc, admin); err != nil {
		t.Fatal(err)
	}
	cl := &cluster{env: env, client: c, kubeconfig: kc, dir: dir}
	cl.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: egNamespace}})
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

// egBinary is $INFERGATE_ENVOY_GATEWAY (make test sets it), or the binary
// hack/envoygateway.sh builds once and caches.
func egBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("INFERGATE_ENVOY_GATEWAY"); bin != "" {
		return bin
	}
	ctx := testCtx(t)
	root, err := controlplane.ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "envoygateway.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/envoygateway.sh: %v\n%s", err, stderr.String())
	}
	return filepath.Join(strings.TrimSpace(string(out)), "envoy-gateway")
}

// egConfig is the EnvoyGateway resource; with extension set, infergate's
// extension server is registered for InferencePool backends.
func egConfig(extension string) string {
	cfg := `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway:
  controllerName: ` + controllerName + `
provider:
  type: Kubernetes
  kubernetes:
    proxyTopologyInjector:
      disabled: true
logging:
  level:
    default: info
`
	if extension != "" {
		host, port, _ := strings.Cut(extension, ":")
		cfg += `extensionManager:
  backendResources:
  - group: inference.networking.k8s.io
    version: v1
    kind: InferencePool
  hooks:
    xdsTranslator:
      post: [Route, Cluster, Translation]
      translation:
        listener: {includeAll: true}
        route: {includeAll: true}
        cluster: {includeAll: true}
  service:
    ip:
      address: ` + host + `
      port: ` + port + `
`
	}
	return cfg
}

// startEG runs certgen and Envoy Gateway's controller until the test ends.
func (c *cluster) startEG(t *testing.T, extension string) {
	t.Helper()
	bin := egBinary(t)
	env := append(os.Environ(), "KUBECONFIG="+c.kubeconfig, "ENVOY_GATEWAY_NAMESPACE="+egNamespace)
	certgen := exec.CommandContext(testCtx(t), bin, "certgen", "--disable-topology-injector")
	certgen.Env = env
	if out, err := certgen.CombinedOutput(); err != nil {
		t.Fatalf("envoy-gateway certgen: %v\n%s", err, out)
	}
	var secret corev1.Secret
	if err := c.client.Get(testCtx(t), client.ObjectKey{Namespace: egNamespace, Name: "envoy-gateway"}, &secret); err != nil {
		t.Fatal(err)
	}
	for file, key := range map[string]string{"tls.crt": "tls.crt", "tls.key": "tls.key", "ca.crt": "ca.crt"} {
		if err := os.WriteFile(filepath.Join("/certs", file), secret.Data[key], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfgPath := filepath.Join(c.dir, "envoy-gateway.yaml")
	if err := os.WriteFile(cfgPath, []byte(egConfig(extension)), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(c.dir, "envoy-gateway.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "server", "--config-path", cfgPath)
	cmd.Env = env
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
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("envoy-gateway log (last 4 KiB):\n%s", tail(out, 4096))
		}
	})
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// gatewayObjects are a GatewayClass for Envoy Gateway and a Gateway with an
// HTTP listener in ns.
func gatewayObjects(ns string) []client.Object {
	return []client.Object{
		&gatewayv1.GatewayClass{
			ObjectMeta: metav1.ObjectMeta{Name: "eg"},
			Spec:       gatewayv1.GatewayClassSpec{ControllerName: controllerName},
		},
		&gatewayv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Name: "inference-gateway", Namespace: ns},
			Spec: gatewayv1.GatewaySpec{
				GatewayClassName: "eg",
				Listeners:        []gatewayv1.Listener{{Name: "http", Protocol: gatewayv1.HTTPProtocolType, Port: 80}},
			},
		},
	}
}

// poolRoute is an HTTPRoute on the Gateway whose only backend is pool.
func poolRoute(ns, name, pool string) *gatewayv1.HTTPRoute {
	group := gatewayv1.Group(inferencev1.GroupVersion.Group)
	kind := gatewayv1.Kind("InferencePool")
	return &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "inference-gateway"}}},
			Rules: []gatewayv1.HTTPRouteRule{{
				BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
					Group: &group, Kind: &kind, Name: gatewayv1.ObjectName(pool),
				}}}},
			}},
		},
	}
}

// inferencePool selects app=<name> pods on port 8000, with its picker at
// <name>-epp:9002.
func inferencePool(ns, name string, failureMode inferencev1.EndpointPickerFailureMode) *inferencev1.InferencePool {
	return &inferencev1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: inferencev1.InferencePoolSpec{
			Selector:    inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": inferencev1.LabelValue(name)}},
			TargetPorts: []inferencev1.Port{{Number: 8000}},
			EndpointPickerRef: &inferencev1.EndpointPickerRef{
				Name: inferencev1.ObjectName(name + "-epp"), Port: &inferencev1.Port{Number: 9002}, FailureMode: failureMode,
			},
		},
	}
}

// routeCondition waits until the route's status for the Gateway has
// condition typ, and returns it.
func (c *cluster) routeCondition(t *testing.T, ns, name, typ string) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	waitFor(t, fmt.Sprintf("HTTPRoute %s/%s condition %s", ns, name, typ), 60*time.Second, func() bool {
		var r gatewayv1.HTTPRoute
		if err := c.client.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: name}, &r); err != nil {
			return false
		}
		for _, p := range r.Status.Parents {
			for _, cond := range p.Conditions {
				if cond.Type == typ {
					got = cond
					return true
				}
			}
		}
		return false
	})
	return got
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
		time.Sleep(100 * time.Millisecond)
	}
}
