package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/infergate/infergate/extproc/epp"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/internal/cli"
)

func newEPPCommand() *cobra.Command {
	var (
		c            epp.Config
		srv          = server.NewFlags(9002, 9003)
		logs         cli.LogFlags
		k            epp.KubeConfig
		poolGroup    string
		kubeconfig   string
		leaderElects bool
	)
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
			log, err := logs.Logger()
			if err != nil {
				return err
			}
			cli.TuneGC(serverGCPercent)
			c.Logger = log
			server.LimitGoMemory()
			if err := srv.Validate(); err != nil {
				return err
			}
			c.Server = srv.Options()
			if k.PoolName != "" || k.Namespace != "" {
				if poolGroup != inferenceGroup {
					return fmt.Errorf("--pool-group: %q is not served; the picker follows %s InferencePools", poolGroup, inferenceGroup)
				}
				k.Kubeconfig, k.LeaderElection = kubeconfig, leaderElects
				c.Kube = &k
			}
			s, err := epp.NewService(c)
			if err != nil {
				return err
			}
			log.Info("endpoint picker ready", "grpc", s.GRPCAddr(), "health", s.HealthAddr(), "metrics", s.MetricsAddr(),
				"endpoints", len(s.Store().Endpoints()))
			return s.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	srv.AddFlags(fs)
	fs.StringVar(&c.PoolFile, "pool-file", "", "YAML file listing the pool's endpoints (standalone mode)")
	fs.StringVar(&k.PoolName, "pool-name", "", "InferencePool to serve (Kubernetes mode)")
	fs.StringVar(&k.Namespace, "pool-namespace", "", "namespace of the InferencePool and its Pods (Kubernetes mode)")
	fs.StringVar(&poolGroup, "pool-group", inferenceGroup, "API group of the InferencePool")
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then in-cluster)")
	fs.BoolVar(&leaderElects, "ha-enable-leader-election", false, "active-passive replicas: only the holder of the <pool>-epp Lease reports ready")
	fs.StringVar(&c.ConfigFile, "config-file", "", "EndpointPickerConfig file (default: the built-in profile)")
	fs.StringVar(&c.ConfigText, "config-text", "", "EndpointPickerConfig as text")
	fs.DurationVar(&c.RefreshInterval, "refresh-metrics-interval", 0, "how often endpoint metrics are scraped (default: the config's, 50ms)")
	fs.DurationVar(&c.MetricsStaleness, "metrics-staleness-threshold", 2*time.Second, "endpoint metrics older than this count as unknown")
	fs.BoolVar(&c.ConformanceTest, "conformance-test-mode", false, "run as the conformance suites' test picker: steered by the test-epp-endpoint-selection header (random among the named endpoints, all without it), the pick echoed through X-Echo-Set-Header, the served endpoint reported in x-conformance-test-served-endpoint, and a request carrying x-infergate-test-epp-shed shed with 429. Any client can steer: never in production")
	fs.BoolVar(&c.EmitScores, "emit-endpoint-scores", false, "add each target's score to the envoy.lb metadata (x-gateway-destination-endpoint-scores)")
	logs.AddFlags(fs)
	return cmd
}

// inferenceGroup is the API group of InferencePool v1.
const inferenceGroup = "inference.networking.k8s.io"
