package scheduling

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/extproc/epp/calibrate"
	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/epp/prefix"
	"github.com/infergate/infergate/inference/wire"
)

// Plugin types of the prefix-aware plugins. PrefixProducerType is the
// producer the others read from; the config injects one when a profile
// uses them and none is declared.
const (
	PrefixProducerType       = "approx-prefix-cache-producer"
	PrefixCacheScorerType    = "prefix-cache-scorer"
	PrefixAffinityFilterType = "prefix-cache-affinity-filter"
	NoHitLRUScorerType       = "no-hit-lru-scorer"
)

// Request attributes of the prefix plugins: the producer's *PrefixMatch,
// and a flag the affinity filter sets when load overrides affinity.
const (
	prefixAttr         = "prefix-match"
	affinityBrokenAttr = "prefix-affinity-broken"
)

// PrefixMatch is, for one request, how much of its prompt each candidate
// endpoint is believed to hold in its KV cache.
type PrefixMatch struct {
	Hashes []uint64
	// Blocks maps endpoint address to the number of leading blocks held.
	Blocks      map[string]int
	BlockTokens int
}

// Cold reports whether no candidate holds any of the prompt.
func (m *PrefixMatch) Cold() bool {
	for _, n := range m.Blocks {
		if n > 0 {
			return false
		}
	}
	return true
}

// Fraction is the share of the prompt's blocks the endpoint holds.
func (m *PrefixMatch) Fraction(addr string) float64 {
	if len(m.Hashes) == 0 {
		return 0
	}
	return float64(m.Blocks[addr]) / float64(len(m.Hashes))
}

func prefixMatchOf(req *Request) *PrefixMatch {
	m, _ := req.Attr(prefixAttr).(*PrefixMatch)
	return m
}

// prefixProducer hashes each prompt into blocks, matches the blocks
// against its index of what each endpoint recently served, and learns:
// the picked endpoint is assumed to cache the prompt at once (so a burst
// of requests sharing a prefix sticks together before any response), and
// the endpoint the proxy reports as having served learns it too when it
// differs (a retry or failover moved the request).
//
// It also learns each server's tokenizer (calibrate): the index is sized
// in the server's own KV blocks, converted to prompt bytes with the bytes
// per token the server's counters show, so that it forgets a prefix about
// when the server evicts it, whatever the tokenizer.
type prefixProducer struct {
	named
	blockTokens int
	maxBlocks   int
	autoTune    bool
	index       *prefix.Index
	learner     *calibrate.Learner
	log         logr.Logger

	mu         sync.Mutex
	capacities map[string]int
	// observed is the scrape last given to the learner, per endpoint;
	// told is what was last logged about it.
	observed  map[string]*datastore.Metrics
	told      map[string]told
	lastPrune time.Time

	peers peerCounts
}

// told is what the producer last logged about an endpoint's calibration.
type told struct {
	uncounted     bool
	bytesPerToken float64
	drift         time.Time
}

func newPrefixProducer(id named, params json.RawMessage) (Plugin, error) {
	p := struct {
		BlockSizeTokens        int   `json:"blockSizeTokens"`
		MaxPrefixBlocksToMatch int   `json:"maxPrefixBlocksToMatch"`
		LRUCapacityPerServer   int   `json:"lruCapacityPerServer"`
		AutoTune               *bool `json:"autoTune"`
	}{BlockSizeTokens: 16, MaxPrefixBlocksToMatch: 2048, LRUCapacityPerServer: 31250}
	if err := DecodeParams(params, &p); err != nil {
		return nil, err
	}
	for field, v := range map[string]int{"blockSizeTokens": p.BlockSizeTokens, "maxPrefixBlocksToMatch": p.MaxPrefixBlocksToMatch, "lruCapacityPerServer": p.LRUCapacityPerServer} {
		if v < 1 {
			return nil, fmt.Errorf("parameters.%s: must be at least 1, got %d", field, v)
		}
	}
	return &prefixProducer{
		named:       id,
		blockTokens: p.BlockSizeTokens,
		maxBlocks:   p.MaxPrefixBlocksToMatch,
		autoTune:    p.AutoTune == nil || *p.AutoTune,
		index:       prefix.NewIndex(p.LRUCapacityPerServer),
		learner:     calibrate.New(),
		log:         logr.Discard(),
		capacities:  map[string]int{},
		observed:    map[string]*datastore.Metrics{},
		told:        map[string]told{},
	}, nil
}

