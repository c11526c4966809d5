package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// goal is one of the targets, checked against a figure each run
// prints.
type goal struct {
	name   string
	limit  float64
	atMost bool // the figure must be ≤ limit (else ≥)
	count  bool // the figure is a count, printed whole
}

var (
	goalHitRate   = goal{"(a) infergate-default / oracle hit rate", 0.95, false, false}
	goalP99       = goal{"(a) infergate-default / oracle p99 TTFT", 1.15, true, false}
	goalMultiTurn = goal{"(b) infergate-default / oracle hit rate", 0.90, false, false}
	goalNoSharing = goal{"(c) infergate-default / load-only throughput", 0.97, false, false}
	goalNoisy     = goal{"(d) infergate-default: B p99 TTFT with A / alone", 1.5, true, false}
	goalBNotShed  = goal{"(d) infergate-default: B requests refused", 0, true, true}
	goalAShed     = goal{"(d) infergate-default: A requests refused", 1, false, true}
	goalOrder     = []goal{goalHitRate, goalP99, goalMultiTurn, goalNoSharing, goalNoisy, goalBNotShed, goalAShed}
)

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
			if g.met(v) {
				met++
			}
		}
		op := "≥"
		if g.atMost {
			op = "≤"
		}
		fmt.Fprintf(&b, "| %s %s %g | %s | %d of %d |\n", g.name, op, g.limit, strings.Join(figs, ", "), met, len(vs))
	}
	if b.Len() == 0 {
		return ""
	}
	return "| goal | figure per run | met |\n|---|---|---:|\n" + b.String()
}
