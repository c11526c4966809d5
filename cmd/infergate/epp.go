package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/infergate/infergate/extproc/epp"
)

func newEPPCommand() *cobra.Command {
	var (
		c    epp.StandaloneConfig
		srv  serverFlags
		logs logFlags
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
			if c.Server, err = srv.options(); err != nil {
				return err
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
	srv.register(fs, 9002, 9003)
	fs.StringVar(&c.PoolFile, "pool-file", "", "YAML file listing the pool's endpoints (standalone mode)")
	fs.StringVar(&c.ConfigFile, "config-file", "", "EndpointPickerConfig file (default: the built-in profile)")
	fs.StringVar(&c.ConfigText, "config-text", "", "EndpointPickerConfig as text")
	fs.DurationVar(&c.RefreshInterval, "refresh-metrics-interval", 0, "how often endpoint metrics are scraped (default: the config's, 50ms)")
	fs.DurationVar(&c.MetricsStaleness, "metrics-staleness-threshold", 2*time.Second, "endpoint metrics older than this count as unknown")
	fs.BoolVar(&c.EmitScores, "emit-endpoint-scores", false, "add each target's score to the envoy.lb metadata (x-gateway-destination-endpoint-scores)")
	logs.register(fs)
	return cmd
}
