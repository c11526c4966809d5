package epp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/infergate/infergate/extproc/epp/config"
	"github.com/infergate/infergate/extproc/epp/datalayer"
	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/epp/flowcontrol"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/internal/filewatch"
)

// StandaloneConfig is everything the standalone endpoint picker needs: a
// pool file instead of Kubernetes, a scheduler config, and listeners.
type StandaloneConfig struct {
	// Server holds the listeners, TLS, body limit, drain and pprof; its
	// Gatherer and Logger are set here.
	Server server.Options
	// PoolFile lists the endpoints; it is re-read when it changes.
	PoolFile string
	// ConfigFile or ConfigText hold an EndpointPickerConfig; neither means
	// config.DefaultConfig.
	ConfigFile, ConfigText string
	// RefreshInterval overrides the config's scrape interval when > 0.
	RefreshInterval time.Duration
	// MetricsStaleness: endpoint metrics older than this count as unknown.
	MetricsStaleness time.Duration
	EmitScores       bool
	// PoolFilePoll is how often the pool file is checked for changes.
	PoolFilePoll time.Duration
	Logger       logr.Logger
}

// Standalone is a prepared endpoint picker: config loaded and validated,
// listeners bound. Run serves it.
type Standalone struct {
	cfg     StandaloneConfig
	store   *datastore.Store
	picker  *Picker
	srv     *server.Server
	scraper *datalayer.Scraper
	pool    *poolFileSource
	queue   *flowcontrol.Queue // nil unless flow control is on
}

// NewStandalone loads and validates every file (failing fast with the file
// and field named) and binds the listeners.
func NewStandalone(cfg StandaloneConfig) (*Standalone, error) {
	if cfg.PoolFile == "" {
		return nil, errors.New("--pool-file is required in standalone mode")
	}
	if cfg.ConfigFile != "" && cfg.ConfigText != "" {
		return nil, errors.New("--config-file and --config-text are mutually exclusive")
	}
	var loaded *config.Loaded
	var err error
	switch {
	case cfg.ConfigFile != "":
		loaded, err = config.LoadFile(cfg.ConfigFile)
	case cfg.ConfigText != "":
		loaded, err = config.Load([]byte(cfg.ConfigText))
		if err != nil {
			err = fmt.Errorf("--config-text: %w", err)
		}
	default:
		loaded, err = config.Load([]byte(config.DefaultConfig))
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
	if cfg.PoolFilePoll <= 0 {
		cfg.PoolFilePoll = time.Second
	}

	store := datastore.New()
	pool := &poolFileSource{path: cfg.PoolFile, engineLabel: loaded.DataLayer.EngineLabel, store: store, log: cfg.Logger.WithName("pool-file")}
	pf, err := pool.load()
	if err != nil {
		return nil, err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
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
	detector := flowcontrol.UtilizationDetector{
		QueueDepthThreshold:  loaded.Saturation.QueueDepthThreshold,
		KVCacheUtilThreshold: loaded.Saturation.KVCacheUtilThreshold,
		MetricsStaleness:     loaded.Saturation.MetricsStaleness,
		SheddableThreshold:   loaded.Saturation.SheddableThreshold,
	}
	var queue *flowcontrol.Queue
	if fc := loaded.FlowControl; fc.Enabled {
		queue = flowcontrol.NewQueue(flowcontrol.QueueOptions{
			Capacity:  func() (int, int64) { return detector.Capacity(time.Now(), store.Endpoints()) },
			TTL:       fc.RequestTTL,
			MaxQueued: fc.MaxRequests,
		})
	}
	picker, err := New(Options{
		Store:            store,
		Scheduler:        loaded.Scheduler,
		Priorities:       pf.Priorities(),
		Saturation:       detector,
		Queue:            queue,
		MetricsStaleness: cfg.MetricsStaleness,
		EmitScores:       cfg.EmitScores,
		Registerer:       reg,
		Logger:           cfg.Logger.WithName("picker"),
	})
	if err != nil {
		return nil, err
	}
	pool.picker = picker
	srv, err := server.Start(picker, cfg.Server, reg, cfg.Logger.WithName("server"))
	if err != nil {
		return nil, err
	}
	return &Standalone{cfg: cfg, store: store, picker: picker, srv: srv, scraper: scraper, pool: pool, queue: queue}, nil
}

// GRPCAddr, HealthAddr and MetricsAddr are the bound listener addresses.
func (s *Standalone) GRPCAddr() string    { return s.srv.GRPCAddr() }
func (s *Standalone) HealthAddr() string  { return s.srv.HealthAddr() }
func (s *Standalone) MetricsAddr() string { return s.srv.MetricsAddr() }

// Store exposes the endpoint set (tests, diagnostics).
func (s *Standalone) Store() *datastore.Store { return s.store }

// Run serves until ctx ends. Readiness turns true once the endpoint set is
// loaded, which for a pool file is at start.
func (s *Standalone) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.scraper.Run(ctx, s.store)
	go filewatch.Watch(ctx, s.pool.path, s.pool.stamp, s.cfg.PoolFilePoll, s.pool.reload)
	if s.queue != nil {
		go s.queue.Run(ctx)
	}
	s.srv.SetReady(s.store.Synced())
	return s.srv.Serve(ctx)
}

// poolFileSource feeds the store from a pool file and reloads it when the
// file changes; a broken edit is logged and the previous set kept.
type poolFileSource struct {
	path        string
	engineLabel string
	store       *datastore.Store
	picker      *Picker
	log         logr.Logger
	stamp       filewatch.Stamp
}

func (p *poolFileSource) load() (*datastore.PoolFile, error) {
	stamp, err := filewatch.StampOf(p.path)
	if err != nil {
		return nil, fmt.Errorf("pool file: %w", err)
	}
	pf, err := datastore.LoadPoolFile(p.path)
	if err != nil {
		return nil, err
	}
	specs := pf.Specs()
	for i := range specs {
		specs[i] = specs[i].EngineFromLabel(p.engineLabel)
	}
	if err := p.store.Replace(specs); err != nil {
		return nil, fmt.Errorf("pool file %s: %w", p.path, err)
	}
	p.stamp = stamp
	return pf, nil
}

func (p *poolFileSource) reload() {
	pf, err := p.load()
	if err != nil {
		p.log.Error(err, "pool file changed but cannot be used; keeping the previous endpoints")
		return
	}
	p.picker.SetPriorities(pf.Priorities())
	p.log.Info("pool file reloaded", "endpoints", len(pf.Endpoints))
}
