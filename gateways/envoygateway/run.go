package envoygateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"

	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Options configure the extension server.
type Options struct {
	// Addr is the gRPC listen address Envoy Gateway's extensionManager
	// service points at; Listener, when set, is used instead.
	Addr     string
	Listener net.Listener
	// CertFile and KeyFile, when set, serve TLS (extensionManager.service.tls).
	CertFile, KeyFile string
	// Kube is the API server the pods are read from.
	Kube *rest.Config
	// Namespace limits what is watched (pods, pools, routes); empty
	// watches every namespace.
	Namespace string
	// EDSAddress, when set, is where Envoy reaches this server (host:port,
	// e.g. the extension's Service): the pools' endpoints are then served
	// over EDS from a Pod watch, so pods coming and going reach Envoy without
	// Envoy Gateway translating. Without it they are read at translation.
	EDSAddress string
	// Payload, when set, is the payload processor to run before the pools'
	// pickers on every listener that serves a pool.
	Payload *Payload
	// ClientCertFile and ClientKeyFile, when set, are the PEM certificate
	// and key Envoy presents to the pickers and the payload processor, for
	// processors that require client certificates (--client-ca-file). Read
	// at start-up.
	ClientCertFile, ClientKeyFile string
	// ControllerName is Envoy Gateway's GatewayClass controller
	// (default DefaultControllerName): pool status is written for its Gateways.
	ControllerName string
	// LeaderElectionNamespace, when set, runs the extension as one of
	// several replicas: every replica serves Envoy Gateway's hooks and
	// EDS, and only the one holding the Lease LeaderElectionID in this
	// namespace writes pool status. Empty: this is the only replica.
	LeaderElectionNamespace string
	Logger                  logr.Logger
}

// Run serves the extension until ctx ends: a Pod cache (the pools'
// endpoints), the EnvoyGatewayExtension service and gRPC health.
func Run(ctx context.Context, o Options) error {
	if o.Kube == nil {
		return errors.New("envoygateway: Kubernetes credentials are required")
	}
	if o.ControllerName == "" {
		o.ControllerName = DefaultControllerName
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, gatewayv1.Install, inferencev1.Install} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	copts := cache.Options{Scheme: scheme}
	if o.Namespace != "" {
		copts.DefaultNamespaces = map[string]cache.Config{o.Namespace: {}}
	}
	mgr, err := ctrl.NewManager(o.Kube, ctrl.Options{Scheme: scheme, Cache: copts, Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Logger: o.Logger,
		LeaderElection: o.LeaderElectionNamespace != "", LeaderElectionNamespace: o.LeaderElectionNamespace,
		LeaderElectionID: LeaderElectionID, LeaderElectionReleaseOnCancel: true})
	if err != nil {
		return fmt.Errorf("envoygateway: %w", err)
	}
	if err := setUpStatus(mgr, o.ControllerName, o.Logger.WithName("status")); err != nil {
		return fmt.Errorf("envoygateway: pool status controller: %w", err)
	}
	var opts []grpc.ServerOption
	if o.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return fmt.Errorf("envoygateway: TLS certificate: %w", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	}
	cfg := Config{Payload: o.Payload}
	if o.ClientCertFile != "" || o.ClientKeyFile != "" {
		if cfg.ClientCert, err = LoadClientCert(o.ClientCertFile, o.ClientKeyFile); err != nil {
			return fmt.Errorf("envoygateway: %w", err)
		}
	}
	g := grpc.NewServer(opts...)
	if o.EDSAddress != "" {
		cfg.EDS = &EDSServer{Address: o.EDSAddress, TLS: o.CertFile != ""}
		if cfg.EDS.TLS {
			if cfg.EDS.RootCAs, err = edsRootCAs(o.CertFile); err != nil {
				return fmt.Errorf("envoygateway: %w", err)
			}
		}
		cache := newEndpointCache()
		if err := setUpEndpoints(mgr, cache, o.Logger.WithName("eds")); err != nil {
			return fmt.Errorf("envoygateway: endpoints controller: %w", err)
		}
		endpointservice.RegisterEndpointDiscoveryServiceServer(g, serverv3.NewServer(ctx, cache, nil))
	}
	NewServer(KubeEndpoints{Reader: mgr.GetCache()}, KubeRules{Reader: mgr.GetCache()}, cfg, o.Logger).Register(g)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	ln := o.Listener
	if ln == nil {
		if ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp", o.Addr); err != nil {
			return fmt.Errorf("envoygateway: listen %s: %w", o.Addr, err)
		}
	}
	defer ln.Close() // Serve never ran if the cache never synced
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() { errc <- mgr.Start(ctx) }()
	go func() {
		// Answer only once the pod cache is filled: before, every pool
		// would look empty.
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return
		}
		hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		o.Logger.Info("extension server ready", "address", ln.Addr().String())
		errc <- g.Serve(ln)
	}()
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	g.GracefulStop()
	cancel()
	return err
}

// LeaderElectionID is the Lease the replicas take turns on to write pool
// status (Options.LeaderElectionNamespace).
const LeaderElectionID = "infergate-egext-status"

// LeaseRoleRules is what leader election needs in its namespace.
func LeaseRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
	}
}

// ClusterRoleRules is every permission the extension needs, cluster-wide
// (namespaced to Options.Namespace when that is set): it reads pods (the
// pools' endpoints), services and their EndpointSlices (the pickers'
// replicas), HTTPRoutes and InferencePools,
// writes InferencePool status, and records Events about pools.
func ClusterRoleRules() []rbacv1.PolicyRule {
	read := []string{"get", "list", "watch"}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "services"}, Verbs: read},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
		{APIGroups: []string{gatewayv1.GroupName}, Resources: []string{"httproutes"}, Verbs: read},
		{APIGroups: []string{inferencev1.GroupVersion.Group}, Resources: []string{"inferencepools"}, Verbs: read},
		{APIGroups: []string{inferencev1.GroupVersion.Group}, Resources: []string{"inferencepools/status"}, Verbs: []string{"get", "update", "patch"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}

// LoadClientCert reads a PEM certificate chain and key for ClientCert,
// checking that they form a pair: a bad pair would otherwise surface only
// as every Envoy failing its handshakes with the processors.
func LoadClientCert(certFile, keyFile string) (*ClientCert, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("a client certificate needs both a certificate file and a key file")
	}
	chain, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("client certificate key: %w", err)
	}
	if _, err := tls.X509KeyPair(chain, key); err != nil {
		return nil, fmt.Errorf("client certificate %s with key %s: %w", certFile, keyFile, err)
	}
	return &ClientCert{ChainPEM: chain, KeyPEM: key}, nil
}

// edsRootCAs is what Envoy verifies the extension's certificate against on
// its EDS channel: ca.crt beside the certificate (a kubernetes.io/tls
// Secret from cert-manager carries it), else the certificate itself (a
// self-signed one is its own root). The certificate must name the host of
// the EDS address.
func edsRootCAs(certFile string) ([]byte, error) {
	for _, f := range []string{filepath.Join(filepath.Dir(certFile), "ca.crt"), certFile} {
		b, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) && f != certFile {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("EDS root certificates: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("EDS root certificates: %s holds no PEM certificate", f)
		}
		return b, nil
	}
	return nil, nil // unreachable: certFile is the last candidate
}
