package main

import (
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/infergate/infergate/sim"
)

func newSimCommand() *cobra.Command {
	var o sim.Options
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run a simulated vLLM model server",
		Long: `Run one or more simulated vLLM model servers that speak the OpenAI
completion and chat APIs, queue requests, keep a prefix cache and export
vLLM's Prometheus metrics, for tests, benchmarks and demos without GPUs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return sim.Run(cmd.Context(), o, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)))
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
