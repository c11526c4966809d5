package payload

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/policy"
	"github.com/infergate/infergate/internal/filewatch"
	"github.com/infergate/infergate/internal/kubeconfig"
)

// Config is everything the payload processor needs to start.
type Config struct {
	// Server holds the listeners, TLS, body limit, drain and pprof; its
	// Gatherer and Logger are set here.
	Server server.Options
	// ConfigFile is the YAML policy; "" means no file and the zero policy
	// (model headers only). It is re-read when it changes.
	ConfigFile string
	// ConfigPoll is how often ConfigFile is checked for changes.
	ConfigPoll time.Duration
	// ConfigMapNamespace, when set, adds the adapter → base entries of the
	// ConfigMaps labelled inference.llm-d.ai/ipp-managed=true in that
	// namespace ("*": all) to the file's, live.
	ConfigMapNamespace string
	// RestConfig, when nil, is loaded from Kubeconfig, $KUBECONFIG,
	// ~/.kube/config or the in-cluster service account.
	RestConfig *rest.Config
	Kubeconfig string
	Logger     logr.Logger
	// KeepStreamOptions forwards streamed chat and completions requests as
	// the client sent them. By default the processor asks the server for
	// the usage of every streamed request (stream_options.include_usage),
	// so token metering charges it, and removes the extra usage chunk from
	// the stream of a client that did not ask for it.
	KeepStreamOptions bool
}

// Service is a prepared payload processor: policy loaded and validated,
// listeners bound. Run serves it.
type Service struct {
	cfg   Config
	proc  *Processor
	srv   *server.Server
	m     *metrics
	stamp filewatch.Stamp
	rest  *rest.Config // nil unless ConfigMaps are watched

	// The policy is compiled from the file's configuration plus the
	// ConfigMaps' adapters; either changing recompiles it.
	mu          sync.Mutex
	file        *policy.Config
	fromCluster []policy.BaseModel
}

// policyFile is a policy file as read: its configuration and the policy
// it compiles to on its own.
type policyFile struct {
	cfg    *policy.Config
	policy *policy.Policy
}

// loadFile reads a YAML (or JSON) policy file and checks it compiles;
// errors name the file and field. A file that holds no value (empty, only
// comments, "---", null, ~) is policy.ErrNoConfig at start-up and on
// reload alike: it would drop every guardrail, and is most likely a write
// caught half-way or a template that rendered nothing ({} clears the
// policy on purpose).
func loadFile(path string) (policyFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return policyFile{}, fmt.Errorf("payload config: %w", err)
	}
	f, err := parseFile(data)
	if err != nil {
		return policyFile{}, fmt.Errorf("payload config %s: %w", path, err)
	}
	return f, nil
}

// parseFile decodes and compiles the contents of a policy file.
func parseFile(data []byte) (policyFile, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return policyFile{}, fmt.Errorf("YAML: %w", err)
	}
	if len(bytes.TrimSpace(js)) == 0 {
		// A YAML document without a value converts to null; should it
		// ever come out as nothing, it is still no configuration, not
		// the absent configuration DecodeJSON takes as the zero one.
		js = []byte("null")
	}
	var f policyFile
	if f.cfg, err = policy.DecodeJSON(js); err != nil {
		return policyFile{}, err
	}
	if f.policy, err = policy.Compile(f.cfg); err != nil {
		return policyFile{}, err
	}
	return f, nil
}