func (p *prefixProducer) SetLogger(log logr.Logger) { p.log = log }

func (p *prefixProducer) Produce(_ context.Context, req *Request, eps []Endpoint) {
	m := &PrefixMatch{BlockTokens: p.blockTokens, Blocks: make(map[string]int, len(eps))}
	if req.Body != nil {
		m.Hashes = prefix.Hashes(req.Model, req.Prompt(), p.blockTokens, p.maxBlocks)
	}
	// One lock for the whole pool, not one per endpoint: which endpoints
	// have a scrape the learner has not seen, and whether pruning is due.
	now := time.Now()
	var buf [16]int
	fresh := buf[:0]
	p.mu.Lock()
	for i, e := range eps {
		if e.Metrics != nil && p.observed[e.Address] != e.Metrics {
			p.observed[e.Address] = e.Metrics
			fresh = append(fresh, i)
		}
	}
	due := now.Sub(p.lastPrune) > pruneEvery
	if due {
		p.lastPrune = now
	}
	p.mu.Unlock()
	for _, i := range fresh {
		p.tune(eps[i])
	}
	for _, e := range eps {
		m.Blocks[e.Address] = p.index.Match(e.Address, m.Hashes)
	}
	req.SetAttr(prefixAttr, m)
	if due {
		p.prune(now)
	}
}

// tune gives a new scrape of the endpoint to the learner, and sizes the
// endpoint's memory like its real KV cache once the server publishes block
// size and count: the server's tokens, at its learned bytes per token, in
// the index's blocks of blockTokens × wire.DefaultBytesPerToken bytes. The
// index then forgets about when the server evicts. The scrape and the
// learned ratio only change together, so Produce calls it only for a
// scrape it has not seen.
func (p *prefixProducer) tune(e Endpoint) {
	if est, taken := p.learner.Observe(e.Address, e.Metrics.Tokens, e.Metrics.UpdatedAt); taken {
		e.SetBytesPerToken(est.BytesPerToken)
		p.report(e.Address, est)
	}
	if !p.autoTune || e.Metrics.BlockSize <= 0 || e.Metrics.NumGPUBlocks <= 0 {
		return
	}
	serverTokens := float64(e.Metrics.BlockSize) * float64(e.Metrics.NumGPUBlocks)
	blocks := int(serverTokens * e.BytesPerToken() / float64(p.blockTokens*wire.DefaultBytesPerToken))
	p.mu.Lock()
	changed := p.capacities[e.Address] != blocks
	p.capacities[e.Address] = blocks
	p.mu.Unlock()
	if changed {
		p.index.SetCapacity(e.Address, blocks)
	}
}

// driftTolerance is how far the index's expected hit rate may be from the
// server's before it is logged; driftLogEvery spaces those lines.
const (
	driftTolerance = 0.15
	driftLogEvery  = 5 * time.Minute
)

// report logs what calibration found out about an endpoint, once each:
// that it reports no prompt-token counter (the default ratio holds), a
// newly learned ratio, and an index whose expected hits stray from the
// server's real ones (the index is sized wrong, or traffic reaches the
// server past this picker).
func (p *prefixProducer) report(addr string, est calibrate.Estimate) {
	p.mu.Lock()
	t := p.told[addr]
	var logUncounted, logRatio, logDrift bool
	if !est.Counted && !t.uncounted {
		t.uncounted, logUncounted = true, true
	}
	if r := est.BytesPerToken; r > 0 && (t.bytesPerToken == 0 || math.Abs(r-t.bytesPerToken)/t.bytesPerToken > 0.1) {
		t.bytesPerToken, logRatio = r, true
	}
	drift := est.PredictedHitRate >= 0 && est.ServerHitRate >= 0 && math.Abs(est.PredictedHitRate-est.ServerHitRate) > driftTolerance
	if now := time.Now(); drift && now.Sub(t.drift) > driftLogEvery {
		t.drift, logDrift = now, true
	}
	p.told[addr] = t
	p.mu.Unlock()
	switch {
	case logUncounted:
		p.log.Info("the server reports no prompt-token counter; its tokenizer is assumed to make the default bytes per token",
			"endpoint", addr, "bytesPerToken", float64(wire.DefaultBytesPerToken))
	case logRatio:
		p.log.Info("learned the server's tokenizer ratio; the prefix index is sized with it", "endpoint", addr, "bytesPerToken", est.BytesPerToken)
	}
	if logDrift {
		p.log.Info("the prefix index expects a hit rate far from the server's own", "endpoint", addr,
			"indexHitRate", est.PredictedHitRate, "serverHitRate", est.ServerHitRate)
	}
}

