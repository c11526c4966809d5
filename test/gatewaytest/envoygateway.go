package gatewaytest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/envoysim/xdsclient"

	// Types of Envoy Gateway's bootstrap that the stand-in does not link.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
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

// EnvoyGateway says how Envoy Gateway runs.
type EnvoyGateway struct {
	// Extension, when set (host:port), registers infergate's extension
	// server for InferencePool backends.
	Extension string
	// GatewayNamespaceMode deploys each Gateway's Envoy in the Gateway's
	// namespace (provider.kubernetes.deploy.type GatewayNamespace), as the
	// upstream conformance suite needs (it wants a ready Pod in the
	// Gateways' namespace). Envoy Gateway then authenticates its proxies
	// by service-account token, through the API server's TokenReview with
	// in-cluster credentials: the test mounts InClusterCredentials.
	GatewayNamespaceMode bool
}

// InClusterCredentials is where a Pod's service-account credentials are,
// and where Envoy Gateway reads them in gateway-namespace mode; a test that
// uses the mode mounts a private tmpfs there (PrivateMounts).
const InClusterCredentials = "/var/run/secrets/kubernetes.io/serviceaccount"

// EnvoyGatewayAudience is the audience of the tokens Envoy Gateway's xDS
// server accepts in gateway-namespace mode.
const EnvoyGatewayAudience = "envoy-gateway." + EnvoyGatewayNamespace + ".svc.cluster.local"

// EnvoyGatewayConfig is the EnvoyGateway resource for eg.
func EnvoyGatewayConfig(eg EnvoyGateway) string {
	deploy := ""
	if eg.GatewayNamespaceMode {
		deploy = `
    deploy:
      type: GatewayNamespace`
	}
	cfg := `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway:
  controllerName: ` + EnvoyGatewayController + `
provider:
  type: Kubernetes
  kubernetes:
    proxyTopologyInjector:
      disabled: true` + deploy + `
logging:
  level:
    default: info
`
	if eg.Extension != "" {
		host, port, _ := strings.Cut(eg.Extension, ":")
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

// StartEnvoyGateway runs certgen and Envoy Gateway's controller as eg says
// until the test ends. Envoy Gateway reads its certificates from /certs:
// the test runs in a mount namespace with a private /certs.
func StartEnvoyGateway(t *testing.T, c *Cluster, eg EnvoyGateway) {
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
	if eg.GatewayNamespaceMode {
		env = append(env, inClusterCredentials(t, c)...)
	}
	cfgPath := filepath.Join(c.Dir, "envoy-gateway.yaml")
	if err := os.WriteFile(cfgPath, []byte(EnvoyGatewayConfig(eg)), 0o600); err != nil {
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

// inClusterCredentials gives Envoy Gateway the credentials a Pod of its
// own would have (a service account bound to cluster-admin, its token and
// the API server's CA in InClusterCredentials) and returns the environment
// that points rest.InClusterConfig at the API server.
func inClusterCredentials(t *testing.T, c *Cluster) []string {
	t.Helper()
	ctx := Ctx(t)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "envoy-gateway", Namespace: EnvoyGatewayNamespace}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "envoy-gateway"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}},
	}
	for _, o := range []client.Object{sa, binding} {
		if err := c.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}}
	if err := c.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("service-account token for Envoy Gateway: %v", err)
	}
	for file, data := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": c.Env.Config.CAData, "namespace": []byte(EnvoyGatewayNamespace)} {
		if err := os.WriteFile(filepath.Join(InClusterCredentials, file), data, 0o600); err != nil {
			t.Fatalf("in-cluster credentials (the test must mount a private %s): %v", InClusterCredentials, err)
		}
	}
	host, port, err := net.SplitHostPort(strings.TrimPrefix(c.Env.Config.Host, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	return []string{"KUBERNETES_SERVICE_HOST=" + host, "KUBERNETES_SERVICE_PORT=" + port}
}

// EnvoyGatewayProxyXDS is the xDS client configuration of the Envoy in
// pod, which Envoy Gateway deployed for the Gateway it names in its
// labels: in gateway-namespace mode server-verified TLS and a token of the
// Pod's service account bound to the Pod, else the "envoy" client
// certificate.
func EnvoyGatewayProxyXDS(t *testing.T, c *Cluster, pod *corev1.Pod, gatewayNamespaceMode bool) xdsclient.Config {
	t.Helper()
	cfg := xdsclient.Config{
		Server: EnvoyGatewayXDS, NodeID: pod.Name,
		NodeCluster: pod.Labels["gateway.envoyproxy.io/owning-gateway-namespace"] + "/" + pod.Labels["gateway.envoyproxy.io/owning-gateway-name"],
		TLS:         EnvoyGatewayTLS(t, c),
	}
	if !gatewayNamespaceMode {
		return cfg
	}
	cfg.TLS.Certificates = nil
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: pod.Spec.ServiceAccountName, Namespace: pod.Namespace}}
	ref := &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	cfg.Token = func(ctx context.Context) (string, error) {
		tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			Audiences: []string{EnvoyGatewayAudience}, ExpirationSeconds: ptrTo(int64(3600)), BoundObjectRef: ref,
		}}
		if err := c.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
			return "", err
		}
		return tr.Status.Token, nil
	}
	return cfg
}

