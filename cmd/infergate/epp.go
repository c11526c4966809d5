package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/infergate/infergate/extproc/epp"
	"github.com/infergate/infergate/extproc/server"
)

func newEPPCommand() *cobra.Command {
	var (
		c                                 epp.StandaloneConfig
		grpcPort, healthPort, metricsPort int
		grpcBind, healthBind, metricsBind string
		secure                            bool
		certPath                          string
		logs                              logFlags
	)
	cmd := &cobra.Command{
		Use:   "epp",
		Short: "Run the endpoint picker (ext_proc) over a pool of model servers",
		Long: `Runs the endpoint picker: an Envoy ext_proc server that picks the model-server
endpoint for each inference request and answers x-gateway-destination-endpoint.

Standalone mode takes the endpoints from --pool-file (re-read when it changes).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logs.logger()
			if err != nil {
				return err
			}
			tuneGC()
			c.Logger = log
			c.GRPCAddr = net.JoinHostPort(grpcBind, strconv.Itoa(grpcPort))
			if healthPort > 0 {
				c.HealthAddr = net.JoinHostPort(healthBind, strconv.Itoa(healthPort))
			}
			if metricsPort > 0 {
				c.MetricsAddr = net.JoinHostPort(metricsBind, strconv.Itoa(metricsPort))
			}
			c.TLS = server.TLSOptions{Enabled: secure}
			if certPath != "" {
				c.TLS.CertFile = filepath.Join(certPath, "tls.crt")
				c.TLS.KeyFile = filepath.Join(certPath, "tls.key")
			}
			for name, port := range map[string]int{"--grpc-port": grpcPort, "--grpc-health-port": healthPort, "--metrics-port": metricsPort} {
				if port < 0 || port > 65535 {
					return fmt.Errorf("%s: %d is not a port", name, port)
				}
			}
			s, err := epp.NewStandalone(c)
			if err != nil {
				return err
			}
			log.Info("endpoint picker ready", "grpc", s.GRPCAddr(), "health", s.HealthAddr(), "metrics", s.MetricsAddr(),
				"endpoints", len(s.Store().Endpoints()))
			return s.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&grpcPort, "grpc-port", 9002, "ext_proc gRPC port")
	fs.StringVar(&grpcBind, "grpc-bind-address", "", "address the ext_proc listener binds (empty: all interfaces)")
	fs.IntVar(&healthPort, "grpc-health-port", 9003, "gRPC health port (services liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor); 0 disables")
	fs.StringVar(&healthBind, "grpc-health-bind-address", "", "address the health listener binds (empty: all interfaces)")
	fs.IntVar(&metricsPort, "metrics-port", 9090, "Prometheus metrics port; 0 disables")
	fs.StringVar(&metricsBind, "metrics-bind-address", "", "address the metrics listener binds (empty: all interfaces)")
	fs.BoolVar(&secure, "secure-serving", true, "serve ext_proc over TLS (a self-signed certificate unless --cert-path is set)")
	fs.StringVar(&certPath, "cert-path", "", "directory holding tls.crt and tls.key for secure serving")
	fs.StringVar(&c.PoolFile, "pool-file", "", "YAML file listing the pool's endpoints (standalone mode)")
	fs.StringVar(&c.ConfigFile, "config-file", "", "EndpointPickerConfig file (default: the built-in profile)")
	fs.StringVar(&c.ConfigText, "config-text", "", "EndpointPickerConfig as text")
	fs.DurationVar(&c.RefreshInterval, "refresh-metrics-interval", 0, "how often endpoint metrics are scraped (default: the config's, 50ms)")
	fs.DurationVar(&c.MetricsStaleness, "metrics-staleness-threshold", 2*time.Second, "endpoint metrics older than this count as unknown")
	fs.Int64Var(&c.MaxRequestBodyBytes, "max-request-body-bytes", 16<<20, "larger request bodies are answered 413; 0 = unlimited")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 30*time.Second, "on stop, how long open streams may finish")
	fs.BoolVar(&c.EmitScores, "emit-endpoint-scores", false, "add each target's score to the envoy.lb metadata (x-gateway-destination-endpoint-scores)")
	fs.BoolVar(&c.Pprof, "enable-pprof", false, "serve Go profiles under /debug/pprof/ on the metrics listener")
	logs.register(fs)
	return cmd
}
