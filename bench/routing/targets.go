package main

import (
	"fmt"
	"math"
	"slices"
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
	// replicas is the picker replicas the figure was measured with, where
	// it is not one (at); a name's "×N" stands for it.
	replicas int
}

// at is the goal measured with n picker replicas: the same goal for one.
func (g goal) at(n int) goal {
	if n > 1 {
		g.replicas = n
	}
	return g
}

// single is the goal as goalOrder lists it, of whatever replica count.
func (g goal) single() goal {
	g.replicas = 0
	return g
}

// title is the goal's name with its replica count: in place of "×N" where
// the name has one, else after it.
func (g goal) title() string {
	n := max(g.replicas, 1)
	if strings.Contains(g.name, "×N") {
		return strings.ReplaceAll(g.name, "×N", "×"+strconv.Itoa(n))
	}
	if n > 1 {
		return fmt.Sprintf("%s, ×%d replicas", g.name, n)
	}
	return g.name
}

var (
	goalHitRate   = goal{"(a) infergate-default / oracle hit rate", 0.97, false, false, false, 0}
	goalP99       = goal{"(a) infergate-default / oracle p99 TTFT", 1.15, true, false, false, 0}
	goalMultiTurn = goal{"(b) infergate-default / oracle hit rate", 0.97, false, false, false, 0}
	goalNoSharing = goal{"(c) infergate-default / load-only throughput", 0.97, false, false, false, 0}
	goalNoisy     = goal{"(d) infergate-default: B p99 TTFT with A / alone", 1.5, true, false, false, 0}
	goalBNotShed  = goal{"(d) infergate-default: B requests refused", 0, true, true, false, 0}
	goalAShed     = goal{"(d) infergate-default: A requests refused", 1, false, true, false, 0}
	// Workload h and the replicas: the heterogeneous pool against its
	// capacity-weighted oracle, and N replicas against one.
	goalHetero     = goal{"(h) infergate-default / oracle-capacity hit rate", 0.95, false, false, false, 0}
	goalHeteroChat = goal{"(m) infergate-default / oracle-capacity hit rate", 0.95, false, false, false, 0}
	goalReplicaHit = goal{"(h) infergate-default ×N / ×1 hit rate", 0.97, false, false, false, 0}
	goalReplicaP99 = goal{"(h) infergate-default ×N / ×1 p99 TTFT", 1.10, true, false, false, 0}
	// The failover run: the hit rate holds through a replica's crash, and
	// the restarted replica, given the survivor's index, is routing as
	// well within 10 s.
	goalFailoverHit  = goal{"failover: hit rate the minute after the kill / the minute before", 0.95, false, false, false, 0}
	goalFailoverBack = goal{"failover: seconds from the restart until the 5 s windows hold ≥ 0.95 of the pre-kill hit rate", 10, true, false, false, 0}
	goalOrder        = append(append([]goal{goalHitRate, goalP99, goalMultiTurn, goalNoSharing, goalNoisy, goalBNotShed, goalAShed},
		tokenizerGoals()...), goalHetero, goalHeteroChat, goalReplicaHit, goalReplicaP99, goalFailoverHit, goalFailoverBack)
)

// goalTokHitRate and goalTokSplit are workload t's goals under the sims'
// tokenizer tok: prefix routing holds as well as under the picker's 4-byte
// assumption, and keeps each prefix on one pod.
func goalTokHitRate(tok tokenizer) goal {
	return goal{"(t) " + tok.String() + ": infergate-default / oracle hit rate", 0.97, false, false, false, 0}
}

func goalTokSplit(tok tokenizer) goal {
	return goal{"(t) " + tok.String() + ": prefixes infergate-default split between pods", 0.10, true, false, true, 0}
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

// summary says, per goal measured (and per replica count it was measured
// with), the figure of every run and how many met the goal.
func (gs goals) summary() string {
	var b strings.Builder
	for _, g := range gs.measured() {
		vs := gs[g]
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
		fmt.Fprintf(&b, "| %s %s %s | %s | %d of %d |\n", g.title(), op, limit, strings.Join(figs, ", "), met, len(vs))
	}
	if b.Len() == 0 {
		return ""
	}
	return "| goal | figure per run | met |\n|---|---|---:|\n" + b.String()
}

// measured lists the goals recorded, in goalOrder and, within a goal, by
// replica count.
func (gs goals) measured() []goal {
	var out []goal
	for _, g := range goalOrder {
		var at []goal
		for k := range gs {
			if k.single() == g {
				at = append(at, k)
			}
		}
		slices.SortFunc(at, func(a, b goal) int { return a.replicas - b.replicas })
		out = append(out, at...)
	}
	return out
}