func ptrTo[T any](v T) *T { return &v }

// EnvoyGatewayBootstrap is the bootstrap Envoy Gateway v1.9.1 gives the
// Envoy of a Gateway by default: its own rendering, kept in its module
// (internal/xds/bootstrap/testdata/render/enable-prometheus.yaml, what
// TestGetRenderedBootstrapConfig renders from the default ProxyMetrics).
// Its static clusters are the only ones an api_config_source may name.
func EnvoyGatewayBootstrap(t testing.TB) *bootstrapv3.Bootstrap {
	t.Helper()
	dir, err := controlplane.ModuleDir(context.Background(), "github.com/envoyproxy/gateway")
	if err != nil {
		t.Fatal(err)
	}
	bs, err := envoysim.LoadBootstrap(filepath.Join(dir, "internal", "xds", "bootstrap", "testdata", "render", "enable-prometheus.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return bs
}

// EnvoyGatewayBootstrapClusters are the clusters of EnvoyGatewayBootstrap
// a stand-in playing Envoy Gateway's Envoy runs with beside its ADS stream:
// the static ones (xds_cluster, prometheus_stats), which are also the only
// ones an api_config_source may name. local_cluster is left out: an EDS
// cluster of the Envoy's own Service for zone-aware balancing, which no
// route here uses, named in the rendering Envoy Gateway keeps (its
// default, "local_cluster") as nothing serves it, so the stand-in would
// hold its tables for the 15 s initial_fetch_timeout at every start.
func EnvoyGatewayBootstrapClusters(t testing.TB) []*clusterv3.Cluster {
	t.Helper()
	var out []*clusterv3.Cluster
	for _, c := range EnvoyGatewayBootstrap(t).GetStaticResources().GetClusters() {
		if c.GetType() != clusterv3.Cluster_EDS {
			out = append(out, c)
		}
	}
	return out
}

// CheckConfigSources walks every ConfigSource in the listeners, routes
// and clusters x holds and checks each api_config_source as Envoy does
// against bs (source/common/config/utility.cc
// checkApiConfigSourceSubscriptionBackingCluster): an envoy_grpc cluster
// must be a static cluster of the bootstrap, not of type EDS; a
// google_grpc channel names none. Callers hold x.Mu.
func CheckConfigSources(bs *bootstrapv3.Bootstrap, x *XDS) error {
	primary := map[string]bool{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetType() != clusterv3.Cluster_EDS {
			primary[c.GetName()] = true
		}
	}
	var errs []error
	check := func(where string, m proto.Message) {
		walkMessages(m.ProtoReflect(), func(acs *corev3.ApiConfigSource) {
			if acs.GetApiType() == corev3.ApiConfigSource_AGGREGATED_GRPC || acs.GetApiType() == corev3.ApiConfigSource_AGGREGATED_DELTA_GRPC {
				return
			}
			names := slices.Clone(acs.GetClusterNames())
			for _, gs := range acs.GetGrpcServices() {
				if eg := gs.GetEnvoyGrpc(); eg != nil {
					names = append(names, eg.GetClusterName())
				}
			}
			for _, n := range names {
				if !primary[n] {
					errs = append(errs, fmt.Errorf("%s: api_config_source names cluster %q, which is not a static non-EDS cluster of the bootstrap: Envoy rejects it", where, n))
				}
			}
		})
	}
	for name, l := range x.Listeners {
		check("listener "+name, l)
	}
	for name, r := range x.Routes {
		check("route configuration "+name, r)
	}
	for name, c := range x.Clusters {
		check("cluster "+name, c)
	}
	return errors.Join(errs...)
}

// walkMessages calls f on every ApiConfigSource within m, typed_config
// payloads (Any) included.
func walkMessages(m protoreflect.Message, f func(*corev3.ApiConfigSource)) {
	if acs, ok := m.Interface().(*corev3.ApiConfigSource); ok {
		f(acs)
		return
	}
	if a, ok := m.Interface().(*anypb.Any); ok {
		if inner, err := a.UnmarshalNew(); err == nil {
			walkMessages(inner.ProtoReflect(), f)
		}
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { walkMessages(mv.Message(), f); return true })
			}
		case fd.IsList():
			if fd.Message() != nil {
				for i := range v.List().Len() {
					walkMessages(v.List().Get(i).Message(), f)
				}
			}
		case fd.Message() != nil:
			walkMessages(v.Message(), f)
		}
		return true
	})
}
