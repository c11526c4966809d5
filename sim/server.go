// Package sim is a model-server simulator that stands in for a vLLM pod in
// tests, benchmarks and demos. It serves the OpenAI completion and chat APIs
// over real HTTP with real queueing (MaxNumSeqs running, the rest waiting),
// a vLLM-like prefix cache that shortens time to first token, and vLLM-named
// Prometheus metrics that an endpoint picker can scrape.
package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// shutdownGrace bounds how long Serve waits for in-flight requests.
const shutdownGrace = 2 * time.Second

// Server is one simulated model server. Its methods are safe for concurrent
// use.
type Server struct {
	cfg     Config
	tok     tokenizer
	models  map[string]bool
	sched   *scheduler
	cache   *prefixCache
	metrics *metrics
	handler http.Handler

	served           atomic.Uint64
	queriedTokens    atomic.Uint64
	hitTokens        atomic.Uint64
	promptTokens     atomic.Uint64
	generationTokens atomic.Uint64
	nextID           atomic.Uint64

	fakeMu      sync.Mutex
	fake        *FakeMetrics
	fakeChanged time.Time
}

// New returns a Server for cfg, with defaults applied to zero fields.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sim: invalid config: %w", err)
	}
	cfg = cfg.WithDefaults()
	cache := newPrefixCache(cfg.KVCacheTokens / cfg.BlockSize)
	s := &Server{
		cfg:    cfg,
		tok:    newTokenizer(cfg),
		models: map[string]bool{cfg.Model: true},
		sched:  newScheduler(cfg, cache),
		cache:  cache,
	}
	for _, a := range cfg.LoRAAdapters {
		s.models[a] = true
	}
	s.metrics = newMetrics(s)
	s.handler = s.routes()
	return s, nil
}

// Config returns the configuration in effect, defaults included.
func (s *Server) Config() Config {
	c := s.cfg
	c.LoRAAdapters = slices.Clone(c.LoRAAdapters)
	return c
}

// Handler returns the HTTP API. The x-inference-port header is taken from
// the local address of each connection, so it is right under any server.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves the API on ln until ctx ends, then shuts down gracefully,
// cutting requests still running after a short grace period, and returns
// nil. It closes ln. HTTP/1.1 and HTTP/2 without TLS (h2c, prior
// knowledge) are both served, as a model server behind a pool whose
// appProtocol is kubernetes.io/h2c must.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second, Protocols: &protocols}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("sim %s: serve: %w", s.cfg.Name, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("sim %s: serve: %w", s.cfg.Name, err)
	}
	return nil
}

// Stats are the server's real counters and state; fake metrics do not
// affect them.
type Stats struct {
	// RequestsServed counts generation requests that completed.
	RequestsServed uint64
	// PrefixQueriedTokens and PrefixHitTokens count prompt tokens looked up
	// in and found in the prefix cache.
	PrefixQueriedTokens uint64
	PrefixHitTokens     uint64
	// PromptTokens counts the prompt tokens of requests whose prefill is
	// done, GenerationTokens the tokens generated; see metrics.
	PromptTokens     uint64
	GenerationTokens uint64
	Waiting          int
	Running          int
	// KVCacheUsage is the fraction of KV cache blocks held by running
	// requests.
	KVCacheUsage float64
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	st := s.sched.state()
	return Stats{
		RequestsServed:      s.served.Load(),
		PrefixQueriedTokens: s.queriedTokens.Load(),
		PrefixHitTokens:     s.hitTokens.Load(),
		PromptTokens:        s.promptTokens.Load(),
		GenerationTokens:    s.generationTokens.Load(),
		Waiting:             st.waiting,
		Running:             st.running,
		KVCacheUsage:        s.cache.usage(),
	}
}

// FakeMetrics overrides what /metrics reports, so routing tests can set up
// pod states without generating load. Nil fields are reported as measured;
// for the adapter lists, nil means not overridden and an empty non-nil list
// means none.
type FakeMetrics struct {
	Waiting      *int     `json:"waiting,omitempty"`
	Running      *int     `json:"running,omitempty"`
	KVCacheUsage *float64 `json:"kvCacheUsage,omitempty"`
	RunningLoRAs []string `json:"runningLoRAs,omitempty"`
	WaitingLoRAs []string `json:"waitingLoRAs,omitempty"`
}

