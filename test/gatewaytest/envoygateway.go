package gatewaytest

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/infergate/infergate/test/controlplane"
)

// Envoy Gateway as the tests run it: its namespace (where it keeps its
// certificates), its default GatewayClass controller, and its xDS server
// inside the test's network namespace.
const (
	EnvoyGatewayNamespace  = "envoy-gateway-system"
	EnvoyGatewayController = "gateway.envoyproxy.io/gatewayclass-controller"
	EnvoyGatewayXDS        = "127.0.0.1:18000"
)

// EnvoyGatewayCRDs is the folder of Envoy Gateway's own CRDs, for
// StartCluster.
func EnvoyGatewayCRDs(t *testing.T) string {
	t.Helper()
	dir, err := controlplane.ModuleDir(Ctx(t), "github.com/envoyproxy/gateway")
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "charts", "gateway-helm", "charts", "crds", "crds", "generated")
}

// envoyGatewayBinary is $INFERGATE_ENVOY_GATEWAY (make test sets it), or
// the binary hack/envoygateway.sh builds once and caches.
func envoyGatewayBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("INFERGATE_ENVOY_GATEWAY"); bin != "" {
		return bin
	}
	return filepath.Join(Built(t, "", "envoygateway.sh"), "envoy-gateway")
}

// EnvoyGatewayConfig is the EnvoyGateway resource; with extension (host:port)
// set, infergate's extension server is registered for InferencePool
// backends.
func EnvoyGatewayConfig(extension string) string {
	cfg := `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway:
  controllerName: ` + EnvoyGatewayController + `
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

// StartEnvoyGateway runs certgen and Envoy Gateway's controller (with the
// extension at extension, if set) until the test ends. Envoy Gateway reads
// its certificates from /certs: the test runs in a mount namespace with a
// private /certs.
func StartEnvoyGateway(t *testing.T, c *Cluster, extension string) {
	t.Helper()
	if err := c.Client.Create(Ctx(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: EnvoyGatewayNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	bin := envoyGatewayBinary(t)
	env := []string{"KUBECONFIG=" + c.Kubeconfig, "ENVOY_GATEWAY_NAMESPACE=" + EnvoyGatewayNamespace}
	certgen := exec.CommandContext(Ctx(t), bin, "certgen", "--disable-topology-injector")
	certgen.Env = append(os.Environ(), env...)
	if out, err := certgen.CombinedOutput(); err != nil {
		t.Fatalf("envoy-gateway certgen: %v\n%s", err, out)
	}
	var secret corev1.Secret
	if err := c.Client.Get(Ctx(t), client.ObjectKey{Namespace: EnvoyGatewayNamespace, Name: "envoy-gateway"}, &secret); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.WriteFile(filepath.Join("/certs", file), secret.Data[file], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfgPath := filepath.Join(c.Dir, "envoy-gateway.yaml")
	if err := os.WriteFile(cfgPath, []byte(EnvoyGatewayConfig(extension)), 0o600); err != nil {
		t.Fatal(err)
	}
	c.Run(t, "envoy-gateway", env, bin, "server", "--config-path", cfgPath)
}

// EnvoyGatewayTLS is what Envoy Gateway's Envoy presents to its xDS server:
// the "envoy" certificate certgen issued, and its CA.
func EnvoyGatewayTLS(t *testing.T, c *Cluster) *tls.Config {
	t.Helper()
	var s corev1.Secret
	if err := c.Client.Get(Ctx(t), client.ObjectKey{Namespace: EnvoyGatewayNamespace, Name: "envoy"}, &s); err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.Data["ca.crt"]) {
		t.Fatal("no CA in the envoy secret")
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "envoy-gateway", MinVersion: tls.VersionTLS12}
}