// New loads the policy (failing fast with the file and field named) and
// binds the listeners.
func New(cfg Config) (*Service, error) {
	file := &policy.Config{}
	pol, err := policy.Compile(file)
	if err != nil {
		return nil, err
	}
	var stamp filewatch.Stamp
	if cfg.ConfigFile != "" {
		if stamp, err = filewatch.StampOf(cfg.ConfigFile); err != nil {
			return nil, fmt.Errorf("payload config: %w", err)
		}
		f, err := loadFile(cfg.ConfigFile)
		if err != nil {
			return nil, err
		}
		file, pol = f.cfg, f.policy
	}
	var restCfg *rest.Config
	if cfg.ConfigMapNamespace != "" {
		if restCfg = cfg.RestConfig; restCfg == nil {
			if restCfg, err = kubeconfig.Load(cfg.Kubeconfig); err != nil {
				return nil, err
			}
		}
	}
	if cfg.ConfigPoll <= 0 {
		cfg.ConfigPoll = time.Second
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newMetrics(reg)
	proc := NewProcessor(pol, m, cfg.Logger.WithName("processor"))
	proc.streamUsage = !cfg.KeepStreamOptions
	proc.SetModelLabels(file) // metric labels: configured names only
	srv, err := server.Start(proc, cfg.Server, reg, cfg.Logger.WithName("server"))
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, proc: proc, srv: srv, m: m, stamp: stamp, rest: restCfg, file: file}, nil
}

// GRPCAddr, HealthAddr and MetricsAddr are the bound listener addresses.
func (s *Service) GRPCAddr() string    { return s.srv.GRPCAddr() }
func (s *Service) HealthAddr() string  { return s.srv.HealthAddr() }
func (s *Service) MetricsAddr() string { return s.srv.MetricsAddr() }

// Run serves until ctx ends, reloading the policy when its file or the
// adapter ConfigMaps change. With ConfigMaps it turns ready only once they
// have been read, so an adapter is never routed as an unknown model.
func (s *Service) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.cfg.ConfigFile != "" {
		go filewatch.Watch(ctx, s.cfg.ConfigFile, s.stamp, s.cfg.ConfigPoll, s.reloadFile)
	}
	if s.rest == nil {
		s.srv.SetReady(true)
		return s.srv.Serve(ctx)
	}
	s.srv.SetReady(false)
	cmErr := make(chan error, 1)
	go func() {
		var once sync.Once
		err := runConfigMaps(ctx, configMapOptions{Config: s.rest, Namespace: s.cfg.ConfigMapNamespace, Logger: s.cfg.Logger.WithName("configmaps"),
			OnChange: func(bases []policy.BaseModel) {
				s.setFromCluster(bases)
				once.Do(func() { s.srv.SetReady(true) })
			}})
		if ctx.Err() == nil {
			cancel()
			cmErr <- fmt.Errorf("adapter ConfigMaps: %w", err)
			return
		}
		cmErr <- nil
	}()
	err := s.srv.Serve(ctx)
	if cerr := <-cmErr; cerr != nil {
		return cerr
	}
	return err
}

func (s *Service) reloadFile() {
	// The file alone must compile before it replaces the last good one,
	// so a broken edit does not block ConfigMap updates meanwhile.
	f, err := loadFile(s.cfg.ConfigFile)
	if err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		s.cfg.Logger.WithName("config").Error(err, "configuration changed but cannot be used; keeping the previous one")
		return
	}
	s.mu.Lock()
	s.file = f.cfg
	s.mu.Unlock()
	s.recompile("file")
}

func (s *Service) setFromCluster(bases []policy.BaseModel) {
	s.mu.Lock()
	s.fromCluster = bases
	s.mu.Unlock()
	s.recompile("configmaps")
}

// recompile builds the policy from the file and the ConfigMaps; if the
// two conflict (an adapter under two bases) the previous policy stays.
func (s *Service) recompile(cause string) {
	s.mu.Lock()
	merged := *s.file
	merged.Models.Bases = mergeBases(s.file.Models.Bases, s.fromCluster)
	s.mu.Unlock()
	log := s.cfg.Logger.WithName("config")
	p, err := policy.Compile(&merged)
	if err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		log.Error(err, "configuration changed but cannot be used; keeping the previous one", "cause", cause)
		return
	}
	s.proc.SetModelLabels(&merged)
	s.proc.SetPolicy(p)
	s.m.reloads.WithLabelValues("ok").Inc()
	log.Info("configuration reloaded", "cause", cause, "bases", len(merged.Models.Bases))
}
