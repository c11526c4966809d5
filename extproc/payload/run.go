package payload

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/policy"
	"github.com/infergate/infergate/internal/filewatch"
)

// Config is everything the payload processor needs to start.
type Config struct {
	// Server holds the listeners, TLS, body limit, drain and pprof; its
	// Gatherer and Logger are set here.
	Server server.Options
	// ConfigFile is the YAML policy; empty means the zero policy (model
	// headers only). It is re-read when it changes.
	ConfigFile string
	// ConfigPoll is how often ConfigFile is checked for changes.
	ConfigPoll time.Duration
	Logger     logr.Logger
}

// Service is a prepared payload processor: policy loaded and validated,
// listeners bound. Run serves it.
type Service struct {
	cfg   Config
	proc  *Processor
	srv   *server.Server
	m     *metrics
	stamp filewatch.Stamp
}

// LoadFile reads and compiles a policy file; errors name the file and field.
func LoadFile(path string) (*policy.Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("payload config: %w", err)
	}
	p, err := Load(data)
	if err != nil {
		return nil, fmt.Errorf("payload config %s: %w", path, err)
	}
	return p, nil
}

// Load compiles a YAML (or JSON) policy.
func Load(data []byte) (*policy.Policy, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("YAML: %w", err)
	}
	if string(js) == "null" {
		js = nil // an empty file
	}
	cfg, err := policy.DecodeJSON(js)
	if err != nil {
		return nil, err
	}
	return policy.Compile(cfg)
}

// New loads the policy (failing fast with the file and field named) and
// binds the listeners.
func New(cfg Config) (*Service, error) {
	pol, err := policy.Compile(&policy.Config{})
	if err != nil {
		return nil, err
	}
	var stamp filewatch.Stamp
	if cfg.ConfigFile != "" {
		if stamp, err = filewatch.StampOf(cfg.ConfigFile); err != nil {
			return nil, fmt.Errorf("payload config: %w", err)
		}
		if pol, err = LoadFile(cfg.ConfigFile); err != nil {
			return nil, err
		}
	}
	if cfg.ConfigPoll <= 0 {
		cfg.ConfigPoll = time.Second
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newMetrics(reg)
	proc := NewProcessor(pol, m, cfg.Logger.WithName("processor"))
	srv, err := server.Start(proc, cfg.Server, reg, cfg.Logger.WithName("server"))
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, proc: proc, srv: srv, m: m, stamp: stamp}, nil
}

// GRPCAddr, HealthAddr and MetricsAddr are the bound listener addresses.
func (s *Service) GRPCAddr() string    { return s.srv.GRPCAddr() }
func (s *Service) HealthAddr() string  { return s.srv.HealthAddr() }
func (s *Service) MetricsAddr() string { return s.srv.MetricsAddr() }

// Run serves until ctx ends, reloading the policy when its file changes.
func (s *Service) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.cfg.ConfigFile != "" {
		go filewatch.Watch(ctx, s.cfg.ConfigFile, s.stamp, s.cfg.ConfigPoll, s.reload)
	}
	s.srv.SetReady(true)
	return s.srv.Serve(ctx)
}

func (s *Service) reload() {
	log := s.cfg.Logger.WithName("config")
	p, err := LoadFile(s.cfg.ConfigFile)
	if err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		log.Error(err, "configuration changed but cannot be used; keeping the previous one")
		return
	}
	s.proc.SetPolicy(p)
	s.m.reloads.WithLabelValues("ok").Inc()
	log.Info("configuration reloaded")
}