func (f *FakeMetrics) validate() error {
	var errs []error
	if f.Waiting != nil && *f.Waiting < 0 {
		errs = append(errs, fmt.Errorf("waiting must not be negative, got %d", *f.Waiting))
	}
	if f.Running != nil && *f.Running < 0 {
		errs = append(errs, fmt.Errorf("running must not be negative, got %d", *f.Running))
	}
	if f.KVCacheUsage != nil && !(*f.KVCacheUsage >= 0 && *f.KVCacheUsage <= 1) {
		errs = append(errs, fmt.Errorf("kvCacheUsage must be within [0, 1], got %g", *f.KVCacheUsage))
	}
	return errors.Join(errs...)
}

// SetFakeMetrics makes /metrics report the set fields of f instead of the
// measured values; nil goes back to measured values. Requests still queue
// and run as usual.
func (s *Server) SetFakeMetrics(f *FakeMetrics) {
	var c *FakeMetrics
	if f != nil {
		c = &FakeMetrics{
			Waiting:      clonePtr(f.Waiting),
			Running:      clonePtr(f.Running),
			KVCacheUsage: clonePtr(f.KVCacheUsage),
			RunningLoRAs: slices.Clone(f.RunningLoRAs),
			WaitingLoRAs: slices.Clone(f.WaitingLoRAs),
		}
	}
	s.fakeMu.Lock()
	defer s.fakeMu.Unlock()
	s.fake = c
	s.fakeChanged = time.Now()
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// reportedValues are the gauge values /metrics shows.
type reportedValues struct {
	waiting, running           int
	kvUsage                    float64
	runningLoRAs, waitingLoRAs []string
	loraChanged                time.Time
}

func (s *Server) reported() reportedValues {
	st := s.sched.state()
	v := reportedValues{
		waiting:      st.waiting,
		running:      st.running,
		kvUsage:      s.cache.usage(),
		runningLoRAs: st.runningLoRAs,
		waitingLoRAs: st.waitingLoRA,
		loraChanged:  st.changed,
	}
	s.fakeMu.Lock()
	defer s.fakeMu.Unlock()
	f := s.fake
	if f == nil {
		return v
	}
	if f.Waiting != nil {
		v.waiting = *f.Waiting
	}
	if f.Running != nil {
		v.running = *f.Running
	}
	if f.KVCacheUsage != nil {
		v.kvUsage = *f.KVCacheUsage
	}
	if f.RunningLoRAs != nil || f.WaitingLoRAs != nil {
		v.loraChanged = s.fakeChanged
	}
	if f.RunningLoRAs != nil {
		v.runningLoRAs = f.RunningLoRAs
	}
	if f.WaitingLoRAs != nil {
		v.waitingLoRAs = f.WaitingLoRAs
	}
	return v
}

func (s *Server) routes() http.Handler {
	if s.cfg.Echo != nil {
		return s.echoRoutes()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.handleGenerate(false))
	mux.HandleFunc("POST /v1/chat/completions", s.handleGenerate(true))
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /admin/fake-metrics", s.handleSetFake)
	mux.HandleFunc("DELETE /admin/fake-metrics", func(w http.ResponseWriter, _ *http.Request) {
		s.SetFakeMetrics(nil)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return s.withIdentity(withReturnError(mux))
}

// withIdentity tells clients and proxies which pod answered.
func (s *Server) withIdentity(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-inference-pod", s.cfg.Name)
		if addr, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if _, port, err := net.SplitHostPort(addr.String()); err == nil {
				w.Header().Set("x-inference-port", port)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// withReturnError lets tests make the server fail on demand.
func withReturnError(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get("X-Return-Error")
		if v == "" {
			next.ServeHTTP(w, r)
			return
		}
		code, err := strconv.Atoi(v)
		if err != nil || code < 400 || code > 599 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("X-Return-Error must be a status code from 400 to 599, got %q", v))
			return
		}
		writeError(w, code, fmt.Sprintf("error requested by X-Return-Error: %d", code))
	})
}

func (s *Server) handleSetFake(w http.ResponseWriter, r *http.Request) {
	var f FakeMetrics
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields() // a typo would otherwise silently fake nothing
	if err := dec.Decode(&f); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid fake metrics JSON: %v", err))
		return
	}
	if err := f.validate(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.SetFakeMetrics(&f)
	w.WriteHeader(http.StatusNoContent)
}
