package main

import (
	"github.com/spf13/cobra"

	"github.com/infergate/infergate/extproc/epp"
	"github.com/infergate/infergate/internal/cli"
)

func newEPPCommand() *cobra.Command {
	var logs cli.LogFlags
	o := epp.NewFlags()
	cmd := &cobra.Command{
		Use:   "epp",
		Short: "Run the endpoint picker (ext_proc) over a pool of model servers",
		Long: `Runs the endpoint picker: an Envoy ext_proc server that picks the model-server
endpoint for each inference request and answers x-gateway-destination-endpoint.

Standalone mode takes the endpoints from --pool-file (re-read when it changes).
Kubernetes mode (--pool-name, --pool-namespace) follows an InferencePool and the
ready Pods it selects, one endpoint per Pod and target port; credentials come
from --kubeconfig, $KUBECONFIG or the in-cluster service account.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			log, err := logs.Logger()
			if err != nil {
				return err
			}
			cli.TuneGC(serverGCPercent)
			o.Server.LimitGoMemory()
			c := o.Config()
			c.Logger = log
			s, err := epp.NewService(c)
			if err != nil {
				return err
			}
			log.Info("endpoint picker ready", "grpc", s.GRPCAddr(), "health", s.HealthAddr(), "metrics", s.MetricsAddr(),
				"endpoints", len(s.Store().Endpoints()))
			return s.Run(cmd.Context())
		},
	}
	o.AddFlags(cmd.Flags())
	logs.AddFlags(cmd.Flags())
	return cmd
}
