package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/sim"
)

// server is one sim of a pool whose sims differ: its KV cache, and its
// pace, which multiplies the sims' default prefill time per token and
// inter-token latency (1.5 is half as slow again). The zero value is a
// default sim.
type server struct {
	kvTokens int
	pace     float64
}

// kv is the server's KV cache in tokens.
func (s server) kv() int {
	if s.kvTokens > 0 {
		return s.kvTokens
	}
	return sim.DefaultKVCacheTokens
}

// model is the server's latency model, base scaled by its pace.
func (s server) model(base simModel) simModel {
	base.perToken = time.Duration(float64(base.perToken) * s.factor())
	base.itl = time.Duration(float64(base.itl) * s.factor())
	return base
}

// args are the sim's flags beyond the defaults, base being the defaults'
// model.
func (s server) args(base simModel) []string {
	var out []string
	if s.kvTokens > 0 {
		out = append(out, "--kv-cache-tokens", strconv.Itoa(s.kvTokens), "--block-size", strconv.Itoa(sim.DefaultBlockSize))
	}
	if s.factor() != 1 {
		m := s.model(base)
		out = append(out, "--prefill-time-per-token", m.perToken.String(), "--inter-token-latency", m.itl.String())
	}
	return out
}

// baseModel is the sims' default latency model: as the binary's help
// gives it, else the sim package's defaults.
func (e *env) baseModel() simModel {
	if e.model.known {
		return e.model
	}
	return simModel{maxNumSeqs: sim.DefaultMaxNumSeqs, overhead: sim.DefaultPrefillOverhead, perToken: sim.DefaultPrefillTimePerToken,
		itl: sim.DefaultInterTokenLatency, known: true}
}

// heteroSpec is workload (h): shared prefixes on sims that differ in KV
// cache and speed.
type heteroSpec struct {
	Servers                               []server
	Prefixes, Repeats                     int
	PrefixTokens, SuffixTokens, MaxTokens int
	Concurrency                           int
}

// defaultHetero: KV caches of 4,000 to 16,000 blocks of 16 tokens; the two
// small sims are also the slow ones (×1.5 and ×1.25 the default prefill
// and decode times), as an older or smaller accelerator has less memory
// and less speed, and the largest is the fastest (×0.8). 240 prefixes of
// 2,048 tokens take 491,520 tokens, 76.8% of the pool's 640,000: they fit
// only if each sim holds a share in proportion to its cache, and an even
// split (60 each, 122,880 tokens) overflows the two small sims. 32
// requests in flight keep every sim busy (8 each on average, of 256
// slots) without queueing.
var defaultHetero = heteroSpec{
	Servers:  []server{{64000, 1.5}, {128000, 1.25}, {192000, 1}, {256000, 0.8}},
	Prefixes: 240, Repeats: 8, PrefixTokens: 2048, SuffixTokens: 128, MaxTokens: 128, Concurrency: 32,
}

// quickHetero is h at an eighth of the caches and prefixes (the same
// 76.8% of the pool), 4 repeats, 8 in flight: --quick and the test.
var quickHetero = heteroSpec{
	Servers:  []server{{8000, 1.5}, {16000, 1.25}, {24000, 1}, {32000, 0.8}},
	Prefixes: 30, Repeats: 4, PrefixTokens: 2048, SuffixTokens: 128, MaxTokens: 128, Concurrency: 8,
}