// pruneEvery is how often the producer forgets endpoints gone from the
// pool: the index those not looked up since the last time (unused for 5 to
// 10 minutes), the learner those it has heard nothing of for two periods.
const pruneEvery = 5 * time.Minute

// prune forgets endpoints gone from the pool.
func (p *prefixProducer) prune(now time.Time) {
	p.index.Prune()
	p.learner.Prune(now.Add(-2 * pruneEvery))
	// What is known of endpoints the index or the learner forgot goes
	// with them: an endpoint that comes back is sized and calibrated anew.
	indexed, known := p.index.Stats(), p.learner.Estimates()
	p.mu.Lock()
	maps.DeleteFunc(p.capacities, func(addr string, _ int) bool { _, ok := indexed[addr]; return !ok })
	maps.DeleteFunc(p.observed, func(addr string, _ *datastore.Metrics) bool { _, ok := known[addr]; return !ok })
	maps.DeleteFunc(p.told, func(addr string, _ told) bool { _, ok := known[addr]; return !ok })
	p.mu.Unlock()
}

func (p *prefixProducer) Picked(_ context.Context, req *Request, res *Result) {
	m := prefixMatchOf(req)
	t := res.Targets()
	if m == nil || len(t) == 0 {
		return
	}
	p.routed(req, m, t[0].Address, 1)
	if len(m.Hashes) > 0 {
		p.index.Add(t[0].Address, m.Hashes)
	}
}

// routed tells the learner about a request's prompt sent to addr (sign
// 1), or taken back from it (-1).
func (p *prefixProducer) routed(req *Request, m *PrefixMatch, addr string, sign int) {
	if req.Body == nil {
		return
	}
	p.learner.Routed(addr, sign*req.PromptLen(), sign*m.Blocks[addr]*m.BlockTokens*wire.DefaultBytesPerToken)
}

func (p *prefixProducer) Served(_ context.Context, req *Request, picked []string, served string) {
	m := prefixMatchOf(req)
	if m == nil || (len(picked) > 0 && picked[0] == served) {
		return
	}
	// Another endpoint took the request: its prompt counts there.
	if len(picked) > 0 {
		p.routed(req, m, picked[0], -1)
	}
	p.routed(req, m, served, 1)
	if len(m.Hashes) > 0 {
		p.index.Add(served, m.Hashes)
	}
}

var (
	prefixBlocksDesc = prometheus.NewDesc("infergate_epp_prefix_index_blocks",
		"Prompt blocks the prefix index remembers, per endpoint (bounded by the endpoint's KV-cache size).",
		[]string{"endpoint"}, nil)
	prefixCapacityDesc = prometheus.NewDesc("infergate_epp_prefix_index_capacity_blocks",
		"Prompt blocks the prefix index may remember for the endpoint: its KV cache (block size × blocks, in its tokens) at its bytes per token, in the index's blocks.",
		[]string{"endpoint"}, nil)
	bytesPerTokenDesc = prometheus.NewDesc("infergate_epp_server_bytes_per_token",
		"Prompt bytes per token of the endpoint's tokenizer, learned from its prompt-token counter (4, the default, until learned).",
		[]string{"endpoint"}, nil)
	calibratedDesc = prometheus.NewDesc("infergate_epp_server_tokenizer_calibrated",
		"1 when the endpoint's bytes per token were learned from its counters, 0 while the default holds.",
		[]string{"endpoint"}, nil)
	hitRateDesc = prometheus.NewDesc("infergate_epp_prefix_hit_rate",
		"Share of the prompt found in the endpoint's prefix cache, recently: as the prefix index expected it (source=index) and as the server counted it (source=server).",
		[]string{"endpoint", "source"}, nil)
)

