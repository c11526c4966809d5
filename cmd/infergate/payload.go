package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/infergate/infergate/extproc/payload"
	"github.com/infergate/infergate/internal/cli"
)

func newPayloadCommand() *cobra.Command {
	var (
		c    payload.Config
		srv  serverFlags
		logs cli.LogFlags
	)
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
			log, err := logs.Logger()
			if err != nil {
				return err
			}
			cli.TuneGC(payloadGCPercent)
			c.Logger = log
			limitGoMemory()
			if c.Server, err = srv.options(); err != nil {
				return err
			}
			s, err := payload.New(c)
			if err != nil {
				return err
			}
			log.Info("payload processor ready", "grpc", s.GRPCAddr(), "health", s.HealthAddr(), "metrics", s.MetricsAddr(), "config", c.ConfigFile)
			return s.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	srv.register(fs, 9004, 9005)
	fs.StringVar(&c.ConfigFile, "config-file", "", "YAML policy: models, limits, pii and deny rules (default: model headers only)")
	fs.DurationVar(&c.ConfigPoll, "config-poll-interval", time.Second, "how often the config file is checked for changes")
	fs.StringVar(&c.ConfigMapNamespace, "configmap-namespace", "", `read adapter ConfigMaps (label inference.llm-d.ai/ipp-managed: "true") in this namespace; "*" for all; empty: off`)
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file for --configmap-namespace (default: $KUBECONFIG, then in-cluster)")
	fs.BoolVar(&c.KeepStreamOptions, "keep-stream-options", false, "forward streamed chat/completions requests as sent; by default the processor adds stream_options.include_usage so their tokens are metered, and removes the extra usage chunk for clients that did not ask")
	logs.AddFlags(fs)
	return cmd
}
