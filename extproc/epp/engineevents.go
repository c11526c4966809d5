package epp

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/epp/kvevents"
	"github.com/infergate/infergate/extproc/epp/scheduling"
)

// EngineEvents applies what the model servers publish of their KV caches
// (vLLM's KV events, over ZeroMQ) where the picker can without their
// tokenizer: the engines hash blocks of their own tokens, which the picker
// does not have, so a stored or removed block cannot be matched to a
// prompt's blocks; counted, they show how much each engine holds. A cache
// cleared, or an engine restarted (it starts empty and says nothing of
// it), is known exactly: the picker forgets all it believed that endpoint
// held at once, instead of sending prefixes there until its memory ages.
type EngineEvents struct {
	sub      *kvevents.Subscriber
	store    *datastore.Store
	port     int
	clearers []scheduling.CacheClearer
	targets  chan []string

	mu     sync.Mutex
	blocks map[string]int64 // endpoint → blocks its engine reports holding
	clears map[string]uint64
}

// NewEngineEvents subscribes to the KV events of the pool's engines: with
// port set, those every endpoint's engine publishes on port of its address
// (vLLM's publisher binds, tcp://*:5557 by default), following the pool as
// it changes; with bind set (host:port), those of engines that connect to
// the picker (llm-d's way: topic kv@<pod IP>@<model>).
func NewEngineEvents(ctx context.Context, store *datastore.Store, picker *Picker, port int, bind string, log logr.Logger) (*EngineEvents, error) {
	e := &EngineEvents{store: store, port: port, blocks: map[string]int64{}, clears: map[string]uint64{}}
	cfg := kvevents.Config{Handler: e.handle, Logger: log}
	if port != 0 {
		e.targets = make(chan []string, 1)
		cfg.Targets = e.targets
	}
	if bind != "" {
		l, err := kvevents.Listen(ctx, "tcp://"+bind)
		if err != nil {
			return nil, fmt.Errorf("--kv-events-bind-address %s: %w", bind, err)
		}
		cfg.Listener = l
	}
	for _, pl := range picker.opts.Scheduler.Plugins() {
		if c, ok := pl.(scheduling.CacheClearer); ok {
			e.clearers = append(e.clearers, c)
		}
	}
	sub, err := kvevents.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("kv events: %w", err)
	}
	e.sub = sub
	return e, nil
}

// Run follows the pool's endpoints and applies their events until ctx
// ends.
func (e *EngineEvents) Run(ctx context.Context) error {
	if e.targets != nil {
		go e.follow(ctx)
	}
	return e.sub.Run(ctx)
}

// follow gives the subscriber the pool's publishers each second.
func (e *EngineEvents) follow(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last []string
	for {
		if set := e.publishers(); !slices.Equal(set, last) {
			select {
			case <-e.targets: // a set not yet taken is replaced
			default:
			}
			e.targets <- set
			last = set
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// publishers are the endpoints' engines, one per address: data-parallel
// ranks on one address share a publisher, their batches told apart by
// rank.
func (e *EngineEvents) publishers() []string {
	var out []string
	for _, ep := range e.store.Endpoints() {
		host, _, err := net.SplitHostPort(ep.Address)
		if err != nil {
			continue
		}
		t := "tcp://" + net.JoinHostPort(host, strconv.Itoa(e.port))
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// endpointOf is the endpoint a batch is about: the one on its publisher's
// address, or with data-parallel ranks there, the rank-th by port (rank i
// serves on the first rank's port + i).
func (e *EngineEvents) endpointOf(b kvevents.Batch) string {
	host := b.Source
	if h, _, err := net.SplitHostPort(trimScheme(b.Source)); err == nil {
		host = h
	}
	var on []string
	for _, ep := range e.store.Endpoints() {
		if h, _, err := net.SplitHostPort(ep.Address); err == nil && h == host {
			on = append(on, ep.Address)
		}
	}
	slices.SortFunc(on, func(a, b string) int { return portOf(a) - portOf(b) })
	switch {
	case len(on) == 1:
		return on[0]
	case b.DPRank >= 0 && b.DPRank < len(on):
		return on[b.DPRank]
	}
	return ""
}

func trimScheme(s string) string {
	if len(s) > 6 && s[:6] == "tcp://" {
		return s[6:]
	}
	return s
}

func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

func (e *EngineEvents) handle(b kvevents.Batch) {
	addr := e.endpointOf(b)
	if addr == "" {
		return
	}
	cleared := b.Restarted
	var delta int64
	for _, ev := range b.Events {
		switch ev.Kind {
		case kvevents.BlockStored:
			delta += int64(len(ev.Hashes))
		case kvevents.BlockRemoved:
			delta -= int64(len(ev.Hashes))
		case kvevents.AllBlocksCleared:
			cleared, delta = true, 0
		}
	}
	if cleared {
		for _, c := range e.clearers {
			c.EngineCleared(addr)
		}
	}
	e.mu.Lock()
	if cleared {
		e.blocks[addr] = 0
		e.clears[addr]++
	}
	e.blocks[addr] = max(e.blocks[addr]+delta, 0)
	e.mu.Unlock()
}

var (
	engineBlocksDesc = prometheus.NewDesc("infergate_epp_engine_kv_blocks",
		"KV blocks the endpoint's engine reports holding, from its KV events (stored less removed, since it last cleared).",
		[]string{"endpoint"}, nil)
	engineClearsDesc = prometheus.NewDesc("infergate_epp_engine_kv_clears_total",
		"Times the endpoint's engine cleared its KV cache or restarted, by its KV events; each time the picker forgot what it believed the endpoint held.",
		[]string{"endpoint"}, nil)
)

// Describe implements prometheus.Collector, with the subscriber's series.
func (e *EngineEvents) Describe(ch chan<- *prometheus.Desc) {
	ch <- engineBlocksDesc
	ch <- engineClearsDesc
	e.sub.Describe(ch)
}

// Collect implements prometheus.Collector.
func (e *EngineEvents) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	for addr, n := range e.blocks {
		ch <- prometheus.MustNewConstMetric(engineBlocksDesc, prometheus.GaugeValue, float64(n), addr)
	}
	for addr, n := range e.clears {
		ch <- prometheus.MustNewConstMetric(engineClearsDesc, prometheus.CounterValue, float64(n), addr)
	}
	e.mu.Unlock()
	e.sub.Collect(ch)
}
