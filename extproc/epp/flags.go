package epp

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/infergate/infergate/extproc/epp/config"
	"github.com/infergate/infergate/extproc/server"
)

// InferenceGroup is the API group of InferencePool v1, the one the picker
// follows.
const InferenceGroup = "inference.networking.k8s.io"

// Flags are the endpoint picker's command-line options: the server's
// flags and the picker's own, named as the reference endpoint picker
// names them so that deployments carry over.
type Flags struct {
	Server *server.Flags
	// Standalone mode.
	PoolFile string
	// Kubernetes mode.
	PoolName, PoolNamespace, PoolGroup string
	Kubeconfig                         string
	LeaderElection                     bool

	ConfigFile, ConfigText string
	RefreshInterval        time.Duration
	MetricsStaleness       time.Duration
	ConformanceTest        bool
	EmitScores             bool

	// KVEventsPort or KVEventsBind, when set, subscribe to the engines' KV
	// events (EngineEvents).
	KVEventsPort int
	KVEventsBind string

	// Active-active replicas (package peers).
	PeersBind, PeersAdvertise, PeersSecretFile string
	Peers                                      []string
}

// NewFlags are the defaults: ext_proc on 9002, health on 9003.
func NewFlags() *Flags {
	return &Flags{Server: server.NewFlags(9002, 9003)}
}

// AddFlags binds the options to fs.
func (o *Flags) AddFlags(fs *pflag.FlagSet) {
	o.Server.AddFlags(fs)
	fs.StringVar(&o.PoolFile, "pool-file", "", "YAML file listing the pool's endpoints (standalone mode)")
	fs.StringVar(&o.PoolName, "pool-name", "", "InferencePool to serve (Kubernetes mode)")
	fs.StringVar(&o.PoolNamespace, "pool-namespace", "", "namespace of the InferencePool and its Pods (Kubernetes mode)")
	fs.StringVar(&o.PoolGroup, "pool-group", InferenceGroup, "API group of the InferencePool")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then in-cluster)")
	fs.BoolVar(&o.LeaderElection, "ha-enable-leader-election", false, "active-passive replicas: only the holder of the <pool>-epp Lease reports ready")
	fs.StringVar(&o.ConfigFile, "config-file", "", "EndpointPickerConfig file (default: the built-in profile)")
	fs.StringVar(&o.ConfigText, "config-text", "", "EndpointPickerConfig as text")
	fs.DurationVar(&o.RefreshInterval, "refresh-metrics-interval", 0, "how often endpoint metrics are scraped (default: the config's, 50ms)")
	fs.DurationVar(&o.MetricsStaleness, "metrics-staleness-threshold", 2*time.Second, "endpoint metrics older than this count as unknown")
	fs.BoolVar(&o.ConformanceTest, "conformance-test-mode", false, "run as the conformance suites' test picker: steered by the test-epp-endpoint-selection header (random among the named endpoints, all without it), the pick echoed through X-Echo-Set-Header, the served endpoint reported in x-conformance-test-served-endpoint, and a request carrying x-infergate-test-epp-shed shed with 429. Any client can steer: never in production")
	fs.IntVar(&o.KVEventsPort, "kv-events-port", 0, "port on each model server's address where its engine publishes KV-cache events over ZeroMQ (vLLM: --kv-events-config with publisher zmq, endpoint tcp://*:PORT); the picker subscribes to every endpoint's and forgets an endpoint's cache the moment its engine clears it or restarts. 0: off")
	fs.StringVar(&o.KVEventsBind, "kv-events-bind-address", "", "host:port where engines that connect to the picker publish their KV-cache events (llm-d's way: topic kv@<pod IP>@<model>); empty: none")
	fs.StringVar(&o.PeersBind, "peers-bind-address", "", "host:port where this replica meets the picker's other replicas (memberlist, TCP and UDP), e.g. :7946; empty runs alone. Replicas tell each other every decision, so all of them learn from all the traffic")
	fs.StringSliceVar(&o.Peers, "peers", nil, "other replicas to join, host:port, comma-separated; a DNS name (a headless Service) joins every address it resolves to")
	fs.StringVar(&o.PeersAdvertise, "peers-advertise-address", "", "host:port the other replicas reach this one at (default: --peers-bind-address, or a private address of this host when that is unspecified)")
	fs.StringVar(&o.PeersSecretFile, "peers-secret-file", "", "file holding a 16, 24 or 32-byte key that encrypts the traffic between replicas (AES-GCM); every replica needs the same")
	fs.BoolVar(&o.EmitScores, "emit-endpoint-scores", false, "add each target's score to the envoy.lb metadata (x-gateway-destination-endpoint-scores)")
}

