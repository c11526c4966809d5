package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/infergate/infergate/sim"
)

// goal is one of the targets, checked against a figure each run
// prints.
type goal struct {
	name   string
	limit  float64
	atMost bool // the figure must be ≤ limit (else ≥)
	count  bool // the figure is a count, printed whole
	pct    bool // the figure is a share, printed in per cent
}

var (
	goalHitRate   = goal{"(a) infergate-default / oracle hit rate", 0.95, false, false, false}
	goalP99       = goal{"(a) infergate-default / oracle p99 TTFT", 1.15, true, false, false}
	goalMultiTurn = goal{"(b) infergate-default / oracle hit rate", 0.90, false, false, false}
	goalNoSharing = goal{"(c) infergate-default / load-only throughput", 0.97, false, false, false}
	goalNoisy     = goal{"(d) infergate-default: B p99 TTFT with A / alone", 1.5, true, false, false}
	goalBNotShed  = goal{"(d) infergate-default: B requests refused", 0, true, true, false}
	goalAShed     = goal{"(d) infergate-default: A requests refused", 1, false, true, false}
	goalOrder     = append([]goal{goalHitRate, goalP99, goalMultiTurn, goalNoSharing, goalNoisy, goalBNotShed, goalAShed}, tokenizerGoals()...)
)

// goalTokHitRate and goalTokSplit are workload t's goals under the sims'
// tokenizer tok: prefix routing holds as well as under the picker's 4-byte
// assumption, and keeps each prefix on one pod.
func goalTokHitRate(tok tokenizer) goal {
	return goal{"(t) " + tok.String() + ": infergate-default / oracle hit rate", 0.95, false, false, false}
}

func goalTokSplit(tok tokenizer) goal {
	return goal{"(t) " + tok.String() + ": prefixes infergate-default split between pods", 0.10, true, false, true}
}

// tokenizerGoals are t's goals for every tokenizer --tokenizers accepts,
// in the summary's order.
func tokenizerGoals() []goal {
	var out []goal
	toks := []tokenizer{}
	for n := sim.MinBytesPerToken; n <= sim.MaxBytesPerToken; n++ {
		toks = append(toks, bytesTokenizer(n))
	}
	for _, t := range append(toks, wordsTokenizer) {
		out = append(out, goalTokHitRate(t), goalTokSplit(t))
	}
	return out
}

func (g goal) met(v float64) bool {
	if math.IsNaN(v) {
		return false
	}
	if g.atMost {
		return v <= g.limit
	}
	return v >= g.limit
}

// goals collects each goal's figure over repeated runs.
type goals map[goal][]float64

func (gs goals) record(g goal, v float64) { gs[g] = append(gs[g], v) }

// summary says, per goal measured, the figure of every run and how many
// met the goal.
func (gs goals) summary() string {
	var b strings.Builder
	for _, g := range goalOrder {
		vs := gs[g]
		if len(vs) == 0 {
			continue
		}
		met := 0
		figs := make([]string, len(vs))
		for i, v := range vs {
			figs[i] = strconv.FormatFloat(v, 'f', 2, 64)
			if g.count {
				figs[i] = strconv.FormatFloat(v, 'f', 0, 64)
			}
			if g.pct {
				figs[i] = pctString(v)
			}
			if g.met(v) {
				met++
			}
		}
		op := "≥"
		if g.atMost {
			op = "≤"
		}
		limit := strconv.FormatFloat(g.limit, 'g', -1, 64)
		if g.pct {
			limit = strconv.FormatFloat(100*g.limit, 'g', -1, 64) + "%"
		}
		fmt.Fprintf(&b, "| %s %s %s | %s | %d of %d |\n", g.name, op, limit, strings.Join(figs, ", "), met, len(vs))
	}
	if b.Len() == 0 {
		return ""
	}
	return "| goal | figure per run | met |\n|---|---|---:|\n" + b.String()
}
