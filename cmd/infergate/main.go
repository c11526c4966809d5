// Command infergate is the one binary of the project: the endpoint picker,
// the payload processor, the gateway extension server and the tools around
// them, as subcommands.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "infergate:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "infergate",
		Short:         "Inference routing extensions for Kubernetes gateways",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newVersionCommand(),
		newEPPCommand(),
		newPayloadCommand(),
		newSimCommand(),
		newDevproxyCommand(),
		newEGExtCommand(),
		newEnvoyBootstrapCommand(),
		newConformanceCommand(),
	)
	return root
}