// Validate checks the options without reading files or the cluster (the
// --config-text it parses is not a file); NewService reads those and
// fails with the file and field named. Each error names the flag.
func (o *Flags) Validate() error {
	kube := o.PoolName != "" || o.PoolNamespace != ""
	switch {
	case o.PoolFile == "" && !kube:
		return errors.New("--pool-file (standalone) or --pool-name and --pool-namespace (Kubernetes) is required")
	case o.PoolFile != "" && kube:
		return errors.New("--pool-file and --pool-name are mutually exclusive")
	case kube && (o.PoolName == "" || o.PoolNamespace == ""):
		return errors.New("--pool-name and --pool-namespace are both required in Kubernetes mode")
	case kube && o.PoolGroup != InferenceGroup:
		return fmt.Errorf("--pool-group: %q is not served; the picker follows %s InferencePools", o.PoolGroup, InferenceGroup)
	case !kube && (o.Kubeconfig != "" || o.LeaderElection):
		return errors.New("--kubeconfig and --ha-enable-leader-election are for Kubernetes mode (--pool-name)")
	case o.ConfigFile != "" && o.ConfigText != "":
		return errors.New("--config-file and --config-text are mutually exclusive")
	case o.RefreshInterval < 0:
		return fmt.Errorf("--refresh-metrics-interval: %s is negative", o.RefreshInterval)
	case o.MetricsStaleness < 0:
		return fmt.Errorf("--metrics-staleness-threshold: %s is negative", o.MetricsStaleness)
	case o.KVEventsPort < 0 || o.KVEventsPort > 65535:
		return fmt.Errorf("--kv-events-port: %d is not a port", o.KVEventsPort)
	case o.PeersBind == "" && (len(o.Peers) > 0 || o.PeersAdvertise != "" || o.PeersSecretFile != ""):
		return errors.New("--peers, --peers-advertise-address and --peers-secret-file need --peers-bind-address")
	}
	for flag, v := range map[string]string{"--peers-bind-address": o.PeersBind, "--peers-advertise-address": o.PeersAdvertise, "--kv-events-bind-address": o.KVEventsBind} {
		if v == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(v); err != nil {
			return fmt.Errorf("%s: %w", flag, err)
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return fmt.Errorf("%s: %q is not a port", flag, port)
		}
	}
	if o.ConfigText != "" {
		if _, err := config.Load([]byte(o.ConfigText)); err != nil {
			return fmt.Errorf("--config-text: %w", err)
		}
	}
	return o.Server.Validate()
}

// Config is the service's configuration from the options (its logger left
// to the caller).
func (o *Flags) Config() Config {
	c := Config{
		Server:           o.Server.Options(),
		PoolFile:         o.PoolFile,
		ConfigFile:       o.ConfigFile,
		ConfigText:       o.ConfigText,
		ConformanceTest:  o.ConformanceTest,
		RefreshInterval:  o.RefreshInterval,
		MetricsStaleness: o.MetricsStaleness,
		EmitScores:       o.EmitScores,
		KVEventsPort:     o.KVEventsPort,
		KVEventsBind:     o.KVEventsBind,
	}
	if o.PeersBind != "" {
		c.Peers = &PeersConfig{Bind: o.PeersBind, Advertise: o.PeersAdvertise, Join: o.Peers, SecretFile: o.PeersSecretFile}
	}
	if o.PoolName != "" || o.PoolNamespace != "" {
		c.Kube = &KubeConfig{Kubeconfig: o.Kubeconfig, Namespace: o.PoolNamespace, PoolName: o.PoolName, LeaderElection: o.LeaderElection}
	}
	return c
}
