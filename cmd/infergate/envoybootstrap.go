package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/infergate/infergate/gateways/envoy"
)

func newEnvoyBootstrapCommand() *cobra.Command {
	var configFile string
	cmd := &cobra.Command{
		Use:   "envoy-bootstrap --config gateway.yaml",
		Short: "Print a complete plain-Envoy bootstrap for inference pools, their pickers and the payload processor",
		Long: `envoy-bootstrap renders the configuration a plain Envoy (no control plane) needs to route to
inference pools: a listener whose filters are the payload processor's ext_proc (optional), the removal
of a client's x-gateway-destination-endpoint, and one ext_proc per pool's endpoint picker (its
failure_mode_allow from the pool's failure mode), routes to an ORIGINAL_DST cluster keyed on the
picker's x-gateway-destination-endpoint and, for FailOpen pools, a round-robin fallback over the
pool's endpoints; TLS to both processors; the admin interface on loopback. The output is JSON, which
Envoy reads with -c. See the README, "Plain Envoy", for the gateway.yaml fields.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile == "" {
				return fmt.Errorf("--config is required")
			}
			cfg, err := envoy.LoadConfig(configFile)
			if err != nil {
				return err
			}
			b, err := envoy.Bootstrap(cfg)
			if err != nil {
				return err
			}
			out, err := envoy.Marshal(b)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	cmd.Flags().StringVar(&configFile, "config", "", "the gateway description (YAML): pools, pickers, payload processor")
	return cmd
}
