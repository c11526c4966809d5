// Package datastore holds the endpoint picker's view of its pool: the
// endpoints that may serve, their labels and engine, and their latest
// model-server metrics; and the objectives and model rewrites that name
// the pool. Sources write it (a static pool file, or Kubernetes); the
// picker reads it for every request, the same way either way, so every
// read is an atomic load of an immutable snapshot.
package datastore

import (
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/inference/wire"
)

// Engine names select the metric mapping for an endpoint.
const (
	EngineVLLM              = "vllm"
	EngineSGLang            = "sglang"
	EngineTRTLLMServe       = "trtllm-serve"
	EngineTritonTensorRTLLM = "triton-tensorrt-llm"
)

// EngineLabel is the default endpoint label that names its engine.
const EngineLabel = "llm-d.ai/engine-type"

// EngineFromLabel fills Engine from the endpoint's label labelKey when the
// spec does not name one.
func (s Spec) EngineFromLabel(labelKey string) Spec {
	if s.Engine == "" {
		s.Engine = s.Labels[labelKey]
	}
	return s
}

// Spec describes an endpoint as a source (pool file, Kubernetes) sees it.
type Spec struct {
	// Address is "ip:port"; it is the endpoint's identity on the wire.
	Address string
	// Name is a human name (pod name, rank); defaults to Address.
	Name   string
	Labels map[string]string
	// Engine selects the metric mapping; empty means vLLM.
	Engine string
}

// Validate checks that the address is a literal ip:port.
func (s Spec) Validate() error {
	host, port, err := net.SplitHostPort(s.Address)
	if err != nil {
		return fmt.Errorf("address %q: %w", s.Address, err)
	}
	if net.ParseIP(host) == nil {
		return fmt.Errorf("address %q: host must be an IP address", s.Address)
	}
	if port == "" || port == "0" {
		return fmt.Errorf("address %q: port is required", s.Address)
	}
	switch s.Engine {
	case "", EngineVLLM, EngineSGLang, EngineTRTLLMServe, EngineTritonTensorRTLLM:
	default:
		return fmt.Errorf("endpoint %s: unknown engine %q (want %s, %s, %s or %s)", s.Address, s.Engine,
			EngineVLLM, EngineSGLang, EngineTRTLLMServe, EngineTritonTensorRTLLM)
	}
	return nil
}

// Metrics is one scrape of an endpoint's model server.
type Metrics struct {
	WaitingQueueSize int
	RunningRequests  int
	// KVCacheUsage is a fraction in [0,1].
	KVCacheUsage float64
	// ActiveAdapters and WaitingAdapters are the LoRA adapters with running
	// and waiting requests; MaxActiveAdapters is how many may run at once
	// (0 when the server does not report LoRA).
	ActiveAdapters    map[string]struct{}
	WaitingAdapters   map[string]struct{}
	MaxActiveAdapters int
	// BlockSize and NumGPUBlocks describe the KV cache, 0 when unreported.
	BlockSize    int
	NumGPUBlocks int
	// Tokens are the server's cumulative token counters, from which the
	// picker learns the server's tokenizer and checks its prefix index.
	Tokens    TokenCounters
	UpdatedAt time.Time
}

// TokenCounters are cumulative counters a server reports in its own
// tokens. A counter the server does not report is negative.
type TokenCounters struct {
	// Prompt counts the prompt tokens of the requests it took.
	Prompt float64
	// PrefixQueries and PrefixHits count the prompt tokens looked up in
	// its prefix cache and those found there.
	PrefixQueries, PrefixHits float64
}

// NoTokenCounters reports none.
var NoTokenCounters = TokenCounters{Prompt: -1, PrefixQueries: -1, PrefixHits: -1}

// Endpoint is one ip:port of the pool. Its identity fields never change;
// metrics are swapped atomically by the data layer.
type Endpoint struct {
	Spec
	metrics   atomic.Pointer[Metrics]
	scrapeErr atomic.Pointer[string]
	// pending counts the estimated KV tokens of requests routed here since
	// the last scrape, which the scraped figures cannot show yet.
	pending atomic.Int64
	// bytesPerToken is the server's learned tokenizer ratio (float64
	// bits); 0 until learned.
	bytesPerToken atomic.Uint64
}

// BytesPerToken is how many prompt bytes make one of the server's tokens:
// learned from its counters, else wire.DefaultBytesPerToken, which is
// assumed of a server until its own counters say otherwise.
func (e *Endpoint) BytesPerToken() float64 {
	if v := math.Float64frombits(e.bytesPerToken.Load()); v > 0 {
		return v
	}
	return wire.DefaultBytesPerToken
}

