package epp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/rest"

	"github.com/infergate/infergate/extproc/epp/config"
	"github.com/infergate/infergate/extproc/epp/datalayer"
	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/epp/flowcontrol"
	"github.com/infergate/infergate/extproc/epp/kube"
	"github.com/infergate/infergate/extproc/epp/peers"
	"github.com/infergate/infergate/extproc/epp/poolfile"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/internal/kubeconfig"
)

// Config is everything the endpoint picker needs: where its endpoints come
// from (a pool file, or an InferencePool in Kubernetes), a scheduler
// config, and listeners.
type Config struct {
	// Server holds the listeners, TLS, body limit, drain and pprof; its
	// Gatherer and Logger are set here.
	Server server.Options
	// PoolFile lists the endpoints (standalone mode); it is re-read when
	// it changes. Exactly one of PoolFile and Kube is set.
	PoolFile string
	// Kube follows an InferencePool and its Pods (Kubernetes mode).
	Kube *KubeConfig
	// ConfigFile or ConfigText hold an EndpointPickerConfig; neither means
	// config.DefaultConfig, or config.ConformanceTestConfig in
	// ConformanceTest mode.
	ConfigFile, ConfigText string
	// ConformanceTest runs the picker as the upstream conformance suite's
	// test picker (Options.ConformanceTest).
	ConformanceTest bool
	// RefreshInterval overrides the config's scrape interval when > 0.
	RefreshInterval time.Duration
	// MetricsStaleness: endpoint metrics older than this count as unknown.
	MetricsStaleness time.Duration
	EmitScores       bool
	// PoolFilePoll is how often the pool file is checked for changes; 0
	// means a second.
	PoolFilePoll time.Duration
	// KVEventsPort, when set, is where every endpoint's engine publishes
	// its KV events (EngineEvents).
	KVEventsPort int
	// KVEventsBind, when set, is where engines that connect to the picker
	// publish their KV events.
	KVEventsBind string
	// Peers, when set, runs this replica active-active with the others.
	Peers  *PeersConfig
	Logger logr.Logger
}

// PeersConfig is how a replica meets the others (peers.Config); the secret
// is read from SecretFile at start.
type PeersConfig struct {
	Bind, Advertise, SecretFile string
	Join                        []string
}

// KubeConfig says which InferencePool to serve.
type KubeConfig struct {
	// RestConfig, when nil, is loaded from Kubeconfig, then $KUBECONFIG
	// and ~/.kube/config, then the in-cluster service account.
	RestConfig          *rest.Config
	Kubeconfig          string
	Namespace, PoolName string
	// LeaderElection makes replicas active-passive (only the leader is ready).
	LeaderElection bool
}

// Service is a prepared endpoint picker: config loaded and validated,
// listeners bound. Run serves it.
type Service struct {
	store   *datastore.Store
	picker  *Picker
	srv     *server.Server
	scraper *datalayer.Scraper
	pool    *poolfile.Source   // standalone mode
	kube    kube.Options       // Kubernetes mode
	queue   *flowcontrol.Queue // nil unless flow control is on
	peers   *peers.Node        // nil when running alone
	events  *EngineEvents      // nil without --kv-events-port
}

