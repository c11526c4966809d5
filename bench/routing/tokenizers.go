package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// tokenizerConfigs are the configurations workload t runs, of those
// selected: the picker's prefix routing, the hand split it is measured
// against, and round robin for reference.
var tokenizerConfigs = []string{cfgRoundRobin, cfgDefault, cfgOracle}

// tokenizerTable runs workload (a) once per tokenizer of e.tokenizers, the
// sims started with it and every prompt exactly as many of its tokens as
// in (a), and prints a row per tokenizer: whether the picker's prefix
// routing, which starts from 4 bytes a token and learns each server's
// figure, keeps up with the hand split. The picker rows run with replicas
// picker replicas.
func (e *env) tokenizerTable(ctx context.Context, spec measuredSpec, seed uint64, cfgs []string, replicas int) error {
	var run []string
	for _, c := range cfgs {
		if slices.Contains(tokenizerConfigs, c) {
			run = append(run, c)
		}
	}
	names := make([]string, len(e.tokenizers))
	for i, t := range e.tokenizers {
		names[i] = t.String()
	}
	fmt.Printf("## (t) tokenizers%s\n\nWorkload (a) (%d pods; %d distinct %d-token prefixes × %d repeats + a unique %d-token suffix, max_tokens %d; %d requests, %d concurrent) with the sims started with each tokenizer of %s (`infergate sim --tokenizer bytes --bytes-per-token N`, or `--tokenizer words`). Prompts are exactly as many tokens of that tokenizer as in (a), so their size in bytes follows the tokenizer while the sims' cache, in tokens, is the same; the picker starts from 4 bytes a token and learns each sim's figure from `vllm:prompt_tokens_total`. Configs: %s.\n\n",
		e.replicasTitle(replicas), spec.Pods, spec.Prefixes, spec.PrefixTokens, spec.Repeats, spec.SuffixTokens, spec.MaxTokens, spec.Prefixes*spec.Repeats, spec.Concurrency,
		strings.Join(names, ", "), strings.Join(run, ", "))
	if len(run) == 0 {
		fmt.Printf("- (t) needs infergate-default, oracle or round-robin in --configs.\n\n")
		return nil
	}
	type row struct {
		tok tokenizer
		w   *workload
		by  map[string]*runStats
	}
	var rows []row
	for _, tok := range e.tokenizers {
		s := spec
		s.Tokenizer = tok
		w := measuredWorkload(s, seed)
		w.key, w.name = "t", "tokenizers"
		var reqs []request
		for _, ss := range w.sessions {
			reqs = append(reqs, ss...)
		}
		by := map[string]*runStats{}
		for _, cfg := range run {
			r, err := e.sharedRun(ctx, w, reqs, cfg, replicas)
			if err != nil {
				return fmt.Errorf("(t) %s, %s: %w", tok, e.label(cfg, replicas), err)
			}
			by[cfg] = r
		}
		rows = append(rows, row{tok, w, by})
	}

	_, withRR := rows[0].by[cfgRoundRobin]
	t := &table{header: []string{"sims' tokenizer", "prefix", "hit rate default", "hit rate oracle", "default / oracle"}}
	if withRR {
		t.header = append(t.header, "hit rate round-robin")
	}
	t.header = append(t.header, "prefixes split default / oracle", "p99 TTFT default / oracle", "decision mean default / oracle",
		"picker's bytes/token per sim", "sims' bytes/token per sim", "errors / 429")
	t.right = make([]bool, len(t.header))
	for i := 1; i < len(t.right); i++ {
		t.right[i] = true
	}
	for _, r := range rows {
		def, oracle := r.by[cfgDefault], r.by[cfgOracle]
		cells := []string{r.tok.String(), bytesString(r.w.prefixBytes), hitOf(def), hitOf(oracle), "-"}
		if def != nil && oracle != nil {
			cells[4] = ratio(def.hitRate(), oracle.hitRate())
			e.goals.record(goalTokHitRate(r.tok).at(replicas), def.hitRate()/oracle.hitRate())
		}
		if def != nil {
			e.goals.record(goalTokSplit(r.tok).at(replicas), splitShare(def))
		}
		if withRR {
			cells = append(cells, hitOf(r.by[cfgRoundRobin]))
		}
		p99 := "-"
		if def != nil && oracle != nil {
			dp, op := percentile(def.ttft, 0.99), percentile(oracle.ttft, 0.99)
			p99 = fmt.Sprintf("%s (%s / %s)", ratio(dp.Seconds(), op.Seconds()), ms(dp), ms(op))
		}
		errs := make([]string, 0, len(run))
		for _, cfg := range run {
			errs = append(errs, fmt.Sprintf("%d / %d", r.by[cfg].t.errs, r.by[cfg].t.n429))
		}
		measured := def
		if measured == nil {
			measured = oracle
		}
		cells = append(cells,
			splitString(def)+" / "+splitString(oracle),
			p99,
			decisionString(def)+" / "+decisionString(oracle),
			learnedString(def),
			trueString(measured),
			strings.Join(errs, ", "))
		t.add(cells...)
	}
	fmt.Print(t.String())
	fmt.Println()
	fmt.Printf("- *prefix*: the mean size of a shared %d-token prefix under the tokenizer; *prefixes split*: the share of the %d prefixes whose requests the sims' `x-inference-pod` header shows served by more than one pod; *decision mean*: the picker's mean decision time (wall clock); *picker's bytes/token*: `infergate_epp_server_bytes_per_token` per sim at the end of the infergate-default run (\"default\" while `infergate_epp_server_tokenizer_calibrated` is 0, i.e. 4 assumed); *sims' bytes/token*: the prompt bytes each sim answered over its `vllm:prompt_tokens_total`, during the measured requests of that run; *errors / 429*: per config, in the order %s.\n",
		spec.PrefixTokens, spec.Prefixes, strings.Join(run, ", "))
	for _, r := range rows {
		if def := r.by[cfgDefault]; def != nil {
			if s := prefixFigures(def); s != "" {
				fmt.Printf("- %s, infergate-default picker at the end of the run: %s.\n", r.tok, s)
			}
		}
	}
	for _, r := range rows {
		for _, cfg := range run {
			if rs := r.by[cfg]; rs.t.errs > 0 {
				fmt.Printf("- %s %s: first error: %s\n", r.tok, cfg, rs.t.firstErr)
			}
		}
	}
	fmt.Println()
	return nil
}

