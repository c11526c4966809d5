// Command infergate is the binary the image ships: the endpoint picker, the
// payload processor, the Envoy Gateway extension server, the plain-Envoy
// bootstrap writer and the model-server simulator (the conformance suite's
// echo server runs from the release image), as subcommands. It links no
// test framework (TestNoTestFrameworks): the conformance suite is
// cmd/infergate-conformance, the Envoy stand-in cmd/envoysim.
package main

import (
	"github.com/spf13/cobra"

	"github.com/infergate/infergate/internal/cli"
)

func main() { cli.Main(newRootCommand()) }

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
		newEGExtCommand(),
		newEnvoyBootstrapCommand(),
	)
	return root
}