// heteroWorkload is (a)'s generator on h's pool: every prefix repeated,
// each time with a unique suffix, all in random order.
func heteroWorkload(s heteroSpec, seed uint64) *workload {
	w := measuredWorkload(measuredSpec{Pods: len(s.Servers), Prefixes: s.Prefixes, Repeats: s.Repeats, PrefixTokens: s.PrefixTokens,
		SuffixTokens: s.SuffixTokens, MaxTokens: s.MaxTokens, Concurrency: s.Concurrency}, seed)
	w.key, w.name, w.servers = "h", "heterogeneous", s.Servers
	var kv, pace, share []string
	total := 0
	for _, srv := range s.Servers {
		total += srv.kv()
	}
	for i, n := range capacityCounts(s.Prefixes, kvWeights(s.Servers)) {
		srv := s.Servers[i]
		kv = append(kv, fmt.Sprintf("%d", srv.kv()/sim.DefaultBlockSize))
		pace = append(pace, "×"+strconv.FormatFloat(srv.factor(), 'g', -1, 64))
		share = append(share, strconv.Itoa(n))
	}
	prefixTokens := s.Prefixes * s.PrefixTokens
	w.describe = fmt.Sprintf("%d sims that differ: KV cache %s blocks of %d tokens (%d tokens in all), prefill time per token and inter-token latency %s the sims' defaults (the small sims the slow ones); "+
		"%d distinct %d-token prefixes (%d tokens, %.1f%% of the pool's KV cache) × %d repeats, each + a unique %d-token suffix, max_tokens %d; %d requests in random order, %d concurrent; completions API. "+
		"*oracle-capacity*, the capacity-weighted oracle, gives each sim prefixes in proportion to its KV cache (%s), the sim furthest below its share first, and names it in `test-epp-endpoint-selection` through the picker as *oracle* (group mod pods) does; *of oracle-capacity* is a row's hit rate over that oracle's with as many picker replicas",
		len(s.Servers), strings.Join(kv, " / "), sim.DefaultBlockSize, total, strings.Join(pace, " / "),
		s.Prefixes, s.PrefixTokens, prefixTokens, 100*float64(prefixTokens)/float64(total), s.Repeats, s.SuffixTokens, s.MaxTokens,
		s.Prefixes*s.Repeats, s.Concurrency, strings.Join(share, " / "))
	return w
}

// heteroChatSpec is workload (m): conversations on h's pool, each turn
// resending the history, each conversation about a document of its own.
type heteroChatSpec struct {
	Servers []server
	Chat    multiTurnSpec
}

// defaultHeteroChat: 240 conversations × 6 turns, 48 in flight, each with
// a 4,096-token document after the shared 1,024-token system prompt and
// turns of 128±32 tokens: a conversation holds about 5,000 to 6,700 tokens
// of KV by its last turn, 48 of them about 40% of the pool's cache. Split
// evenly (12 in flight each) they overflow the smallest sim's 64,000
// tokens; split by capacity (about 5) they fit.
var defaultHeteroChat = heteroChatSpec{Servers: defaultHetero.Servers,
	Chat: multiTurnSpec{Conversations: 240, Turns: 6, SystemTokens: 1024, ContextTokens: 4096, MeanTokens: 128, Spread: 32, Concurrency: 48}}

// quickHeteroChat is m on the quick pool (an eighth of the caches): 30
// conversations, 6 in flight.
var quickHeteroChat = heteroChatSpec{Servers: quickHetero.Servers,
	Chat: multiTurnSpec{Conversations: 30, Turns: 6, SystemTokens: 1024, ContextTokens: 4096, MeanTokens: 128, Spread: 32, Concurrency: 6}}

// heteroChatWorkload is (b)'s generator on h's pool.
func heteroChatWorkload(s heteroChatSpec, seed uint64) *workload {
	s.Chat.Pods = len(s.Servers)
	w := multiTurnWorkload(s.Chat, seed)
	w.key, w.name, w.servers = "m", "multi-turn heterogeneous", s.Servers
	var kv, pace, share []string
	for i, n := range capacityCounts(s.Chat.Conversations, kvWeights(s.Servers)) {
		kv = append(kv, strconv.Itoa(s.Servers[i].kv()/sim.DefaultBlockSize))
		pace = append(pace, "×"+strconv.FormatFloat(s.Servers[i].factor(), 'g', -1, 64))
		share = append(share, strconv.Itoa(n))
	}
	c := s.Chat
	w.describe = fmt.Sprintf("(h)'s %d sims (KV cache %s blocks of %d tokens, pace %s); %d conversations × %d turns sharing one %d-token system prompt, each opening with a %d-token document of its own; each turn resends the history (user and assistant messages of %d±%d tokens) plus a new user message and asks for %d±%d tokens; turns of a conversation in order, %d conversations at a time; chat API. "+
		"*oracle-capacity* gives each sim conversations in proportion to its KV cache (%s)",
		len(s.Servers), strings.Join(kv, " / "), sim.DefaultBlockSize, strings.Join(pace, " / "), c.Conversations, c.Turns, c.SystemTokens, c.ContextTokens,
		c.MeanTokens, c.Spread, c.MeanTokens, c.Spread, c.Concurrency, strings.Join(share, " / "))
	return w
}

