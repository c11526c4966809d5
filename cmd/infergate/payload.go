package main

import (
	"github.com/spf13/cobra"

	"github.com/infergate/infergate/extproc/payload"
	"github.com/infergate/infergate/internal/cli"
)

func newPayloadCommand() *cobra.Command {
	var logs cli.LogFlags
	o := payload.NewOptions()
	cmd := &cobra.Command{
		Use:   "payload",
		Short: "Run the payload processor (ext_proc): model headers from the body, guardrails, token usage",
		Long: `Runs the payload processor: an Envoy ext_proc server (FULL_DUPLEX_STREAMED) that reads
inference request bodies, sets X-Gateway-Model-Name and X-Gateway-Base-Model-Name, applies the
guardrails of --config-file (model allow-list, limits, deny rules, PII mask or reject), and reports
response token usage as dynamic metadata in the io.infergate.payload namespace.

The configuration file is re-read when it changes; streams already open keep the old one.
With --configmap-namespace, adapter → base-model entries also come from the ConfigMaps
labelled inference.llm-d.ai/ipp-managed: "true" (keys baseModel, adapters), live.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			log, err := logs.Logger()
			if err != nil {
				return err
			}
			cli.TuneGC(payloadGCPercent)
			o.Server.LimitGoMemory()
			c := o.Config()
			c.Logger = log
			s, err := payload.New(c)
			if err != nil {
				return err
			}
			log.Info("payload processor ready", "grpc", s.GRPCAddr(), "health", s.HealthAddr(), "metrics", s.MetricsAddr(), "config", c.ConfigFile)
			return s.Run(cmd.Context())
		},
	}
	o.AddFlags(cmd.Flags())
	logs.AddFlags(cmd.Flags())
	return cmd
}