// NewService loads and validates every file (failing fast with the file and
// field named) and binds the listeners.
func NewService(cfg Config) (*Service, error) {
	switch {
	case cfg.PoolFile == "" && cfg.Kube == nil:
		return nil, errors.New("a pool file (standalone) or a pool to follow (Kubernetes) is required")
	case cfg.PoolFile != "" && cfg.Kube != nil:
		return nil, errors.New("a pool file and a pool to follow are mutually exclusive")
	case cfg.Kube != nil && (cfg.Kube.PoolName == "" || cfg.Kube.Namespace == ""):
		return nil, errors.New("the pool to follow needs its name and namespace")
	}
	restCfg, err := restConfig(cfg.Kube)
	if err != nil {
		return nil, err
	}
	loaded, err := loadConfig(cfg)
	if err != nil {
		return nil, err
	}

	// The sources write the pool into the store; the picker reads it.
	store := datastore.New()
	var pool *poolfile.Source
	if cfg.PoolFile != "" {
		pool, err = poolfile.Open(poolfile.Options{Path: cfg.PoolFile, EngineLabel: loaded.DataLayer.EngineLabel,
			Poll: cfg.PoolFilePoll, Store: store, Logger: cfg.Logger.WithName("pool-file")})
		if err != nil {
			return nil, err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	scraper, err := newScraper(cfg, loaded, reg)
	if err != nil {
		return nil, err
	}
	// Flow control shares the pool's headroom between the replicas that
	// are up, known once they have met.
	var replicas atomic.Pointer[peers.Node]
	picker, queue, err := newPicker(cfg, loaded, store, reg, &replicas)
	if err != nil {
		return nil, err
	}
	node, err := startPeers(cfg, picker, reg)
	if err != nil {
		return nil, err
	}
	replicas.Store(node)
	var events *EngineEvents
	if cfg.KVEventsPort != 0 || cfg.KVEventsBind != "" {
		if events, err = NewEngineEvents(context.Background(), store, picker, cfg.KVEventsPort, cfg.KVEventsBind, cfg.Logger.WithName("kv-events")); err != nil {
			return nil, err
		}
		reg.MustRegister(events)
	}
	srv, err := server.Start(picker, cfg.Server, reg, cfg.Logger.WithName("server"))
	if err != nil {
		if node != nil {
			node.Stop()
		}
		return nil, err
	}
	svc := &Service{store: store, picker: picker, srv: srv, scraper: scraper, pool: pool, queue: queue, peers: node, events: events}
	if k := cfg.Kube; k != nil {
		svc.kube = kube.Options{Config: restCfg, Namespace: k.Namespace, PoolName: k.PoolName,
			EngineLabel: loaded.DataLayer.EngineLabel, LeaderElection: k.LeaderElection, Store: store,
			SetReady: srv.SetReady, Logger: cfg.Logger.WithName("kubernetes")}
	}
	return svc, nil
}

// replicaShare is this replica's share of the pool's headroom: every
// replica sees the same saturation (each scrapes every server, and the
// KV each routes counts in the others' estimates within a flush), and
// each releases queued requests into it, so each takes an equal part,
// at least one.
func replicaShare(headroom int, node *peers.Node) int {
	if node == nil || headroom == 0 {
		return headroom
	}
	n := node.Peers() + 1
	return max(1, (headroom+n-1)/n)
}

// startPeers joins this replica to the others when cfg.Peers says so.
func startPeers(cfg Config, picker *Picker, reg prometheus.Registerer) (*peers.Node, error) {
	pc := cfg.Peers
	if pc == nil {
		return nil, nil
	}
	var secret []byte
	if pc.SecretFile != "" {
		b, err := os.ReadFile(pc.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("--peers-secret-file: %w", err)
		}
		if secret = bytes.TrimSpace(b); len(secret) != 16 && len(secret) != 24 && len(secret) != 32 {
			return nil, fmt.Errorf("--peers-secret-file %s: the key is %d bytes, want 16, 24 or 32", pc.SecretFile, len(secret))
		}
	}
	node, err := peers.Start(context.Background(), peers.Config{Bind: pc.Bind, Advertise: pc.Advertise, Join: pc.Join, SecretKey: secret},
		picker, cfg.Logger.WithName("peers"))
	if err != nil {
		return nil, fmt.Errorf("--peers-bind-address %s: %w", pc.Bind, err)
	}
	reg.MustRegister(node)
	picker.SetPeers(node)
	return node, nil
}

// restConfig is the Kubernetes client config of k (nil in standalone mode).
func restConfig(k *KubeConfig) (*rest.Config, error) {
	switch {
	case k == nil:
		return nil, nil
	case k.RestConfig != nil:
		return k.RestConfig, nil
	}
	return kubeconfig.Load(k.Kubeconfig)
}

// loadConfig loads the EndpointPickerConfig cfg names, or the default one.
func loadConfig(cfg Config) (*config.Loaded, error) {
	if cfg.ConfigFile != "" && cfg.ConfigText != "" {
		return nil, errors.New("a config file and a config text are mutually exclusive")
	}
	var loaded *config.Loaded
	var err error
	switch {
	case cfg.ConfigFile != "":
		loaded, err = config.LoadFile(cfg.ConfigFile)
	case cfg.ConfigText != "":
		loaded, err = config.Load([]byte(cfg.ConfigText))
		if err != nil {
			err = fmt.Errorf("config text: %w", err)
		}
	default:
		def := config.DefaultConfig
		if cfg.ConformanceTest {
			def = config.ConformanceTestConfig
		}
		loaded, err = config.Load([]byte(def))
	}
	if err != nil {
		return nil, err
	}
	if loaded.Deprecated != "" {
		cfg.Logger.Info("config uses a deprecated form", "detail", loaded.Deprecated)
	}
	if len(loaded.Ignored) > 0 {
		cfg.Logger.Info("config settings accepted but not acted on by this picker", "settings", loaded.Ignored)
	}
	return loaded, nil
}

// newScraper is the data layer the config describes.
func newScraper(cfg Config, loaded *config.Loaded, reg prometheus.Registerer) (*datalayer.Scraper, error) {
	interval := loaded.DataLayer.Interval
	if cfg.RefreshInterval > 0 {
		interval = cfg.RefreshInterval
	}
	scraper, err := datalayer.New(datalayer.Options{
		Scheme:             loaded.DataLayer.Scheme,
		Path:               loaded.DataLayer.Path,
		Interval:           interval,
		InsecureSkipVerify: loaded.DataLayer.InsecureSkipVerify,
		Registerer:         reg,
		Logger:             cfg.Logger.WithName("datalayer"),
	})
	if err != nil {
		return nil, fmt.Errorf("data layer: %w", err)
	}
	return scraper, nil
}

// newPicker is the picker over store that the config describes, with its
// flow-control queue when the config turns flow control on.
func newPicker(cfg Config, loaded *config.Loaded, store *datastore.Store, reg prometheus.Registerer, replicas *atomic.Pointer[peers.Node]) (*Picker, *flowcontrol.Queue, error) {
	detector := flowcontrol.UtilizationDetector{
		QueueDepthThreshold:  loaded.Saturation.QueueDepthThreshold,
		KVCacheUtilThreshold: loaded.Saturation.KVCacheUtilThreshold,
		MetricsStaleness:     loaded.Saturation.MetricsStaleness,
		SheddableThreshold:   loaded.Saturation.SheddableThreshold,
	}
	var queue *flowcontrol.Queue
	if fc := loaded.FlowControl; fc.Enabled {
		queue = flowcontrol.NewQueue(flowcontrol.QueueOptions{
			Capacity: func() (int, int64) {
				n, version := detector.Capacity(time.Now(), store.Endpoints())
				return replicaShare(n, replicas.Load()), version
			},
			TTL:       fc.RequestTTL,
			MaxQueued: fc.MaxRequests,
		})
	}
	picker, err := New(Options{
		Store:            store,
		Scheduler:        loaded.Scheduler,
		Saturation:       detector,
		Queue:            queue,
		MetricsStaleness: cfg.MetricsStaleness,
		EmitScores:       cfg.EmitScores,
		ConformanceTest:  cfg.ConformanceTest,
		Registerer:       reg,
		Logger:           cfg.Logger.WithName("picker"),
	})
	if err != nil {
		return nil, nil, err
	}
	return picker, queue, nil
}

// GRPCAddr, HealthAddr and MetricsAddr are the bound listener addresses.
func (s *Service) GRPCAddr() string    { return s.srv.GRPCAddr() }
func (s *Service) HealthAddr() string  { return s.srv.HealthAddr() }
func (s *Service) MetricsAddr() string { return s.srv.MetricsAddr() }

// Store exposes the endpoint set (tests, diagnostics).
func (s *Service) Store() *datastore.Store { return s.store }

// Run serves until ctx ends, or until the Kubernetes source fails (for
// instance when this replica loses its leadership): then the process
// should exit and be restarted.
func (s *Service) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.peers != nil {
		defer s.peers.Stop()
	}
	go s.scraper.Run(ctx, s.store)
	if s.events != nil {
		go func() { _ = s.events.Run(ctx) }()
	}
	if s.queue != nil {
		go s.queue.Run(ctx)
	}
	srcErr := make(chan error, 1)
	if s.pool != nil {
		// A pool file is loaded at start: ready at once.
		go s.pool.Run(ctx)
		s.srv.SetReady(s.store.Synced())
	} else {
		go func() {
			err := kube.Run(ctx, s.kube)
			if ctx.Err() == nil {
				err = fmt.Errorf("kubernetes source stopped: %w", err)
				cancel()
			} else {
				err = nil
			}
			srcErr <- err
		}()
	}
	err := s.srv.Serve(ctx)
	if s.pool == nil {
		if kerr := <-srcErr; kerr != nil {
			return kerr
		}
	}
	return err
}
