// Command routing replays inference workloads through the Envoy stand-in, the
// endpoint picker and simulated model servers on loopback, under several
// routing configurations, and prints one Markdown table per workload: where
// requests went, the prefix-cache hit rate each simulator measured,
// throughput, time to first token and errors.
//
// It exists to show whether cache-aware routing closes a measured gap: on
// two vLLM pods, 128 distinct 2,048-token prefixes × 8 repeats reached only
// 39–43% prefix-cache hits under every router, while splitting the prefixes
// by hand between the pods reached 77.5%, +13.6% throughput and a p99 TTFT
// of 690 ms instead of 1,584 ms. Workload (t) repeats (a) with sims whose
// tokenizer differs from the picker's 4-byte assumption; workload (h) runs
// shared prefixes on sims that differ in KV cache and speed, against an
// oracle that splits the prefixes by capacity.
//
// --replicas runs every picker configuration with several picker processes
// joined as peers behind the stand-in's round robin, one row per count;
// --failover kills one of two replicas under a steady load and starts it
// again, and prints how the hit rate and the requests fared.
//
// Every simulator, the picker and the Envoy stand-in run as separate processes
// of the infergate binary, fresh for every (workload, configuration) run so
// that caches start cold, on 127.0.0.1 with free ports; all of them are
// stopped at the end, on errors and on Ctrl-C.
package main

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/infergate/infergate/sim"
)

// defaultTimeScale is 1: simulated time runs at wall-clock speed. Measured
// on the 2-core build machine with the sims' vLLM-calibrated defaults (256
// running sequences, 8 ms per output token), 32 streams through the dev
// proxy make about 4,000 SSE events per second. When the picker also
// received every response chunk, relaying each one cost about 360 µs of CPU
// and a picker row 1.4–1.6 cores; with the picker on the response headers
// only, a row uses about 0.8. At 1 the decode rate the client measures
// equals the model's, so the sims' model and not the machine bounds
// throughput, and the whole run (all workloads × configs) takes about 8
// minutes.
const defaultTimeScale = 1

func main() {
	binary := flag.String("binary", "bin/infergate", "the infergate binary (sims and picker)")
	standIn := flag.String("envoysim", "bin/envoysim", "the envoysim binary (the Envoy stand-in)")
	workloads := flag.String("workloads", "a,b,c,d,t", "workloads to run: a (measured), b (multi-turn), c (no-sharing), d (noisy-neighbour), t (tokenizers: a under other sim tokenizers), h (heterogeneous sims), m (multi-turn on h's sims); keys or names")
	tokenizers := flag.String("tokenizers", "2,4,7,words", "the sims' tokenizers of workload t: bytes per token (2 to 8) or words")
	configs := flag.String("configs", strings.Join(defaultConfigs, ","), "routing configurations to compare (workload h adds oracle-capacity, its yardstick)")
	replicas := flag.String("replicas", "1", "picker replicas each picker configuration runs with, joined as peers behind the proxy's round robin: one count or several (1,2,3), one row each")
	failover := flag.Bool("failover", false, "instead of the workloads, run the failover timeline: workload h's pool under a steady load through 2 replicas, one killed at a third and started again at two thirds")
	quick := flag.Bool("quick", false, "run workload h and the failover timeline at their small sizes (a smoke test: fewer prefixes, smaller caches, 30 s of failover)")
	scale := flag.Float64("time-scale", defaultTimeScale, "speed-up of simulated time, passed to every sim; latencies and throughput are reported in simulated time")
	seed := flag.Uint64("seed", 1, "seed of the workload generator")
	logDir := flag.String("log-dir", "", "keep the children's logs here (default: a temporary directory removed at the end)")
	repeat := flag.Int("repeat", 1, "run the workloads this many times, on fresh processes each time, and summarise the goals over the runs")
	llmd := flag.String("llmd-sim", "", "run workload h's servers on this llm-d-inference-sim binary instead of infergate sim (with --workloads h, at --time-scale 1; built outside the repository, see llmdsim.go)")
	flag.Parse()
	// The driver shares 2 cores with everything it measures; collect
	// garbage less often.
	debug.SetGCPercent(400)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	o := options{workloads: *workloads, configs: *configs, tokenizers: *tokenizers, replicas: *replicas, scale: *scale, seed: *seed,
		logDir: *logDir, repeat: *repeat, failover: *failover, quick: *quick, llmdSim: *llmd}
	if err := run(ctx, *binary, *standIn, o); err != nil {
		fmt.Fprintln(os.Stderr, "routing:", err)
		stop()
		cancel()
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	workloads, configs, tokenizers, replicas string
	scale                                    float64
	seed                                     uint64
	logDir                                   string
	repeat                                   int
	failover, quick                          bool
	llmdSim                                  string // --llmd-sim
}

func run(ctx context.Context, binary, standIn string, o options) error {
	scale, seed, repeat := o.scale, o.seed, o.repeat
	if !(scale > 0) {
		return fmt.Errorf("--time-scale %g: want a positive number", scale)
	}
	if repeat < 1 {
		return fmt.Errorf("--repeat %d: want at least 1", repeat)
	}
	if o.failover && scale != 1 {
		// Its windows are wall-clock minutes and seconds, and the health
		// checks that take a replica out and bring it back run in wall
		// time too.
		return fmt.Errorf("--failover runs at --time-scale 1, not %g", scale)
	}
	for _, b := range []string{binary, standIn} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s: %w (make build)", b, err)
		}
	}
	keys, err := parseWorkloads(o.workloads)
	if err != nil {
		return err
	}
	cfgs, err := parseConfigs(o.configs)
	if err != nil {
		return err
	}
	toks, err := parseTokenizers(o.tokenizers)
	if err != nil {
		return err
	}
	reps, err := parseReplicas(o.replicas)
	if err != nil {
		return err
	}
	var llmd *llmdSim
	if o.llmdSim != "" {
		if llmd, err = newLLMDSim(o.llmdSim, o, keys); err != nil {
			return err
		}
	}
	logDir := o.logDir
	dir := logDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "infergate-routing"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// Run copies, so that a rebuild of the binaries during the run does
	// not mix versions between runs.
	snapshot, standInSnapshot := filepath.Join(dir, "infergate"), filepath.Join(dir, "envoysim")
	for src, dst := range map[string]string{binary: snapshot, standIn: standInSnapshot} {
		if err := copyFile(src, dst); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	e := &env{binary: snapshot, standIn: standInSnapshot, scale: scale, dir: dir, model: readSimModel(snapshot), goals: goals{}, tokenizers: toks,
		replicas: reps, quick: o.quick, llmd: llmd}

	began := time.Now()
	version, _ := exec.Command(snapshot, "version").Output()
	fmt.Printf("# Routing benchmark\n\n")
	fmt.Printf("command: `go run ./bench/routing %s`\n\n", strings.Join(os.Args[1:], " "))
	fmt.Printf("binary: %s (%s), %d CPUs, seed %d\n\n", binary, strings.TrimSpace(string(version)), runtime.NumCPU(), seed)
	if scale == 1 {
		fmt.Printf("**time scale 1**: the simulators run in real time, so simulated time is wall-clock time and every figure below is as the client measured it.\n\n")
	} else {
		fmt.Printf("**time scale %g**: the simulators run %g× faster than real time. Every latency and throughput below is in simulated time: wall-clock figures measured by the client multiplied (durations) or divided (rates) by %g.\n\n", scale, scale, scale)
	}
	if e.model.known {
		fmt.Printf("simulator model (its defaults): %d running sequences per pod, TTFT %s + %s per uncached prompt token, %s per further output token; KV cache and block size at their defaults. TTFT is measured client side with `stream: true`, to the first SSE data event.\n\n",
			e.model.maxNumSeqs, e.model.overhead, e.model.perToken, e.model.itl)
	}
	if e.llmd != nil {
		fmt.Print(e.llmd.header(e.baseModel()))
	}
	fmt.Printf("Columns: *hit rate* = `vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` read from each sim after the run; *TTFT overhead* = client-measured mean TTFT minus the mean the sims record themselves (`vllm:time_to_first_token_seconds`: their queueing plus the model's prefill), i.e. what the proxy, the picker and a busy machine add; *ITL* = the decode rate the client saw (the model's figure is %s; more means the machine could not keep up); *CPU* = cores used by all processes and the driver during the run (of %d).\n\n",
		e.model.itl, runtime.NumCPU())

	for i := range repeat {
		if repeat > 1 {
			fmt.Printf("# Run %d of %d\n\n", i+1, repeat)
		}
		if o.failover {
			err = e.failoverSection(ctx, seed)
		} else {
			err = e.runWorkloads(ctx, keys, cfgs, seed)
		}
		if err != nil {
			return err
		}
	}
	if sum := e.goals.summary(); sum != "" {
		fmt.Printf("## Goals\n\n%s\n", sum)
	}
	e.machineCheck()
	fmt.Printf("\nTotal wall time %s.\n", time.Since(began).Round(time.Second))
	return nil
}

