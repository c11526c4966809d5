package main

import (
	"fmt"
	"net"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/internal/cli"
	"github.com/infergate/infergate/internal/kubeconfig"
)

func newEGExtCommand() *cobra.Command {
	var (
		bind, certFile, keyFile, kube, namespace, edsAddr, payloadAddr, controller string
		clientCertFile, clientKeyFile                                              string
		port                                                                       int
		payloadTLS, payloadFailOpen                                                bool
		logs                                                                       cli.LogFlags
	)
	cmd := &cobra.Command{
		Use:   "egext",
		Short: "Envoy Gateway extension server: HTTPRoute → InferencePool through the pool's endpoint picker",
		Long: `egext is the extension server Envoy Gateway (v1.9) calls through its extensionManager, with
InferencePool (inference.networking.k8s.io/v1) listed in backendResources and the post hooks
Route, Cluster and Translation. For each HTTPRoute rule whose backendRef is an InferencePool it
renders the pool's endpoints behind Envoy's override_host policy (the picker's envoy.lb answer,
round robin over the pool when a FailOpen picker is down), the picker's cluster and one ext_proc
filter per pool with failure_mode_allow from the pool's failureMode. It reads Pods, with
credentials from --kubeconfig, $KUBECONFIG or the in-cluster service account.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if port < 1 || port > 65535 {
				return fmt.Errorf("--port %d: want 1-65535", port)
			}
			if (certFile == "") != (keyFile == "") {
				return fmt.Errorf("--tls-cert-file and --tls-key-file go together")
			}
			if (clientCertFile == "") != (clientKeyFile == "") {
				return fmt.Errorf("--processor-client-cert-file and --processor-client-key-file go together")
			}
			var pl *envoygateway.Payload
			if payloadAddr != "" {
				if _, _, err := net.SplitHostPort(payloadAddr); err != nil {
					return fmt.Errorf("--payload-address %q: %w", payloadAddr, err)
				}
				pl = &envoygateway.Payload{Address: payloadAddr, TLS: payloadTLS, FailOpen: payloadFailOpen}
			}
			cfg, err := kubeconfig.Load(kube)
			if err != nil {
				return fmt.Errorf("egext: kubernetes credentials: %w", err)
			}
			log, err := logs.Logger()
			if err != nil {
				return fmt.Errorf("egext logger: %w", err)
			}
			return envoygateway.Run(cmd.Context(), envoygateway.Options{
				Addr: net.JoinHostPort(bind, strconv.Itoa(port)), CertFile: certFile, KeyFile: keyFile,
				EDSAddress: edsAddr, Payload: pl, ClientCertFile: clientCertFile, ClientKeyFile: clientKeyFile,
				Kube: cfg, Namespace: namespace, ControllerName: controller, Logger: log,
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&bind, "bind-address", "", "address the gRPC listener binds (empty: all interfaces)")
	f.IntVar(&port, "port", 5005, "gRPC port Envoy Gateway's extensionManager.service points at")
	f.StringVar(&certFile, "tls-cert-file", "", "PEM certificate to serve TLS (extensionManager.service.tls); plaintext without")
	f.StringVar(&keyFile, "tls-key-file", "", "PEM key of --tls-cert-file")
	f.StringVar(&kube, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then in-cluster)")
	f.StringVar(&namespace, "namespace", "", "watch pods of this namespace only (default: all namespaces)")
	f.StringVar(&edsAddr, "eds-address", "", "host:port Envoy reaches this server at (its Service, e.g. infergate-egext.infergate-system.svc.cluster.local:5005): "+
		"the pools' endpoints are then served over EDS and follow pods without Envoy Gateway translating; without it they are read at each translation")
	f.StringVar(&controller, "gateway-controller-name", envoygateway.DefaultControllerName, "Envoy Gateway's GatewayClass controllerName: pool status is written for the Gateways it manages")
	f.StringVar(&payloadAddr, "payload-address", "", "host:port of the payload processor (its Service) to run before the pools' pickers on every listener that serves a pool")
	f.BoolVar(&payloadTLS, "payload-tls", true, "reach the payload processor over TLS, accepting its self-signed certificate")
	f.BoolVar(&payloadFailOpen, "payload-fail-open", false, "let requests through when the payload processor cannot be reached (failure_mode_allow)")
	f.StringVar(&clientCertFile, "processor-client-cert-file", "", "PEM certificate Envoy presents to the pickers and the payload processor over TLS, for processors run with --client-ca-file")
	f.StringVar(&clientKeyFile, "processor-client-key-file", "", "PEM key of --processor-client-cert-file")
	logs.AddFlags(f)
	return cmd
}