func (p *prefixProducer) Describe(ch chan<- *prometheus.Desc) {
	ch <- prefixBlocksDesc
	ch <- prefixCapacityDesc
	ch <- bytesPerTokenDesc
	ch <- calibratedDesc
	ch <- hitRateDesc
	ch <- peerDecisionsDesc
}

func (p *prefixProducer) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(peerDecisionsDesc, prometheus.CounterValue, float64(p.peers.agreed.Load()), "agreed")
	ch <- prometheus.MustNewConstMetric(peerDecisionsDesc, prometheus.CounterValue, float64(p.peers.differed.Load()), "differed")
	for addr, n := range p.index.Stats() {
		ch <- prometheus.MustNewConstMetric(prefixBlocksDesc, prometheus.GaugeValue, float64(n), addr)
	}
	p.mu.Lock()
	capacities := maps.Clone(p.capacities)
	p.mu.Unlock()
	for addr, n := range capacities {
		ch <- prometheus.MustNewConstMetric(prefixCapacityDesc, prometheus.GaugeValue, float64(n), addr)
	}
	for addr, est := range p.learner.Estimates() {
		ratio, calibrated := est.BytesPerToken, 1.0
		if ratio == 0 {
			ratio, calibrated = wire.DefaultBytesPerToken, 0
		}
		ch <- prometheus.MustNewConstMetric(bytesPerTokenDesc, prometheus.GaugeValue, ratio, addr)
		ch <- prometheus.MustNewConstMetric(calibratedDesc, prometheus.GaugeValue, calibrated, addr)
		for source, rate := range map[string]float64{"index": est.PredictedHitRate, "server": est.ServerHitRate} {
			if rate >= 0 {
				ch <- prometheus.MustNewConstMetric(hitRateDesc, prometheus.GaugeValue, rate, addr, source)
			}
		}
	}
}

// prefixScorer scores the share of the prompt an endpoint holds:
// (1−w)·matched/total + w·min(1, matchedTokens/scale)². With w = 0 (the
// default) it is the matched fraction.
type prefixScorer struct {
	named
	weight, scaleTokens float64
}

func newPrefixScorer(id named, params json.RawMessage) (Plugin, error) {
	p := struct {
		MatchLengthWeight      float64 `json:"matchLengthWeight"`
		MatchLengthScaleTokens float64 `json:"matchLengthScaleTokens"`
	}{MatchLengthScaleTokens: 8192}
	if err := DecodeParams(params, &p); err != nil {
		return nil, err
	}
	if p.MatchLengthWeight < 0 || p.MatchLengthWeight > 1 {
		return nil, fmt.Errorf("parameters.matchLengthWeight: must be in [0,1], got %v", p.MatchLengthWeight)
	}
	if !(p.MatchLengthScaleTokens > 0) {
		return nil, fmt.Errorf("parameters.matchLengthScaleTokens: must be positive, got %v", p.MatchLengthScaleTokens)
	}
	return &prefixScorer{named: id, weight: p.MatchLengthWeight, scaleTokens: p.MatchLengthScaleTokens}, nil
}

func (s *prefixScorer) Score(_ context.Context, req *Request, eps []Endpoint, scores []float64) {
	m := prefixMatchOf(req)
	if m == nil || req.Attr(affinityBrokenAttr) != nil {
		// The affinity filter found the holders too busy: load decides,
		// and pulling back toward them here would undo that.
		return
	}
	for i, e := range eps {
		tokens := float64(m.Blocks[e.Address] * m.BlockTokens)
		long := min(1, tokens/s.scaleTokens)
		scores[i] = (1-s.weight)*m.Fraction(e.Address) + s.weight*long*long
	}
}