// runWorkloads prints one table per workload; (d) and (t) one per replica
// count.
func (e *env) runWorkloads(ctx context.Context, keys, cfgs []string, seed uint64) error {
	// The capacity-weighted oracle is h's yardstick; on the other
	// workloads' equal sims it would be the oracle again.
	others := slices.DeleteFunc(slices.Clone(cfgs), func(c string) bool { return c == cfgOracleCapacity })
	for _, k := range keys {
		var err error
		switch k {
		case "a":
			err = e.sharedTable(ctx, measuredWorkload(defaultMeasured, seed), others)
		case "b":
			err = e.sharedTable(ctx, multiTurnWorkload(defaultMultiTurn, seed), others)
		case "c":
			err = e.sharedTable(ctx, noSharingWorkload(defaultNoSharing, seed), others)
		case "h":
			spec := defaultHetero
			if e.quick {
				spec = quickHetero
			}
			err = e.sharedTable(ctx, e.heteroWorkload(spec, seed), withCapacityOracle(cfgs))
		case "m":
			spec := defaultHeteroChat
			if e.quick {
				spec = quickHeteroChat
			}
			err = e.sharedTable(ctx, heteroChatWorkload(spec, seed), withCapacityOracle(cfgs))
		case "d":
			for _, n := range e.replicas {
				if err = e.noisyTable(ctx, defaultNoisy, seed, others, n); err != nil {
					break
				}
			}
		case "t":
			for _, n := range e.replicas {
				if err = e.tokenizerTable(ctx, defaultMeasured, seed, others, n); err != nil {
					break
				}
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// itlSample is one run's client-measured decode rate, for machineCheck.
type itlSample struct {
	run   string
	itl   time.Duration
	cores float64
	// model is the decode rate the sims' models give the run's tokens
	// (they differ in workload h); zero for the sims' default.
	model time.Duration
}

// machineCheck says whether the machine kept up with the sims' model: if
// the decode rate the client saw matches the model's, the simulated
// timings (and so throughput) are the model's, not the machine's.
func (e *env) machineCheck() {
	if !e.model.known || len(e.itls) == 0 {
		return
	}
	var slow []string
	worst, maxCores := 0.0, 0.0
	mixed := "" // workload h's sims differ in speed
	for _, s := range e.itls {
		model, note := cmp.Or(s.model, e.model.itl), ""
		if model != e.model.itl {
			mixed, note = ", or in workload h the mean of its sims' models over the tokens each served", "; model "+ms(model)
		}
		dev := s.itl.Seconds()/model.Seconds() - 1
		worst = max(worst, dev)
		maxCores = max(maxCores, s.cores)
		if dev > 0.05 {
			slow = append(slow, fmt.Sprintf("%s (%s%s)", s.run, ms(s.itl), note))
		}
	}
	fmt.Printf("## Machine check\n\n")
	if len(slow) == 0 {
		fmt.Printf("In every run the decode rate the client measured stayed within 5%% of the sims' model (%s per token%s; worst +%.1f%%), with at most %.2f of %d cores busy: throughput and latencies are bounded by the sims' model and the routing, not by the machine. The *TTFT overhead* column is what the proxy path and CPU contention add to TTFT.\n",
			e.model.itl, mixed, 100*worst, maxCores, runtime.NumCPU())
		return
	}
	fmt.Printf("The decode rate fell more than 5%% behind the sims' model (%s per token%s) in: %s. Those runs were bounded by the machine (other load, or too high a --time-scale), and their TTFT figures carry CPU noise; lower --time-scale or rerun on a quieter machine.\n",
		e.model.itl, mixed, strings.Join(slow, ", "))
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o700)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

var workloadNames = map[string]string{"a": "measured", "b": "multi-turn", "c": "no-sharing", "d": "noisy-neighbour", "t": "tokenizers", "h": "heterogeneous", "m": "multi-turn-heterogeneous"}

func parseWorkloads(s string) ([]string, error) {
	var keys []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		key := ""
		for k, n := range workloadNames {
			if f == k || f == n {
				key = k
			}
		}
		if key == "" {
			return nil, fmt.Errorf("--workloads: unknown workload %q (want a, b, c, d, t, h, m or measured, multi-turn, no-sharing, noisy-neighbour, tokenizers, heterogeneous, multi-turn-heterogeneous)", f)
		}
		if !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	return keys, nil
}

func parseConfigs(s string) ([]string, error) {
	var want []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(allConfigs, f) {
			return nil, fmt.Errorf("--configs: unknown configuration %q (want %s)", f, strings.Join(allConfigs, ", "))
		}
		want = append(want, f)
	}
	var out []string
	for _, c := range allConfigs { // table order
		if slices.Contains(want, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// runTimeout bounds one run: generous against the time the sims' model
// needs for the requests when every slot is busy.
func (e *env) runTimeout(reqs []request, pods, concurrency int) time.Duration {
	m := e.model
	if !m.known {
		m = simModel{maxNumSeqs: 5, overhead: 20 * time.Millisecond, perToken: 100 * time.Microsecond, itl: 20 * time.Millisecond}
	}
	var total time.Duration
	for _, r := range reqs {
		total += m.service(r.promptTokens(), 0, r.MaxTokens)
	}
	ideal := time.Duration(float64(total) / float64(min(pods*m.maxNumSeqs, concurrency)) / e.scale)
	return 2*time.Minute + 5*ideal
}

// router returns how requests reach the sims: through the Envoy stand-in, and
// for the oracles steered to the sim chosen by hand (group mod pods, or
// the capacity-weighted split; round robin without a group).
func (st *stack) router() router {
	if st.cfg != cfgOracle && st.cfg != cfgOracleCapacity {
		return func(request) target { return target{base: st.base} }
	}
	var rr atomic.Uint64
	n := len(st.sims)
	return func(r request) target {
		i := 0
		switch {
		case r.Group >= 0 && len(st.split) > 0:
			i = st.split[r.Group%len(st.split)]
		case r.Group >= 0:
			i = r.Group % n
		default:
			i = int((rr.Add(1) - 1) % uint64(n))
		}
		return target{base: st.base, steer: st.sims[i].addr}
	}
}

// runStats is one row of a table.
type runStats struct {
	cfg string
	// replicas is how many picker replicas served the row (0 without a
	// picker); label names the row: the config, and the replica count
	// where the run compares several.
	replicas      int
	label         string
	pods          []string
	perPod        []int
	hits, queries []float64
	wall          time.Duration
	t             tally
	ttft          []time.Duration // simulated, sorted, answered requests
	// prefill is each streamed request's TTFT as the sims' latency model
	// gives it (overhead + uncached tokens × per-token time, from the
	// cached tokens the response reports): what routing decides, without
	// the proxy, the picker's hop or the machine. Sorted; empty if the
	// model is unknown.
	prefill             []time.Duration
	outTokens           int
	itl                 time.Duration // simulated
	modelITL            time.Duration // the sims' models' decode rate over the tokens each served
	simTTFT             time.Duration // mean TTFT the sims recorded (simulated)
	simTTFTKnown        bool
	cores               float64
	cpuBy               string
	prefixIndex         indexSize
	prefixIndexExplored bool // the picker's metrics were read
	// decision is the picker's mean time from a complete request to its
	// answer (infergate_epp_decision_duration_seconds), wall clock; zero
	// without a picker.
	decision time.Duration
	// split of groups: the shared prefixes (request groups) answered, and
	// how many of them more than one pod served.
	split, groups int
	// Per pod: the prompt bytes of the requests it answered, and the
	// prompt tokens it counted (vllm:prompt_tokens_total) since the
	// baseline.
	promptBytes, promptTokens []float64
	// endpoints are the picker's prefix figures per pod (of its first
	// replica); nil without a picker or when its metrics could not be
	// read.
	endpoints []endpointFigures
	// affinity is what the pickers' affinity filter did, per outcome.
	affinity map[string]float64
	// peers are each replica's figures of its peers since the warm-up;
	// nil for a picker that runs alone.
	peers []peerFigures
}

// overhead is the client's mean TTFT minus the sims' own.
func (r *runStats) overhead() string {
	if !r.simTTFTKnown {
		return "-"
	}
	return ms(mean(r.ttft) - r.simTTFT)
}

func (r *runStats) hitRate() float64 {
	var h, q float64
	for i := range r.hits {
		h, q = h+r.hits[i], q+r.queries[i]
	}
	if q == 0 {
		return math.NaN()
	}
	return h / q
}

func (r *runStats) reqPerSec(scale float64) float64 {
	return float64(r.t.ok) / (r.wall.Seconds() * scale)
}

func (r *runStats) tokPerSec(scale float64) float64 {
	return float64(r.outTokens) / (r.wall.Seconds() * scale)
}

// sharedTable runs workload w under every configuration, each picker
// configuration with every replica count, and prints its table.
func (e *env) sharedTable(ctx context.Context, w *workload, cfgs []string) error {
	fmt.Printf("## (%s) %s\n\n%s.\n\n", w.key, w.name, w.describe)
	var reqs []request
	for _, s := range w.sessions {
		reqs = append(reqs, s...)
	}
	var rows []*runStats
	for _, cfg := range cfgs {
		for _, n := range e.replicasOf(cfg) {
			r, err := e.sharedRun(ctx, w, reqs, cfg, n)
			if err != nil {
				return fmt.Errorf("(%s) %s, %s: %w", w.key, w.name, e.label(cfg, n), err)
			}
			rows = append(rows, r)
		}
	}
	fmt.Print(e.sharedRows(w, rows).String())
	fmt.Println()
	for _, n := range e.replicas {
		e.sharedNotes(w, rowsAt(rows, n), n)
	}
	e.replicaNotes(w, rows)
	for _, r := range rows {
		if note := imbalance(r.perPod); note != "" {
			fmt.Printf("- %s: %s.\n", r.label, note)
		}
	}
	printPrefixIndex(rows)
	printPeers(rows)
	e.llmd.notes(rows)
	var cpuParts []string
	for _, r := range rows {
		cpuParts = append(cpuParts, fmt.Sprintf("%s (%s)", r.label, r.cpuBy))
	}
	sum := ""
	if slices.ContainsFunc(rows, func(r *runStats) bool { return r.replicas > 1 }) {
		sum = " (picker: the sum over its replicas)"
	}
	fmt.Printf("- cores by process%s: %s.\n", sum, strings.Join(cpuParts, "; "))
	for _, r := range rows {
		if r.t.errs > 0 {
			fmt.Printf("- %s: first error: %s\n", r.label, r.t.firstErr)
		}
	}
	fmt.Println()
	return nil
}

// sharedRows is the table of a shared workload; workload h's has each
// row's hit rate as a fraction of the capacity-weighted oracle's with as
// many replicas.
func (e *env) sharedRows(w *workload, rows []*runStats) *table {
	t := &table{
		header: []string{"config", "requests per pod", "hit rate per pod", "hit rate", "req/s", "output tok/s", "TTFT mean", "TTFT p99", "errors / 429", "TTFT overhead", "ITL", "CPU"},
	}
	capacity := w.servers != nil
	if capacity {
		t.header = slices.Insert(t.header, 4, "of oracle-capacity")
	}
	t.right = make([]bool, len(t.header))
	for i := 1; i < len(t.right); i++ {
		t.right[i] = true
	}
	for _, r := range rows {
		per := make([]string, len(r.perPod))
		hit := make([]string, len(r.perPod))
		for i := range r.perPod {
			per[i] = fmt.Sprint(r.perPod[i])
			h := math.NaN()
			if r.queries[i] > 0 {
				h = r.hits[i] / r.queries[i]
			}
			hit[i] = pctString(h)
		}
		cells := []string{r.label, strings.Join(per, " / "), strings.Join(hit, " / "), pctString(r.hitRate())}
		if capacity {
			// A row without a picker is measured against the oracle of
			// the fewest replicas.
			n, oracle := cmp.Or(r.replicas, e.replicas[0]), math.NaN()
			if o := rowsAt(rows, n)[cfgOracleCapacity]; o != nil {
				oracle = o.hitRate()
			}
			cells = append(cells, ratio(r.hitRate(), oracle))
		}
		t.add(append(cells, fmt.Sprintf("%.2f", r.reqPerSec(e.scale)), fmt.Sprintf("%.0f", r.tokPerSec(e.scale)),
			ms(mean(r.ttft)), ms(percentile(r.ttft, 0.99)), fmt.Sprintf("%d / %d", r.t.errs, r.t.n429),
			r.overhead(), ms(r.itl), fmt.Sprintf("%.2f", r.cores))...)
	}
	return t
}

// sharedNotes prints a workload's ratios to its yardstick among the rows
// of n replicas (and those without a picker), and records its goals.
func (e *env) sharedNotes(w *workload, byCfg map[string]*runStats, n int) {
	at := ""
	if len(e.replicas) > 1 {
		at = fmt.Sprintf("×%d: ", n)
	}
	def, oracle, load := byCfg[cfgDefault], byCfg[cfgOracle], byCfg[cfgLoadOnly]
	switch w.key {
	case "a":
		if def != nil && oracle != nil {
			fmt.Printf("- %sinfergate-default / oracle hit rate: **%s** (%s / %s); on vLLM the routers reached 0.50–0.55 of the hand split (39–43%% / 77.5%%).\n",
				at, ratio(def.hitRate(), oracle.hitRate()), pctString(def.hitRate()), pctString(oracle.hitRate()))
			dp, op := percentile(def.ttft, 0.99), percentile(oracle.ttft, 0.99)
			e.goals.record(goalHitRate.at(n), def.hitRate()/oracle.hitRate())
			e.goals.record(goalP99.at(n), dp.Seconds()/op.Seconds())
			fmt.Printf("- %sinfergate-default / oracle p99 TTFT: **%s** (%s / %s); on vLLM 2.30 (1,584 ms / 690 ms). Both pay the proxy and the picker's ext_proc hop (TTFT overhead column: %s vs %s mean; the pickers' own decisions took %s and %s of it on average).\n",
				at, ratio(dp.Seconds(), op.Seconds()), ms(dp), ms(op), def.overhead(), oracle.overhead(), us(def.decision), us(oracle.decision))
			if rr := byCfg[cfgRoundRobin]; rr != nil {
				fmt.Printf("- %sthe hop's cost: round robin, the proxy without a picker, shows %s of TTFT overhead.\n", at, rr.overhead())
			}
			if len(def.prefill) > 0 && len(oracle.prefill) > 0 {
				dm, om := percentile(def.prefill, 0.99), percentile(oracle.prefill, 0.99)
				fmt.Printf("- %sthe same p99 from the sims' latency model and each response's cached tokens (routing alone, no proxy, picker or machine): %s (%s / %s).\n",
					at, ratio(dm.Seconds(), om.Seconds()), ms(dm), ms(om))
			}
			if rnd := byCfg[cfgRandom]; rnd != nil {
				rp := percentile(rnd.ttft, 0.99)
				fmt.Printf("- %sinfergate-default / random p99 TTFT, both through the proxy and the picker: %s (%s / %s).\n", at, ratio(dp.Seconds(), rp.Seconds()), ms(dp), ms(rp))
			}
			fmt.Printf("- %sinfergate-default / oracle throughput: %s (req/s); on vLLM the hand split gave +13.6%% (0.88).\n",
				at, ratio(def.reqPerSec(e.scale), oracle.reqPerSec(e.scale)))
		} else {
			fmt.Println("- ratios to the oracle need both infergate-default and oracle in --configs.")
		}
	case "b":
		if def != nil && oracle != nil {
			e.goals.record(goalMultiTurn.at(n), def.hitRate()/oracle.hitRate())
			fmt.Printf("- %sinfergate-default / oracle hit rate: **%s** (%s / %s).\n", at, ratio(def.hitRate(), oracle.hitRate()), pctString(def.hitRate()), pctString(oracle.hitRate()))
		} else {
			fmt.Println("- the hit-rate ratio needs both infergate-default and oracle in --configs.")
		}
	case "c":
		if def != nil && load != nil {
			e.goals.record(goalNoSharing.at(n), def.reqPerSec(e.scale)/load.reqPerSec(e.scale))
			fmt.Printf("- %sinfergate-default / load-only throughput: **%s** req/s, %s output tok/s (%.2f / %.2f req/s).\n",
				at, ratio(def.reqPerSec(e.scale), load.reqPerSec(e.scale)), ratio(def.tokPerSec(e.scale), load.tokPerSec(e.scale)),
				def.reqPerSec(e.scale), load.reqPerSec(e.scale))
		} else {
			fmt.Println("- the throughput ratio needs both infergate-default and load-only in --configs.")
		}
	case "h":
		e.heteroNotes(byCfg, at, n, goalHetero)
	case "m":
		e.heteroNotes(byCfg, at, n, goalHeteroChat)
	}
}

func printPrefixIndex(rows []*runStats) {
	var bytesParts, blockParts []string
	read := false
	for _, r := range rows {
		if !r.prefixIndexExplored {
			continue
		}
		read = true
		if r.prefixIndex.bytes != "" {
			bytesParts = append(bytesParts, r.label+" "+r.prefixIndex.bytes)
		}
		if r.prefixIndex.blocks != "" {
			blockParts = append(blockParts, r.label+" "+r.prefixIndex.blocks)
		}
	}
	// Each replica holds the whole pool's index (the peers share every
	// decision), so several are listed one by one, not summed.
	each := ""
	if slices.ContainsFunc(rows, func(r *runStats) bool { return r.replicas > 1 }) {
		each = ", per replica"
	}
	switch {
	case !read:
	case len(bytesParts) > 0:
		fmt.Printf("- picker prefix-index memory at the end of the run%s: %s.\n", each, strings.Join(bytesParts, "; "))
	case len(blockParts) > 0:
		// The picker exports blocks; bytes per block are measured by the
		// prefix package's TestIndexMemoryIsBounded.
		fmt.Printf("- picker prefix index at the end of the run (infergate_epp_prefix_index_blocks%s): %s.\n", each, strings.Join(blockParts, "; "))
	}
}

// imbalance describes a spread where the busiest pod took more than 1.5
// times its fair share of the answered requests, or returns "".
func imbalance(perPod []int) string {
	total, busiest := 0, 0
	for _, n := range perPod {
		total += n
		busiest = max(busiest, n)
	}
	if total == 0 || len(perPod) < 2 {
		return ""
	}
	share, fair := float64(busiest)/float64(total), 1/float64(len(perPod))
	if share <= 1.5*fair {
		return ""
	}
	return fmt.Sprintf("the busiest pod took %.0f%% of the requests (fair share %.0f%%)", 100*share, 100*fair)
}

// sharedRun is one (workload, config, replicas) run of workloads a to c,
// h and t.
func (e *env) sharedRun(ctx context.Context, w *workload, reqs []request, cfg string, replicas int) (*runStats, error) {
	ctx, cancel := context.WithTimeout(ctx, e.runTimeout(reqs, w.pods, w.concurrency))
	defer cancel()
	st, c, stop, err := e.startWarm(ctx, stackSpec{cfg: cfg, replicas: replicas, tok: w.tok, servers: w.serverList(), groups: w.groups,
		name: replicaRunName(w.runName(cfg), cfg, replicas)}, w.concurrency)
	defer stop()
	if err != nil {
		return nil, err
	}
	cpu0 := st.cpu()
	results, wall := c.runSessions(ctx, w.sessions, w.concurrency, e.ramp(reqs), st.router())
	cores, cpuBy := st.cpu().cores(cpu0, wall)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("run cut short after %s: %w", wall.Round(time.Millisecond), err)
	}
	r, err := e.collect(ctx, st, results, wall)
	if err != nil {
		return nil, err
	}
	r.cores, r.cpuBy = cores, cpuBy
	label := "(" + w.key + ")"
	if w.tok != (tokenizer{}) {
		label += " " + w.tok.String()
	}
	e.itls = append(e.itls, itlSample{label + " " + r.label, r.itl, cores, r.modelITL})
	fmt.Fprintf(os.Stderr, "%s %-17s %d requests in %s wall, hit rate %s, cores: %s, load average %s\n", label, r.label, len(results), wall.Round(time.Millisecond), pctString(r.hitRate()), cpuBy, loadAverage())
	return r, nil
}

// ramp is how long the clients take to start (see runSessions): the mean
// time the sims' model gives one of reqs, uncached, in wall clock; zero
// when the model is unknown.
func (e *env) ramp(reqs []request) time.Duration {
	if !e.model.known || len(reqs) == 0 {
		return 0
	}
	var total time.Duration
	for _, r := range reqs {
		total += e.model.service(r.promptTokens(), 0, r.MaxTokens)
	}
	return time.Duration(float64(total) / float64(len(reqs)) / e.scale)
}

// startWarm starts a stack and a client of concurrency connections and
// warms them up with as many requests in flight (warmUp); stop ends both,
// also after an error.
func (e *env) startWarm(ctx context.Context, spec stackSpec, concurrency int) (st *stack, c *client, stop func(), err error) {
	st, err = e.startStack(ctx, spec)
	c = newClient(sim.DefaultModel, concurrency, 5*time.Minute)
	e.llmd.wrap(c)
	stop = func() {
		c.close()
		if st != nil {
			st.procs.stop()
		}
	}
	if err == nil {
		err = e.warmUp(ctx, st, c, concurrency)
	}
	return st, c, stop, err
}

// warmUp readies a fresh stack for measuring (see client.warmUp) and marks
// the counters the run's figures start from.
func (e *env) warmUp(ctx context.Context, st *stack, c *client, inFlight int) error {
	if err := c.warmUp(ctx, st.router(), st.tok, inFlight, 2); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	return st.markBaseline(ctx)
}

// collect turns results and the sims' counters into a row.
func (e *env) collect(ctx context.Context, st *stack, results []result, wall time.Duration) (*runStats, error) {
	r := &runStats{cfg: st.cfg, replicas: len(st.pickers), label: e.label(st.cfg, len(st.pickers)), wall: wall, t: count(results)}
	var ttftSum, ttftCount float64
	idx := map[string]int{}
	for i, s := range st.sims {
		r.pods = append(r.pods, s.name)
		idx[s.name] = i
		m, err := simCounters(ctx, s)
		if err != nil {
			return nil, err
		}
		if st.simBase != nil {
			for k, v := range st.simBase[i] {
				m[k] -= v
			}
		}
		ttftSum += m["vllm:time_to_first_token_seconds_sum"]
		ttftCount += m["vllm:time_to_first_token_seconds_count"]
		r.hits = append(r.hits, m["vllm:prefix_cache_hits_total"])
		r.queries = append(r.queries, m["vllm:prefix_cache_queries_total"])
		r.promptTokens = append(r.promptTokens, m["vllm:prompt_tokens_total"])
	}
	r.perPod = make([]int, len(st.sims))
	r.promptBytes = make([]float64, len(st.sims))
	r.split, r.groups = splitGroups(results)
	var decode, modelDecode time.Duration
	gaps := 0
	for _, res := range results {
		if !res.ok() {
			continue
		}
		// The model of the sim that answered: in workload h they differ.
		m := e.model
		if i, ok := idx[res.pod]; ok {
			r.perPod[i]++
			r.promptBytes[i] += float64(res.promptBytes)
			m = st.sims[i].model
		}
		r.outTokens += res.completion
		if !res.streamed {
			continue
		}
		r.ttft = append(r.ttft, e.sim(res.ttft))
		if m.known && res.prompt > 0 {
			r.prefill = append(r.prefill, m.overhead+time.Duration(res.prompt-res.cached)*m.perToken)
		}
		if res.completion > 1 {
			decode += res.decode
			modelDecode += time.Duration(res.completion-1) * m.itl
			gaps += res.completion - 1
		}
	}
	slices.Sort(r.ttft)
	slices.Sort(r.prefill)

	if gaps > 0 {
		r.itl = e.sim(decode / time.Duration(gaps))
		r.modelITL = modelDecode / time.Duration(gaps)
	}
	// The sims count every request that reached its first token; compare
	// only when that is every answered request.
	if ttftCount > 0 && int(ttftCount) == r.t.ok {
		r.simTTFT, r.simTTFTKnown = time.Duration(ttftSum/ttftCount*float64(time.Second)), true
	}
	if len(st.pickers) > 0 {
		st.readPickers(ctx, r)
	}
	return r, nil
}

// readPickers fills in the picker's figures of a row: the mean decision
// time over all replicas' decisions, each replica's prefix index (every
// one holds the whole pool's), the first replica's per-endpoint figures,
// and with several replicas what each says of its peers. A replica whose
// metrics cannot be read is left out.
func (st *stack) readPickers(ctx context.Context, r *runStats) {
	r.prefixIndexExplored = true
	sum, base := map[string]float64{}, map[string]float64{}
	var sizes []indexSize
	for i, rep := range st.pickers {
		b, err := getBody(ctx, "http://"+rep.metrics+"/metrics")
		if err != nil {
			continue
		}
		m, err := pickerSamples(b)
		if err != nil {
			continue
		}
		var was map[string]float64
		if st.pickerBase != nil {
			was = st.pickerBase[i]
		}
		sizes = append(sizes, prefixIndexSize(m))
		addSamples(sum, m)
		addSamples(base, was)
		if len(st.pickers) > 1 {
			r.peers = append(r.peers, peerFiguresOf(m, was))
		}
		if i == 0 {
			if series, err := promSeries(bytes.NewReader(b), endpointMetrics...); err == nil {
				r.endpoints = endpointsOf(series, st.sims)
			}
		}
	}
	r.prefixIndex = joinIndexSizes(sizes)
	r.decision = decisionMean(sum, base)
	r.affinity = affinityOf(sum, base)
}

// sim converts a wall-clock duration to simulated time.
func (e *env) sim(d time.Duration) time.Duration {
	return time.Duration(float64(d) * e.scale)
}

// The picker's decision-time counters, read before and after the measured
// requests.
const (
	decisionSum   = "infergate_epp_decision_duration_seconds_sum"
	decisionCount = "infergate_epp_decision_duration_seconds_count"
)

// simCounters reads a sim's cache and TTFT counters.
func simCounters(ctx context.Context, s simInfo) (map[string]float64, error) {
	b, err := getBody(ctx, "http://"+s.addr+"/metrics")
	if err != nil {
		return nil, fmt.Errorf("%s metrics: %w", s.name, err)
	}
	return promSamples(bytes.NewReader(b), "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
		"vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count", "vllm:prompt_tokens_total")
}

// pickerMetrics reads every sample a picker replica exports, summed per
// name, and the series of labelledMetrics per label (pickerSamples).
func pickerMetrics(ctx context.Context, metricsAddr string) (map[string]float64, error) {
	b, err := getBody(ctx, "http://"+metricsAddr+"/metrics")
	if err != nil {
		return nil, err
	}
	return pickerSamples(b)
}

// markBaseline records the counters after the warm-up, per sim and per
// replica, which collect and decisionMean subtract so that the figures are
// of the measured requests.
func (st *stack) markBaseline(ctx context.Context) error {
	st.simBase = make([]map[string]float64, len(st.sims))
	for i, s := range st.sims {
		m, err := simCounters(ctx, s)
		if err != nil {
			return err
		}
		st.simBase[i] = m
	}
	st.pickerBase = make([]map[string]float64, len(st.pickers))
	for i, r := range st.pickers {
		m, err := pickerMetrics(ctx, r.metrics)
		if err != nil {
			return fmt.Errorf("picker %s metrics: %w", r.name, err)
		}
		st.pickerBase[i] = m
	}
	return nil
}

// decisionMean is the picker's mean decision time between the samples
// base and m; zero if unknown.
func decisionMean(m, base map[string]float64) time.Duration {
	sum, n := m[decisionSum]-base[decisionSum], m[decisionCount]-base[decisionCount]
	if n <= 0 {
		return 0
	}
	return time.Duration(sum / n * float64(time.Second))
}

// indexSize is what the picker says about its prefix index.
type indexSize struct{ bytes, blocks string }

// prefixIndexSize reads the picker's prefix-index gauges from its samples,
// if it exposes any: memory from infergate_epp_prefix_index_bytes (or failing
// that any infergate_epp_ metric with "prefix" in its name ending in
// _bytes), and the indexed blocks from infergate_epp_prefix_index_blocks,
// summed over endpoints.
func prefixIndexSize(m map[string]float64) indexSize {
	var out indexSize
	const want, blocks = "infergate_epp_prefix_index_bytes", "infergate_epp_prefix_index_blocks"
	if v, ok := m[blocks]; ok {
		out.blocks = fmt.Sprintf("%.0f", v)
	}
	if v, ok := m[want]; ok {
		out.bytes = fmt.Sprintf("%s (%s)", bytesString(v), want)
		return out
	}
	var names []string
	for n := range m {
		if strings.HasPrefix(n, "infergate_epp_") && strings.Contains(n, "prefix") && strings.HasSuffix(n, "_bytes") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	if len(names) > 0 {
		out.bytes = fmt.Sprintf("%s (%s)", bytesString(m[names[0]]), names[0])
	}
	return out
}

// phase is one half of a noisy-neighbour run.
type phase struct {
	b, a   []result
	wall   time.Duration
	cores  float64
	cpuBy  string
	bTTFT  []time.Duration // simulated, sorted
	itl    time.Duration
	prefix indexSize
	read   bool
	perPod []int
	// Sampled from the sims while A flooded.
	kv, waiting float64
	peakWaiting int
}

func (e *env) noisyTable(ctx context.Context, spec noisySpec, seed uint64, cfgs []string, replicas int) error {
	fmt.Printf("## (d) noisy-neighbour%s\n\n%d pods; tenant B (objective `%s`, priority %d) streams %d requests of %d-token prompts asking for %d tokens, %d at a time; tenant A (objective `%s`, priority %d) floods with %d concurrent non-streamed requests of %d-token prompts asking for %d tokens (%d tokens of KV cache in flight, more than the pool holds), pausing after a refusal as long as its Retry-After asks (1 s (simulated) when it names none). Each config runs twice on fresh sims: B alone, then B while A floods (A starts %s (simulated) earlier and is cut when B is done). The pool file declares both objectives. The oracle sends both tenants round robin, naming the sim in the `test-epp-endpoint-selection` header through the picker, which sheds as for the other picker rows.\n\n",
		e.replicasTitle(replicas), spec.Pods, spec.BObjective, spec.BPriority, spec.BRequests, spec.BPrompt, spec.BOut, spec.BConcurrency,
		spec.AObjective, spec.APriority, spec.AConcurrency, spec.APrompt, spec.AOut, spec.AConcurrency*(spec.APrompt+spec.AOut),
		e.floodWarmup(spec).Round(10*time.Millisecond))
	type row struct {
		cfg         string
		alone, with *phase
	}
	var rows []row
	for _, cfg := range cfgs {
		alone, err := e.noisyRun(ctx, spec, seed, cfg, false, replicas)
		if err != nil {
			return fmt.Errorf("(d) noisy-neighbour, %s, B alone: %w", e.label(cfg, replicas), err)
		}
		with, err := e.noisyRun(ctx, spec, seed, cfg, true, replicas)
		if err != nil {
			return fmt.Errorf("(d) noisy-neighbour, %s, B with A: %w", e.label(cfg, replicas), err)
		}
		rows = append(rows, row{cfg, alone, with})
	}
	t := &table{
		header: []string{"config", "B TTFT p99 alone", "B TTFT p99 with A", "p99 ratio", "B TTFT mean alone → with A", "B 429 alone / with A", "A answered (rate)", "A 429", "errors", "requests per pod with A", "KV use / waiting per pod with A", "ITL with A", "CPU with A"},
		right:  []bool{false, true, true, true, true, true, true, true, true, true, true, true, true},
	}
	for _, r := range rows {
		ba, bw := count(r.alone.b), count(r.with.b)
		aw := count(r.with.a)
		pa, pw := percentile(r.alone.bTTFT, 0.99), percentile(r.with.bTTFT, 0.99)
		per := make([]string, len(r.with.perPod))
		for i, n := range r.with.perPod {
			per[i] = fmt.Sprint(n)
		}
		if r.cfg == cfgDefault {
			e.goals.record(goalNoisy.at(replicas), pw.Seconds()/pa.Seconds())
			e.goals.record(goalBNotShed.at(replicas), float64(ba.n429+bw.n429))
			e.goals.record(goalAShed.at(replicas), float64(aw.n429))
		}
		t.add(e.label(r.cfg, replicas), ms(pa), ms(pw), ratio(pw.Seconds(), pa.Seconds()),
			ms(mean(r.alone.bTTFT))+" → "+ms(mean(r.with.bTTFT)),
			fmt.Sprintf("%d / %d", ba.n429, bw.n429), fmt.Sprintf("%d (%.1f/s)", aw.ok, float64(aw.ok)/e.sim(r.with.wall).Seconds()), fmt.Sprintf("%d of %d", aw.n429, len(r.with.a)),
			fmt.Sprint(ba.errs+bw.errs+aw.errs), strings.Join(per, " / "),
			fmt.Sprintf("%s / %.1f (peak %d)", pctString(r.with.kv), r.with.waiting, r.with.peakWaiting), ms(r.with.itl), fmt.Sprintf("%.2f", r.with.cores))
	}
	fmt.Print(t.String())
	fmt.Println()
	fmt.Println("- *A answered* counts A's requests that completed while B ran (rate: per simulated second of the phase, A's head start included); *A 429* counts refusals out of all of A's finished attempts (A's requests cut when B finished are not counted); *requests per pod with A* counts both tenants; *KV use / waiting* are the sims' `vllm:kv_cache_usage_perc` and `vllm:num_requests_waiting`, polled every 100 ms (wall) while A flooded, averaged over pods and polls.")
	var idx []*runStats
	for _, r := range rows {
		if r.with.read {
			idx = append(idx, &runStats{cfg: r.cfg, label: e.label(r.cfg, replicas), replicas: replicas, prefixIndex: r.with.prefix, prefixIndexExplored: true})
		}
	}
	printPrefixIndex(idx)
	for _, r := range rows {
		for _, rs := range [][]result{r.alone.b, r.with.b, r.with.a} {
			if t := count(rs); t.errs > 0 {
				fmt.Printf("- %s: first error: %s\n", e.label(r.cfg, replicas), t.firstErr)
				break
			}
		}
	}
	fmt.Println()
	return nil
}

// floodWarmup is how long (simulated) A floods before B starts: two of A's
// requests back to back, so the sims' queues are full.
func (e *env) floodWarmup(spec noisySpec) time.Duration {
	m := e.model
	if !m.known {
		return 6 * time.Second
	}
	return 2 * m.service(spec.APrompt, 0, spec.AOut)
}

func (e *env) noisyRun(ctx context.Context, spec noisySpec, seed uint64, cfg string, withA bool, replicas int) (*phase, error) {
	bReqs := noisyB(spec, seed)
	budget := bReqs
	if withA {
		// B waits behind A's queue; allow for the whole flood in the sims.
		for i := range spec.AConcurrency * 4 {
			budget = append(budget, newFloodGen(spec, seed).request(i))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, e.runTimeout(budget, spec.Pods, spec.BConcurrency)+e.runTimeout(budget, spec.Pods, spec.AConcurrency))
	defer cancel()
	name := "d-" + cfg + "-alone"
	if withA {
		name = "d-" + cfg + "-with-a"
	}
	objectives := []objective{{spec.BObjective, spec.BPriority}, {spec.AObjective, spec.APriority}}
	st, err := e.startStack(ctx, stackSpec{cfg: cfg, replicas: replicas, servers: make([]server, spec.Pods), objectives: objectives,
		name: replicaRunName(name, cfg, replicas)})
	defer st.procs.stop()
	if err != nil {
		return nil, err
	}
	c := newClient(sim.DefaultModel, spec.AConcurrency+spec.BConcurrency, 5*time.Minute)
	defer c.close()
	// Both phases warm up alike, with as many requests at once as the
	// phase will have in flight.
	inFlight := spec.BConcurrency
	if withA {
		inFlight += spec.AConcurrency
	}
	if err := e.warmUp(ctx, st, c, inFlight); err != nil {
		return nil, err
	}
	route := st.router()
	cpu0 := st.cpu()
	start := time.Now()
	var (
		fl      *flood
		sampler *poolSampler
	)
	floodCtx, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	if withA {
		sampler = samplePool(floodCtx, st.sims, 100*time.Millisecond)
		fl = c.startFlood(floodCtx, newFloodGen(spec, seed), spec.AConcurrency, route, time.Duration(float64(time.Second)/e.scale))
		if err := sleepCtx(ctx, time.Duration(float64(e.floodWarmup(spec))/e.scale)); err != nil {
			return nil, err
		}
	}
	sessions := make([]session, len(bReqs))
	for i, r := range bReqs {
		sessions[i] = session{r}
	}
	bRes, _ := c.runSessions(ctx, sessions, spec.BConcurrency, e.ramp(bReqs), route)
	p := &phase{b: bRes}
	if fl != nil {
		stopFlood()
		p.a = fl.wait()
		p.kv, p.waiting, p.peakWaiting = sampler.means()
	}
	p.wall = time.Since(start)
	p.cores, p.cpuBy = st.cpu().cores(cpu0, p.wall)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("run cut short after %s: %w", p.wall.Round(time.Millisecond), err)
	}
	all := append(slices.Clone(p.b), p.a...)
	r, err := e.collect(ctx, st, all, p.wall)
	if err != nil {
		return nil, err
	}
	p.itl, p.perPod, p.prefix, p.read = r.itl, r.perPod, r.prefixIndex, r.prefixIndexExplored
	e.itls = append(e.itls, itlSample{"(d) " + e.label(cfg, replicas) + " " + name[len("d-"+cfg+"-"):], p.itl, p.cores, 0})
	for _, res := range p.b {
		if res.ok() {
			p.bTTFT = append(p.bTTFT, e.sim(res.ttft))
		}
	}
	slices.Sort(p.bTTFT)
	fmt.Fprintf(os.Stderr, "(d) %-17s %-7s B %d requests, A %d, in %s wall, B p99 TTFT %s, cores: %s\n", e.label(cfg, replicas), map[bool]string{false: "alone", true: "with A"}[withA],
		len(p.b), len(p.a), p.wall.Round(time.Millisecond), ms(percentile(p.bTTFT, 0.99)), p.cpuBy)
	return p, nil
}
