package main

import (
	"github.com/spf13/cobra"

	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/internal/cli"
)

func newEGExtCommand() *cobra.Command {
	var (
		f    envoygateway.Flags
		logs cli.LogFlags
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
			if err := f.Validate(); err != nil {
				return err
			}
			o, err := f.Options()
			if err != nil {
				return err
			}
			if o.Logger, err = logs.Logger(); err != nil {
				return err
			}
			return envoygateway.Run(cmd.Context(), o)
		},
	}
	f.AddFlags(cmd.Flags())
	logs.AddFlags(cmd.Flags())
	return cmd
}
