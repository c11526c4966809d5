package main

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxReplicas bounds --replicas: each replica is a process on the same
// 2 cores as everything it measures.
const maxReplicas = 5

// parseReplicas reads --replicas: picker replica counts, 1 to maxReplicas,
// in ascending order.
func parseReplicas(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > maxReplicas {
			return nil, fmt.Errorf("--replicas: %q: want a count of picker replicas, 1 to %d", f, maxReplicas)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// replicasOf are the replica counts cfg runs with: every one asked for
// with a picker, one run without.
func (e *env) replicasOf(cfg string) []int {
	if !usesPicker(cfg) {
		return []int{0}
	}
	return e.replicas
}

// several reports whether the run compares replica counts, and so names
// them in rows and titles; with --replicas 1 the output is as it always
// was.
func (e *env) several() bool { return !slices.Equal(e.replicas, []int{1}) }

// label names a row: the config, and its picker replicas (×N) when the
// run is not of one replica only; a row without a picker has none.
func (e *env) label(cfg string, replicas int) string {
	if !usesPicker(cfg) || !e.several() {
		return cfg
	}
	return fmt.Sprintf("%s ×%d", cfg, max(replicas, 1))
}

// replicasTitle is the heading's suffix of a table of one replica count.
func (e *env) replicasTitle(replicas int) string {
	if !e.several() {
		return ""
	}
	return fmt.Sprintf(", picker rows with %d replica%s", replicas, map[bool]string{true: "s"}[replicas > 1])
}

// replicaRunName is the log folder of a run with several replicas.
func replicaRunName(name, cfg string, replicas int) string {
	if !usesPicker(cfg) || replicas <= 1 {
		return name
	}
	return fmt.Sprintf("%s-x%d", name, replicas)
}

// rowsAt returns the rows of n replicas, and those without a picker, by
// config.
func rowsAt(rows []*runStats, n int) map[string]*runStats {
	out := map[string]*runStats{}
	for _, r := range rows {
		if r.replicas == n || r.replicas == 0 {
			out[r.cfg] = r
		}
	}
	return out
}

// The picker's figures of its peers (package peers, and the shared
// decisions' index agreement).
const (
	metricPeers         = "infergate_epp_peers"
	metricPeerReceived  = "infergate_epp_peer_decisions_received_total"
	metricPeerDecisions = "infergate_epp_peer_decisions_total"
	metricPeerDropped   = "infergate_epp_peer_dropped_total"
	metricPeerLag       = "infergate_epp_peer_lag_seconds"
	metricPeerMerges    = "infergate_epp_peer_state_merges_total"
	metricDecisions     = "infergate_epp_decisions_total"
	metricAffinity      = "infergate_epp_prefix_affinity_total"
)

// affinityOutcomes are the affinity filter's outcomes, in print order.
var affinityOutcomes = []string{"kept", "gave-way-queue", "gave-way-running"}

// affinityOf is what the affinity filter did over the measured requests,
// summed over the replicas (sum, less base at the warm-up's end), per
// outcome.
func affinityOf(sum, base map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, o := range affinityOutcomes {
		k := metricAffinity + `{outcome="` + o + `"}`
		out[o] = sum[k] - base[k]
	}
	return out
}

// labelledMetrics are read per label as well as summed: their
// name{label="value"} keys are as childproc.Metrics writes them.
var labelledMetrics = []string{metricPeerDecisions, metricPeerMerges, metricPeerDropped, metricAffinity}

// pickerSamples parses a replica's /metrics: every sample summed per name
// (promSamples), and the series of labelledMetrics by label.
func pickerSamples(b []byte) (map[string]float64, error) {
	m, err := promSamples(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	ss, err := promSeries(bytes.NewReader(b), labelledMetrics...)
	if err != nil {
		return nil, err
	}
	for _, s := range ss {
		m[seriesKey(s)] = s.value
	}
	return m, nil
}

// seriesKey is name{a="x",b="y"}, labels sorted.
func seriesKey(s series) string {
	if len(s.labels) == 0 {
		return s.name
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(s.labels)) {
		parts = append(parts, fmt.Sprintf("%s=%q", k, s.labels[k]))
	}
	return s.name + "{" + strings.Join(parts, ",") + "}"
}

// addSamples adds b's samples to a.
func addSamples(a, b map[string]float64) {
	for k, v := range b {
		a[k] += v
	}
}

// joinIndexSizes lists the replicas' prefix-index figures, one after the
// other: each replica holds the whole pool's index, so a sum would count
// it N times.
func joinIndexSizes(sizes []indexSize) indexSize {
	var bs, bl []string
	for _, s := range sizes {
		if s.bytes != "" {
			bs = append(bs, s.bytes)
		}
		if s.blocks != "" {
			bl = append(bl, s.blocks)
		}
	}
	return indexSize{bytes: strings.Join(bs, " / "), blocks: strings.Join(bl, " / ")}
}

// peerFigures is what one replica says of its peers: the gauge now, the
// counters since base.
type peerFigures struct {
	peers, received, agreed, differed, dropped, mergesOK float64
	lag                                                  time.Duration // mean; 0 with no batch
	// whyDropped names the reasons of the drops: "send-failed 2".
	whyDropped string
}

func peerFiguresOf(m, base map[string]float64) peerFigures {
	since := func(k string) float64 { return m[k] - base[k] }
	f := peerFigures{
		peers:    m[metricPeers],
		received: since(metricPeerReceived),
		agreed:   since(metricPeerDecisions + `{index="agreed"}`),
		differed: since(metricPeerDecisions + `{index="differed"}`),
		dropped:  since(metricPeerDropped),
		mergesOK: m[metricPeerMerges+`{result="ok"}`],
	}
	if n := since(metricPeerLag + "_count"); n > 0 {
		f.lag = time.Duration(since(metricPeerLag+"_sum") / n * float64(time.Second))
	}
	var why []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if reason, ok := strings.CutPrefix(k, metricPeerDropped+`{reason="`); ok && since(k) > 0 {
			why = append(why, fmt.Sprintf("%s %.0f", strings.TrimSuffix(reason, `"}`), since(k)))
		}
	}
	f.whyDropped = strings.Join(why, ", ")
	return f
}

// droppedString is the drops and their reasons.
func (f peerFigures) droppedString() string {
	if f.whyDropped == "" {
		return fmt.Sprintf("%.0f", f.dropped)
	}
	return fmt.Sprintf("%.0f (%s)", f.dropped, f.whyDropped)
}

// differedShare is the share of the shared decisions on which this
// replica's index held less (or more) of the prompt than the sender's.
func (f peerFigures) differedShare() float64 {
	if n := f.agreed + f.differed; n > 0 {
		return f.differed / n
	}
	return math.NaN()
}

// printPeers says, for each row with several replicas, what each replica
// learned from its peers during the measured requests: the decisions, how
// often its index disagreed with the sender's, the lag and the drops.
func printPeers(rows []*runStats) {
	for _, r := range rows {
		if len(r.peers) == 0 {
			continue
		}
		var got, differed, lag, dropped []string
		for _, p := range r.peers {
			got = append(got, fmt.Sprintf("%.0f", p.received))
			differed = append(differed, fmt.Sprintf("%.0f (%s)", p.differed, pctString(p.differedShare())))
			lag = append(lag, ms(p.lag))
			dropped = append(dropped, p.droppedString())
		}
		fmt.Printf("- %s, per replica during the measured requests: decisions learned from peers %s; index differed from the sender's on %s of them; mean peer lag %s; dropped %s.\n",
			r.label, strings.Join(got, " / "), strings.Join(differed, " / "), strings.Join(lag, " / "), strings.Join(dropped, " / "))
	}
}

// replicaNotes compares every picker config's rows of several replicas
// with its one-replica row: hit rate and p99 TTFT. Workload h records its
// goals.
func (e *env) replicaNotes(w *workload, rows []*runStats) {
	if len(e.replicas) < 2 || e.replicas[0] != 1 {
		return
	}
	for _, one := range rows {
		if one.replicas != 1 {
			continue
		}
		for _, r := range rows {
			if r.cfg != one.cfg || r.replicas < 2 {
				continue
			}
			hit := r.hitRate() / one.hitRate()
			p1, pn := percentile(one.ttft, 0.99), percentile(r.ttft, 0.99)
			if w.key == "h" && r.cfg == cfgDefault {
				e.goals.record(goalReplicaHit.at(r.replicas), hit)
				e.goals.record(goalReplicaP99.at(r.replicas), pn.Seconds()/p1.Seconds())
			}
			fmt.Printf("- %s / ×1: hit rate **%s** (%s / %s), p99 TTFT **%s** (%s / %s).\n", r.label,
				ratio(r.hitRate(), one.hitRate()), pctString(r.hitRate()), pctString(one.hitRate()),
				ratio(pn.Seconds(), p1.Seconds()), ms(pn), ms(p1))
		}
	}
}