// prefixAffinityFilter keeps only the endpoints that hold most of the
// prompt, so a prefix keeps landing where its KV cache is, unless those
// endpoints are clearly busier than the rest: then affinity gives way to
// load, and the prefix scorer abstains for the request. Without any holder
// it keeps all.
//
// "Clearly busier" compares the least busy holder with the least busy
// other endpoint: a waiting queue longer by more than maxWaitingQueueGap
// (a wait for a slot costs more than recomputing a prompt); or the least
// busy holder's running requests more than maxRunningRatio times the
// others' mean, plus a slack of 4 so that small counts do not flap, each
// server's counted per average KV cache (see load). The second rule matters for a prefix that
// every request shares (a common system prompt): without it the first
// endpoint to cache it would draw all traffic while batching hides the
// load from the queue.
type prefixAffinityFilter struct {
	named
	threshold    float64
	maxQueueGap  int
	runningRatio float64
	// kept and gave counts the requests whose prompt some endpoints held:
	// kept on them, or let go by waiting queue or running requests.
	kept                       atomic.Uint64
	gaveToQueue, gaveToRunning atomic.Uint64
}

var affinityDesc = prometheus.NewDesc("infergate_epp_prefix_affinity_total",
	"Requests whose prompt some endpoints held (and others not), by what the affinity filter did: kept them on the holders (outcome=kept), or gave way to load because the holders' waiting queue (outcome=gave-way-queue) or running requests per KV cache (outcome=gave-way-running) were clearly above the others'.",
	[]string{"outcome"}, nil)

func (f *prefixAffinityFilter) Describe(ch chan<- *prometheus.Desc) { ch <- affinityDesc }

func (f *prefixAffinityFilter) Collect(ch chan<- prometheus.Metric) {
	for outcome, n := range map[string]uint64{"kept": f.kept.Load(), "gave-way-queue": f.gaveToQueue.Load(), "gave-way-running": f.gaveToRunning.Load()} {
		ch <- prometheus.MustNewConstMetric(affinityDesc, prometheus.CounterValue, float64(n), outcome)
	}
}

// runningSlack is added to the running-requests bound.
const runningSlack = 4

func newPrefixAffinityFilter(id named, params json.RawMessage) (Plugin, error) {
	p := struct {
		AffinityThreshold  float64 `json:"affinityThreshold"`
		MaxWaitingQueueGap int     `json:"maxWaitingQueueGap"`
		MaxRunningRatio    float64 `json:"maxRunningRatio"`
	}{AffinityThreshold: 0.8, MaxWaitingQueueGap: 2, MaxRunningRatio: 2}
	if err := DecodeParams(params, &p); err != nil {
		return nil, err
	}
	if !(p.AffinityThreshold > 0 && p.AffinityThreshold <= 1) {
		return nil, fmt.Errorf("parameters.affinityThreshold: must be in (0,1], got %v", p.AffinityThreshold)
	}
	if p.MaxWaitingQueueGap < 0 {
		return nil, fmt.Errorf("parameters.maxWaitingQueueGap: must not be negative, got %d", p.MaxWaitingQueueGap)
	}
	if !(p.MaxRunningRatio >= 1) {
		return nil, fmt.Errorf("parameters.maxRunningRatio: must be at least 1, got %v", p.MaxRunningRatio)
	}
	return &prefixAffinityFilter{named: id,
		threshold: p.AffinityThreshold, maxQueueGap: p.MaxWaitingQueueGap, runningRatio: p.MaxRunningRatio}, nil
}

// load sums up one side of the affinity filter's comparison: the least
// busy endpoint's waiting queue (-1 unknown), and the running requests
// per average KV cache (a server with twice the pool's average cache
// counts each as half, since it holds twice the prefixes and so draws
// twice the requests where placement is right): the least on the
// holders' side, the mean on the others', so that one idle server among
// several does not make every holder look busy.
type load struct {
	waiting    int
	least, sum float64
	known      int
}

func newLoad() load { return load{waiting: -1, least: -1} }

func (l *load) add(m *datastore.Metrics, size float64) {
	if m == nil {
		return
	}
	l.waiting = minKnown(l.waiting, m.WaitingQueueSize)
	if m.RunningRequests < 0 {
		return
	}
	r := float64(m.RunningRequests) / size
	if l.least < 0 || r < l.least {
		l.least = r
	}
	l.sum += r
	l.known++
}

