// Package datalayer scrapes the model servers' Prometheus metrics and
// publishes them into the datastore, reading each endpoint's metric names
// from the mapping of its engine (vLLM, SGLang, trtllm-serve, Triton
// TensorRT-LLM).
package datalayer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// Defaults of Options.
const (
	// DefaultInterval is also the smallest interval accepted
	// (--refresh-metrics-interval in epp-protocol.md §4.3).
	DefaultInterval = 50 * time.Millisecond
	// MaxTimeout caps the default timeout: with the 2s staleness threshold
	// readers apply, a slower answer leaves no time to retry.
	MaxTimeout      = time.Second
	DefaultLogEvery = 30 * time.Second
)

// maxBodyBytes bounds a /metrics response; vLLM pages are ~100 KiB.
const maxBodyBytes = 16 << 20

// Options configure a Scraper. Zero values take the defaults.
type Options struct {
	// Scheme is "http" (default) or "https".
	Scheme string
	// Path is the metrics path, "/metrics" by default.
	Path string
	// Interval between two scrapes of one endpoint; DefaultInterval by
	// default and at least DefaultInterval.
	Interval time.Duration
	// Timeout of one scrape; by default ten intervals, at most MaxTimeout.
	Timeout time.Duration
	// InsecureSkipVerify skips TLS verification, for servers with
	// self-signed certificates.
	InsecureSkipVerify bool
	// Registerer receives the scrape series; nil registers nothing.
	Registerer prometheus.Registerer
	Logger     logr.Logger
	// LogEvery rate-limits the failure logs of one endpoint;
	// DefaultLogEvery by default.
	LogEvery time.Duration

	// minInterval replaces the DefaultInterval floor, so that tests can run
	// faster loops.
	minInterval time.Duration
}

// Scraper keeps the metrics of the datastore's endpoints up to date.
type Scraper struct {
	opts     Options
	client   *http.Client
	failures *prometheus.CounterVec
	duration prometheus.Histogram
	maxBody  int64 // maxBodyBytes; a field so that tests can lower it

	mu   sync.Mutex
	logs map[*datastore.Endpoint]*logState
}

// New validates opts, applies defaults and registers the scrape series.
func New(opts Options) (*Scraper, error) {
	if opts.Scheme == "" {
		opts.Scheme = "http"
	}
	if opts.Scheme != "http" && opts.Scheme != "https" {
		return nil, fmt.Errorf("datalayer: scheme must be http or https, got %q", opts.Scheme)
	}
	if opts.Path == "" {
		opts.Path = "/metrics"
	}
	if !strings.HasPrefix(opts.Path, "/") {
		return nil, fmt.Errorf("datalayer: path must start with /, got %q", opts.Path)
	}
	floor := DefaultInterval
	if opts.minInterval > 0 {
		floor = opts.minInterval
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Interval < floor {
		return nil, fmt.Errorf("datalayer: interval must be at least %s, got %s", floor, opts.Interval)
	}
	if opts.Timeout == 0 {
		opts.Timeout = min(10*opts.Interval, MaxTimeout)
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("datalayer: timeout must be positive, got %s", opts.Timeout)
	}
	if opts.LogEvery <= 0 {
		opts.LogEvery = DefaultLogEvery
	}

	s := &Scraper{
		opts:   opts,
		client: newClient(opts),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_epp_scrape_failures_total",
			Help: "Failed model-server metrics scrapes by reason: connect, timeout, status, parse, missing_series.",
		}, []string{"reason"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "infergate_epp_scrape_duration_seconds",
			Help:    "Duration of successful model-server metrics scrapes.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12), // 0.5ms … 1s
		}),
		maxBody: maxBodyBytes,
		logs:    map[*datastore.Endpoint]*logState{},
	}
	var err error
	if s.failures, err = register(opts.Registerer, s.failures); err != nil {
		return nil, err
	}
	if s.duration, err = register(opts.Registerer, s.duration); err != nil {
		return nil, err
	}
	// Every reason shows as 0 from the start, so rate() works on the first failure.
	for _, r := range []string{ReasonConnect, ReasonTimeout, ReasonStatus, ReasonParse, ReasonMissingSeries} {
		s.failures.WithLabelValues(r)
	}
	return s, nil
}

// register registers c, or returns the collector already registered in its
// place so that two scrapers may share a registry.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		return c, nil
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, fmt.Errorf("datalayer: register metrics: %w", err)
	}
	return c, nil
}

// newClient returns the one client of all loops. Its transport keeps one
// idle connection per endpoint whatever the pool size, and ignores proxy
// environment variables: endpoints are pod addresses, reached directly.
func newClient(opts Options) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.MaxIdleConns = 0 // no global cap; MaxIdleConnsPerHost bounds it
	tr.MaxIdleConnsPerHost = 2
	if opts.InsecureSkipVerify {
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // opt-in for self-signed servers
	}
	return &http.Client{
		Transport: tr,
		// A redirect from a metrics endpoint is a misconfiguration; report
		// its status rather than follow it elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Run scrapes every endpoint of store every Interval until ctx ends, with one
// loop per endpoint so that a slow endpoint delays no other. It follows the
// store's endpoint set, checked every Interval, and returns once all loops
// have stopped. Call it once per Scraper.
func (s *Scraper) Run(ctx context.Context, store *datastore.Store) {
	loops := map[*datastore.Endpoint]context.CancelFunc{}
	var wg sync.WaitGroup
	defer func() {
		for _, stop := range loops {
			stop()
		}
		wg.Wait()
		s.client.CloseIdleConnections()
	}()

	tick := time.NewTicker(s.opts.Interval)
	defer tick.Stop()
	for {
		// Endpoints are keyed by object, not address: the store replaces the
		// object when a spec changes (e.g. its engine), and the new one
		// needs a fresh loop.
		current := store.Endpoints()
		seen := make(map[*datastore.Endpoint]bool, len(current))
		for _, e := range current {
			seen[e] = true
			if _, ok := loops[e]; !ok {
				loopCtx, stop := context.WithCancel(ctx)
				loops[e] = stop
				wg.Go(func() { s.loop(loopCtx, e) })
			}
		}
		for e, stop := range loops {
			if !seen[e] {
				stop()
				delete(loops, e)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// loop scrapes e at once, then every Interval until ctx ends. A scrape
// slower than Interval delays only the next scrape of e.
func (s *Scraper) loop(ctx context.Context, e *datastore.Endpoint) {
	defer s.forget(e)
	tick := time.NewTicker(s.opts.Interval)
	defer tick.Stop()
	for {
		_ = s.ScrapeOnce(ctx, e) // published into e and logged
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