// SetBytesPerToken records the learned ratio; 0 returns to the default.
func (e *Endpoint) SetBytesPerToken(v float64) { e.bytesPerToken.Store(math.Float64bits(max(v, 0))) }

// AddPending records a request routed here before the next scrape.
func (e *Endpoint) AddPending(tokens int) { e.pending.Add(int64(tokens)) }

// Pending is the estimated KV tokens routed here since the last scrape.
func (e *Endpoint) Pending() int { return int(e.pending.Load()) }

// Metrics returns the latest metrics, or nil if none were scraped yet.
func (e *Endpoint) Metrics() *Metrics { return e.metrics.Load() }

// SetMetrics publishes a new scrape and clears the scrape error; the new
// figures include what was pending.
func (e *Endpoint) SetMetrics(m *Metrics) {
	e.metrics.Store(m)
	e.pending.Store(0)
	e.scrapeErr.Store(nil)
}

// SetScrapeError records why the last scrape failed; the previous metrics
// stay until they go stale.
func (e *Endpoint) SetScrapeError(msg string) { e.scrapeErr.Store(&msg) }

// ScrapeError is the last scrape failure, "" when the last scrape worked.
func (e *Endpoint) ScrapeError() string {
	if p := e.scrapeErr.Load(); p != nil {
		return *p
	}
	return ""
}

// FreshMetrics returns the metrics if they are younger than maxAge at now,
// else nil: stale metrics count as unknown.
func (e *Endpoint) FreshMetrics(now time.Time, maxAge time.Duration) *Metrics {
	m := e.metrics.Load()
	if m == nil || (maxAge > 0 && now.Sub(m.UpdatedAt) > maxAge) {
		return nil
	}
	return m
}

// Store is the pool's state: its endpoints, objectives and model rewrites.
// It is safe for concurrent use; readers get immutable snapshots.
type Store struct {
	mu         sync.Mutex
	byAddress  map[string]*Endpoint
	snapshot   atomic.Pointer[[]*Endpoint]
	synced     atomic.Bool
	objectives atomic.Pointer[map[string]Objective]
	rewrites   atomic.Pointer[[]ModelRewrite]
}

// New returns an empty, unsynced store with no objectives and no rewrites.
func New() *Store {
	s := &Store{byAddress: map[string]*Endpoint{}}
	empty := []*Endpoint{}
	s.snapshot.Store(&empty)
	s.SetObjectives(nil)
	s.SetModelRewrites(nil)
	return s
}

// Replace sets the endpoint set and marks the store synced. Endpoints whose
// spec is unchanged keep their object, so their metrics survive.
func (s *Store) Replace(specs []Spec) error {
	next := make(map[string]*Endpoint, len(specs))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sp := range specs {
		if err := sp.Validate(); err != nil {
			return err
		}
		if _, dup := next[sp.Address]; dup {
			return fmt.Errorf("endpoint %s listed twice", sp.Address)
		}
		if sp.Name == "" {
			sp.Name = sp.Address
		}
		if sp.Engine == "" {
			sp.Engine = EngineVLLM
		}
		if cur, ok := s.byAddress[sp.Address]; ok && sameSpec(cur.Spec, sp) {
			next[sp.Address] = cur
			continue
		}
		next[sp.Address] = &Endpoint{Spec: sp}
	}
	s.byAddress = next
	list := make([]*Endpoint, 0, len(next))
	for _, e := range next {
		list = append(list, e)
	}
	slices.SortFunc(list, func(a, b *Endpoint) int { return strings.Compare(a.Address, b.Address) })
	s.snapshot.Store(&list)
	s.synced.Store(true)
	return nil
}

func sameSpec(a, b Spec) bool {
	if a.Address != b.Address || a.Name != b.Name || a.Engine != b.Engine || len(a.Labels) != len(b.Labels) {
		return false
	}
	for k, v := range a.Labels {
		if b.Labels[k] != v {
			return false
		}
	}
	return true
}

// Endpoints returns the current endpoints sorted by address. The slice is
// shared and must not be modified.
func (s *Store) Endpoints() []*Endpoint { return *s.snapshot.Load() }

// Get returns the endpoint with this address, or nil.
func (s *Store) Get(address string) *Endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byAddress[address]
}

// Synced reports whether an endpoint set was ever loaded.
func (s *Store) Synced() bool { return s.synced.Load() }