// mean is the mean running requests per average KV cache, -1 unknown.
func (l *load) mean() float64 {
	if l.known == 0 {
		return -1
	}
	return l.sum / float64(l.known)
}

// relativeSizes are the endpoints' KV caches over the mean of those
// published, 1 for an endpoint that publishes none (or when none does).
func relativeSizes(eps []Endpoint, dst []float64) []float64 {
	sum, n := 0.0, 0
	for _, e := range eps {
		if c := kvTokens(e); c > 0 {
			sum, n = sum+c, n+1
		}
	}
	for _, e := range eps {
		size := 1.0
		if c := kvTokens(e); c > 0 {
			size = c * float64(n) / sum
		}
		dst = append(dst, size)
	}
	return dst
}

func (f *prefixAffinityFilter) Filter(_ context.Context, req *Request, eps []Endpoint) []Endpoint {
	m := prefixMatchOf(req)
	if m == nil || len(m.Hashes) == 0 {
		return eps
	}
	var buf [16]float64
	sizes := relativeSizes(eps, buf[:0])
	var sticky []Endpoint
	holders, others := newLoad(), newLoad()
	for i, e := range eps {
		if m.Fraction(e.Address) >= f.threshold {
			sticky = append(sticky, e)
			holders.add(e.Metrics, sizes[i])
		} else {
			others.add(e.Metrics, sizes[i])
		}
	}
	if len(sticky) == 0 || len(sticky) == len(eps) {
		return eps
	}
	switch {
	case holders.waiting >= 0 && others.waiting >= 0 && holders.waiting-others.waiting > f.maxQueueGap:
		f.gaveToQueue.Add(1)
	case holders.least >= 0 && others.mean() >= 0 && holders.least > f.runningRatio*others.mean()+runningSlack:
		f.gaveToRunning.Add(1)
	default:
		f.kept.Add(1)
		return sticky
	}
	req.SetAttr(affinityBrokenAttr, true)
	return eps
}

func minKnown(cur, v int) int {
	switch {
	case v < 0:
		return cur
	case cur < 0:
		return v
	}
	return min(cur, v)
}

// noHitLRUScorer places cold requests (no candidate holds any of the
// prompt), so that new prefixes partition the pool instead of piling onto
// the least-loaded endpoint of the moment. Each endpoint takes new prompts
// in proportion to its KV cache, the size its server publishes: a server
// with twice the cache holds twice the prefixes for as long, so every
// server's cache turns over at the same pace and none evicts prefixes the
// others would have kept. Without published sizes all weigh alike and the
// order is the endpoints' least recent cold pick, as the scorer's name says.
// Warm requests get a neutral 0.5 and leave the choice to the prefix
// scorer.
//
// The order is stride scheduling: an endpoint's pass grows by the blocks
// of each new prompt it took over its cache's blocks (one pass is its
// cache filled once), and the lowest pass scores 1, the highest 0.
type noHitLRUScorer struct {
	named
	size     int
	weighted bool
	mu       sync.Mutex
	pass     map[string]float64 // endpoint → its cold picks' blocks over its KV blocks
	capacity map[string]float64 // endpoint → its KV cache in tokens, as last seen
	// floor is where an endpoint first seen starts: the least advanced
	// candidate's pass when the scorer last ranked, so that a newcomer
	// (or one heard of first through a peer's pick) is neither behind
	// the pool by all the time it was away nor ahead of those yet to
	// take a prompt.
	floor float64
	// blockTokens is the prefix index's block size: the peers' decisions
	// count their prompts in its blocks.
	blockTokens int
}

// maxColdLag bounds how far behind the others an endpoint's pass may be,
// in cache fills: one that was away (filtered out, drained, restarted)
// catches up by at most one cache of new prompts rather than taking every
// new prompt until it has made up all the time it was gone.
const maxColdLag = 1.0

