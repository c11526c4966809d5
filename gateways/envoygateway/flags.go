package envoygateway

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/infergate/infergate/internal/kubeconfig"
)

// Flags are Options as the extension server's command line gives them.
type Flags struct {
	BindAddress, Kubeconfig, Namespace string
	Port                               int
	CertFile, KeyFile                  string
	EDSAddress                         string
	ControllerName                     string
	PayloadAddress                     string
	PayloadTLS, PayloadFailOpen        bool
	ProcessorClientCertFile            string
	ProcessorClientKeyFile             string
	LeaderElect                        bool
	LeaderElectionNamespace            string
}

// AddFlags binds the flags to fs with their defaults.
func (f *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.BindAddress, "bind-address", "", "address the gRPC listener binds (empty: all interfaces)")
	fs.IntVar(&f.Port, "port", 5005, "gRPC port Envoy Gateway's extensionManager.service points at")
	fs.StringVar(&f.CertFile, "tls-cert-file", "", "PEM certificate to serve TLS (extensionManager.service.tls); plaintext without")
	fs.StringVar(&f.KeyFile, "tls-key-file", "", "PEM key of --tls-cert-file")
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then in-cluster)")
	fs.StringVar(&f.Namespace, "namespace", "", "watch pods of this namespace only (default: all namespaces)")
	fs.StringVar(&f.EDSAddress, "eds-address", "", "host:port Envoy reaches this server at (its Service, e.g. infergate-egext.infergate-system.svc.cluster.local:5005): "+
		"the pools' endpoints are then served over EDS and follow pods without Envoy Gateway translating; without it they are read at each translation")
	fs.StringVar(&f.ControllerName, "gateway-controller-name", DefaultControllerName, "Envoy Gateway's GatewayClass controllerName: pool status is written for the Gateways it manages")
	fs.StringVar(&f.PayloadAddress, "payload-address", "", "host:port of the payload processor (its Service) to run before the pools' pickers on every listener that serves a pool")
	fs.BoolVar(&f.PayloadTLS, "payload-tls", true, "reach the payload processor over TLS, accepting its self-signed certificate")
	fs.BoolVar(&f.PayloadFailOpen, "payload-fail-open", false, "let requests through when the payload processor cannot be reached (failure_mode_allow)")
	fs.StringVar(&f.ProcessorClientCertFile, "processor-client-cert-file", "", "PEM certificate Envoy presents to the pickers and the payload processor over TLS, for processors run with --client-ca-file")
	fs.StringVar(&f.ProcessorClientKeyFile, "processor-client-key-file", "", "PEM key of --processor-client-cert-file")
	fs.BoolVar(&f.LeaderElect, "leader-elect", false, "run as one of several replicas: all serve Envoy Gateway and EDS, the holder of the Lease "+LeaderElectionID+" writes pool status")
	fs.StringVar(&f.LeaderElectionNamespace, "leader-election-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the leader election Lease (default: $POD_NAMESPACE)")
}

// Validate checks the flags without touching files or the network; each
// error names the flag.
func (f *Flags) Validate() error {
	if f.Port < 1 || f.Port > 65535 {
		return fmt.Errorf("--port %d: want 1-65535", f.Port)
	}
	if (f.CertFile == "") != (f.KeyFile == "") {
		return errors.New("--tls-cert-file and --tls-key-file go together")
	}
	if (f.ProcessorClientCertFile == "") != (f.ProcessorClientKeyFile == "") {
		return errors.New("--processor-client-cert-file and --processor-client-key-file go together")
	}
	if f.PayloadAddress != "" {
		if _, _, err := net.SplitHostPort(f.PayloadAddress); err != nil {
			return fmt.Errorf("--payload-address %q: %w", f.PayloadAddress, err)
		}
	}
	if f.EDSAddress != "" {
		if _, _, err := net.SplitHostPort(f.EDSAddress); err != nil {
			return fmt.Errorf("--eds-address %q: %w", f.EDSAddress, err)
		}
	}
	if f.LeaderElect && f.LeaderElectionNamespace == "" {
		return errors.New("--leader-elect needs --leader-election-namespace (or $POD_NAMESPACE)")
	}
	return nil
}

// Options are the extension's options from the flags, with the cluster's
// credentials loaded (their logger left to the caller).
func (f *Flags) Options() (Options, error) {
	cfg, err := kubeconfig.Load(f.Kubeconfig)
	if err != nil {
		return Options{}, fmt.Errorf("kubernetes credentials: %w", err)
	}
	o := Options{
		Addr: net.JoinHostPort(f.BindAddress, strconv.Itoa(f.Port)), CertFile: f.CertFile, KeyFile: f.KeyFile,
		EDSAddress: f.EDSAddress, ClientCertFile: f.ProcessorClientCertFile, ClientKeyFile: f.ProcessorClientKeyFile,
		Kube: cfg, Namespace: f.Namespace, ControllerName: f.ControllerName,
	}
	if f.LeaderElect {
		o.LeaderElectionNamespace = f.LeaderElectionNamespace
	}
	if f.PayloadAddress != "" {
		o.Payload = &Payload{Address: f.PayloadAddress, TLS: f.PayloadTLS, FailOpen: f.PayloadFailOpen}
	}
	return o, nil
}