func hitOf(r *runStats) string {
	if r == nil {
		return "-"
	}
	return pctString(r.hitRate())
}

// splitGroups counts the groups (shared prefixes) of the answered
// requests, and of those the ones whose requests more than one pod served,
// by the pod each response named.
func splitGroups(results []result) (split, groups int) {
	first := map[int]string{}
	multi := map[int]bool{}
	for _, r := range results {
		if !r.ok() || r.group < 0 || r.pod == "" {
			continue
		}
		if p, ok := first[r.group]; !ok {
			first[r.group] = r.pod
		} else if p != r.pod {
			multi[r.group] = true
		}
	}
	return len(multi), len(first)
}

// splitShare is the share of the run's groups split between pods; NaN
// without groups.
func splitShare(r *runStats) float64 {
	if r.groups == 0 {
		return math.NaN()
	}
	return float64(r.split) / float64(r.groups)
}

func splitString(r *runStats) string {
	if r == nil {
		return "-"
	}
	return pctString(splitShare(r))
}

func decisionString(r *runStats) string {
	if r == nil || r.decision == 0 {
		return "-"
	}
	return us(r.decision)
}

// learnedString is the picker's bytes per token of each sim.
func learnedString(r *runStats) string {
	if r == nil || r.endpoints == nil {
		return "-"
	}
	parts := make([]string, len(r.endpoints))
	for i, f := range r.endpoints {
		switch {
		case math.IsNaN(f.bytesPerToken):
			parts[i] = "-"
		case !f.calibrated:
			parts[i] = "default"
		default:
			parts[i] = strconv.FormatFloat(f.bytesPerToken, 'f', 2, 64)
		}
	}
	return strings.Join(parts, " / ")
}

// trueString is each sim's prompt bytes per token over the run.
func trueString(r *runStats) string {
	if r == nil {
		return "-"
	}
	parts := make([]string, len(r.promptTokens))
	for i, n := range r.promptTokens {
		parts[i] = "-"
		if n > 0 {
			parts[i] = strconv.FormatFloat(r.promptBytes[i]/n, 'f', 2, 64)
		}
	}
	return strings.Join(parts, " / ")
}

// The picker's per-endpoint metrics that workload t reads.
const (
	metricBytesPerToken = "infergate_epp_server_bytes_per_token"
	metricCalibrated    = "infergate_epp_server_tokenizer_calibrated"
	metricPrefixHitRate = "infergate_epp_prefix_hit_rate"
	metricIndexBlocks   = "infergate_epp_prefix_index_blocks"
)

var endpointMetrics = []string{metricBytesPerToken, metricCalibrated, metricPrefixHitRate, metricIndexBlocks}

// endpointFigures are the picker's prefix figures of one endpoint; NaN
// where it exports none.
type endpointFigures struct {
	bytesPerToken       float64
	calibrated          bool
	indexBlocks         float64
	hitIndex, hitServer float64
}

// endpointsOf sorts the picker's per-endpoint samples by sim, matching
// the endpoint label with the sims' addresses.
func endpointsOf(ss []series, sims []simInfo) []endpointFigures {
	nan := math.NaN()
	out := make([]endpointFigures, len(sims))
	at := map[string]int{}
	for i, s := range sims {
		out[i] = endpointFigures{bytesPerToken: nan, indexBlocks: nan, hitIndex: nan, hitServer: nan}
		at[s.addr] = i
	}
	for _, s := range ss {
		i, ok := at[s.labels["endpoint"]]
		if !ok {
			continue
		}
		f := &out[i]
		switch s.name {
		case metricBytesPerToken:
			f.bytesPerToken = s.value
		case metricCalibrated:
			f.calibrated = s.value == 1
		case metricIndexBlocks:
			f.indexBlocks = s.value
		case metricPrefixHitRate:
			switch s.labels["source"] {
			case "index":
				f.hitIndex = s.value
			case "server":
				f.hitServer = s.value
			}
		}
	}
	return out
}

// prefixFigures describes the picker's prefix index per sim: its blocks
// and its recent hit rate as the index expected it and as the sim counted
// it; "" when the picker exported none of them.
func prefixFigures(r *runStats) string {
	var parts []string
	exported := false
	for i, f := range r.endpoints {
		num := func(v float64, format func(float64) string) string {
			if math.IsNaN(v) {
				return "-"
			}
			exported = true
			return format(v)
		}
		blocks := num(f.indexBlocks, func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) })
		parts = append(parts, fmt.Sprintf("%s %s index blocks, hit rate index %s / server %s", r.pods[i], blocks,
			num(f.hitIndex, pctString), num(f.hitServer, pctString)))
	}
	if !exported {
		return ""
	}
	return strings.Join(parts, "; ")
}