func newNoHitLRUScorer(id named, params json.RawMessage) (Plugin, error) {
	p := struct {
		LRUSize          int   `json:"lruSize"`
		CapacityWeighted *bool `json:"capacityWeighted"`
	}{LRUSize: 1024}
	if err := DecodeParams(params, &p); err != nil {
		return nil, err
	}
	if p.LRUSize < 1 {
		return nil, fmt.Errorf("parameters.lruSize: must be at least 1, got %d", p.LRUSize)
	}
	return &noHitLRUScorer{named: id, size: p.LRUSize, weighted: p.CapacityWeighted == nil || *p.CapacityWeighted,
		pass: map[string]float64{}, capacity: map[string]float64{}, blockTokens: 16}, nil
}

// kvTokens is the endpoint's KV cache in tokens as its server publishes
// it (vLLM's cache_config_info), 0 when unknown.
func kvTokens(e Endpoint) float64 {
	if e.Metrics == nil || e.Metrics.BlockSize <= 0 || e.Metrics.NumGPUBlocks <= 0 {
		return 0
	}
	return float64(e.Metrics.BlockSize) * float64(e.Metrics.NumGPUBlocks)
}

func (s *noHitLRUScorer) Score(_ context.Context, req *Request, eps []Endpoint, scores []float64) {
	m := prefixMatchOf(req)
	if m != nil && !m.Cold() {
		for i := range scores {
			scores[i] = 0.5
		}
		return
	}
	if len(eps) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.weighted {
		for _, e := range eps {
			if c := kvTokens(e); c > 0 {
				s.capacity[e.Address] = c
			}
		}
	}
	// An endpoint never seen starts at the floor, where the least
	// advanced candidate stood when this scorer last ranked; none trails
	// the most advanced by more than a cache.
	var buf [16]float64
	passes := buf[:0]
	hi := math.Inf(-1)
	for _, e := range eps {
		v, ok := s.pass[e.Address]
		if !ok {
			v = s.floor
			s.pass[e.Address] = v
		}
		passes = append(passes, v)
		hi = max(hi, v)
	}
	lo := math.Inf(1)
	for i, e := range eps {
		if passes[i] < hi-maxColdLag {
			passes[i] = hi - maxColdLag
			s.pass[e.Address] = passes[i]
		}
		lo = min(lo, passes[i])
	}
	s.floor = max(s.floor, lo)
	for i, v := range passes {
		if hi == lo {
			scores[i] = 1
			continue
		}
		scores[i] = (hi - v) / (hi - lo)
	}
}

func (s *noHitLRUScorer) Picked(_ context.Context, req *Request, res *Result) {
	m := prefixMatchOf(req)
	if m != nil && !m.Cold() {
		return
	}
	if t := res.Targets(); len(t) > 0 {
		blocks, blockTokens := 1, 0
		if m != nil {
			blocks, blockTokens = len(m.Hashes), m.BlockTokens
		}
		s.coldPick(t[0].Address, blocks, blockTokens)
	}
}

// coldPick records a cold prompt of blocks sent to addr; blockTokens is
// the prefix index's block size (0 when unknown: the last one seen).
func (s *noHitLRUScorer) coldPick(addr string, blocks, blockTokens int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if blockTokens > 0 {
		s.blockTokens = blockTokens
	}
	v, ok := s.pass[addr]
	if !ok {
		v = s.floor
	}
	s.pass[addr] = v + float64(max(1, blocks)*s.blockTokens)/s.capacityOf(addr)
	if len(s.pass) > s.size { // forget the endpoint least advanced: the longest gone
		least, at := "", math.Inf(1)
		for a, v := range s.pass {
			if v < at {
				least, at = a, v
			}
		}
		delete(s.pass, least)
		delete(s.capacity, least)
	}
}

// capacityOf is addr's KV cache in tokens, or the mean of those known
// when its own is not (its server publishes none, or weighting is off),
// so an endpoint of unknown size weighs as an average one. Called with
// mu held.
func (s *noHitLRUScorer) capacityOf(addr string) float64 {
	if c, ok := s.capacity[addr]; ok {
		return c
	}
	if len(s.capacity) == 0 {
		return unknownCapacity
	}
	sum := 0.0
	for _, c := range s.capacity {
		sum += c
	}
	return sum / float64(len(s.capacity))
}

// unknownCapacity is every endpoint's KV cache, in tokens, when no server
// publishes one: any equal value makes the order round robin.
const unknownCapacity = 1 << 20