// factor is the server's pace, 1 for the default.
func (s server) factor() float64 {
	if s.pace > 0 {
		return s.pace
	}
	return 1
}

// kvWeights are the servers' KV caches.
func kvWeights(servers []server) []int {
	out := make([]int, len(servers))
	for i, s := range servers {
		out[i] = s.kv()
	}
	return out
}

// capacitySplit assigns groups 0..n-1 to sims in proportion to weights:
// each group in turn to the sim furthest below its share of the groups
// assigned so far (largest remaining share first), ties to the lower
// index, so that the sims fill alike as the groups come.
func capacitySplit(n int, weights []int) []int {
	total := 0
	for _, w := range weights {
		total += w
	}
	if total == 0 || n == 0 {
		return nil
	}
	out := make([]int, n)
	got := make([]int, len(weights))
	for g := range out {
		best, bestLeft := 0, 0.0
		for i, w := range weights {
			left := float64(w)/float64(total)*float64(g+1) - float64(got[i])
			if i == 0 || left > bestLeft {
				best, bestLeft = i, left
			}
		}
		out[g] = best
		got[best]++
	}
	return out
}

// capacityCounts is how many of n groups capacitySplit gives each sim.
func capacityCounts(n int, weights []int) []int {
	out := make([]int, len(weights))
	for _, i := range capacitySplit(n, weights) {
		out[i]++
	}
	return out
}

// withCapacityOracle is cfgs with the capacity-weighted oracle, h's
// yardstick, in table order.
func withCapacityOracle(cfgs []string) []string {
	if slices.Contains(cfgs, cfgOracleCapacity) {
		return cfgs
	}
	return append(slices.Clone(cfgs), cfgOracleCapacity)
}

// heteroNotes prints h's ratios among the rows of n replicas and records
// its goal: the default profile against the capacity-weighted oracle.
func (e *env) heteroNotes(byCfg map[string]*runStats, at string, n int, g goal) {
	capOracle := byCfg[cfgOracleCapacity]
	if capOracle == nil {
		return
	}
	for _, cfg := range []string{cfgDefault, cfgOracle, cfgLoadOnly, cfgRoundRobin} {
		r := byCfg[cfg]
		if r == nil {
			continue
		}
		if cfg == cfgDefault {
			e.goals.record(g.at(n), r.hitRate()/capOracle.hitRate())
		}
		if r.groups > 0 {
			fmt.Printf("- %s%s: %d of the %d prefixes served by more than one pod%s.\n", at, cfg, r.split, r.groups, affinityText(r.affinity))
		}
		rp, op := percentile(r.ttft, 0.99), percentile(capOracle.ttft, 0.99)
		fmt.Printf("- %s%s / oracle-capacity: hit rate **%s** (%s / %s), p99 TTFT %s (%s / %s), throughput %s (req/s).\n", at, cfg,
			ratio(r.hitRate(), capOracle.hitRate()), pctString(r.hitRate()), pctString(capOracle.hitRate()),
			ratio(rp.Seconds(), op.Seconds()), ms(rp), ms(op), ratio(r.reqPerSec(e.scale), capOracle.reqPerSec(e.scale)))
	}
}

// affinityText is what the affinity filter did, as a clause, or "" when
// it did nothing.
func affinityText(a map[string]float64) string {
	var parts []string
	for _, o := range affinityOutcomes {
		if a[o] > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", o, a[o]))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; affinity filter: " + strings.Join(parts, ", ")
}
