package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"
)

// failoverSpec is the failover run: workload h's pool and prefixes under
// a steady load through two picker replicas, one killed at a third of
// duration and started again at two thirds. h rather than (a): the quick
// test runs h, so the run it stands for is the same, and h's four pods
// make the largest index a joining replica is given.
type failoverSpec struct {
	hetero heteroSpec
	// duration is the steady load, after every prefix was sent once (so
	// that the window before the kill holds no first sends).
	duration time.Duration
	// window is the span of the hit rates before and after the kill;
	// bucket that of the windows that follow the restart.
	window, bucket time.Duration
}

var (
	defaultFailover = failoverSpec{hetero: defaultHetero, duration: 3 * time.Minute, window: time.Minute, bucket: 5 * time.Second}
	quickFailover   = failoverSpec{hetero: quickHetero, duration: 30 * time.Second, window: 10 * time.Second, bucket: 5 * time.Second}
)

// killWindow bounds the failures a kill may cause: the dead replica's
// streams in flight fail at once, and every other new stream goes to it
// (FailClose) until two failed health checks 2 s apart, each of at most
// 1 s, take it out of the stand-in's round robin.
const killWindow = 6 * time.Second

// restartWindow bounds the failures a restart may cause in the stand-in:
// its health check connects afresh and brings the replica back within one
// 2 s interval, but its ext_proc channel to the replica's address, refused
// while the replica was dead, is in gRPC's reconnect backoff (at most
// 1 s in the stand-in) and fails the streams started on it until the next
// attempt connects. Envoy opens a connection for such a stream instead.
const restartWindow = 3 * time.Second

// failBackoff is a worker's pause after a failed request, as a client
// retrying a 500 pauses; without it the workers would spin on the dead
// replica's fast failures until its check takes it out.
const failBackoff = 100 * time.Millisecond

// streamGen makes workload h's requests as an endless stream: rounds in
// which every prefix comes once, each round in an order of its own, each
// request with a unique suffix. Request i is the same whoever asks, so
// that the workers draw them concurrently.
type streamGen struct {
	prefixes                []string
	vocab                   []string
	seed                    uint64
	suffixTokens, maxTokens int
	// skip is where the stream starts: after the priming requests.
	skip int
}

func newStreamGen(s heteroSpec, seed uint64) *streamGen {
	g := newTextGen(seed ^ 0xa) // h's prefixes, as heteroWorkload makes them
	return &streamGen{prefixes: g.texts(s.Prefixes, s.PrefixTokens), vocab: g.vocab, seed: seed ^ 0xf,
		suffixTokens: s.SuffixTokens, maxTokens: s.MaxTokens}
}

func (g *streamGen) request(i int) request {
	i += g.skip
	p := len(g.prefixes)
	group := rand.New(rand.NewPCG(g.seed, uint64(i/p))).Perm(p)[i%p]
	suffix := &textGen{r: rand.New(rand.NewPCG(g.seed, uint64(i)+1<<32)), vocab: g.vocab}
	return request{Prompt: g.prefixes[group] + suffix.text(g.suffixTokens), MaxTokens: g.maxTokens, Group: group}
}

// failoverReport is what the failover run measured. Times are since the
// steady load started.
type failoverReport struct {
	spec    failoverSpec
	t0      time.Time
	results []result
	primed  int
	// kill and restart are when the replica was killed and started
	// again; ready when the new process had fresh metrics of every sim
	// and saw its peer; back when it had made its first decision (-1 if
	// it made none before the load ended).
	kill, restart, ready, back time.Duration
	// startPeers is each replica's infergate_epp_peers as the load
	// started.
	startPeers []float64
	// At the kill: what the victim and the survivor had learned from each
	// other since the warm-up. At the end: the survivor's since the
	// warm-up, the restarted replica's since it started, and the
	// decisions it made.
	victim, survivorAtKill, survivor, restarted peerFigures
	restartedDecisions                          float64
	victimName, survivorName                    string
}

// failoverSection runs the failover timeline and prints it.
func (e *env) failoverSection(ctx context.Context, seed uint64) error {
	spec := defaultFailover
	if e.quick {
		spec = quickFailover
	}
	rep, err := e.failover(ctx, spec, seed)
	if err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	e.printFailover(rep)
	return nil
}

// failover runs the timeline: start the pool and two replicas, send every
// prefix once, then the steady load, the kill and the restart.
func (e *env) failover(ctx context.Context, spec failoverSpec, seed uint64) (*failoverReport, error) {
	w := heteroWorkload(spec.hetero, seed)
	ctx, cancel := context.WithTimeout(ctx, spec.duration+5*time.Minute)
	defer cancel()
	st, c, stop, err := e.startWarm(ctx, stackSpec{cfg: cfgDefault, replicas: 2, servers: w.servers, groups: w.groups, name: "failover"}, w.concurrency)
	defer stop()
	if err != nil {
		return nil, err
	}
	rep := &failoverReport{spec: spec, victimName: st.pickers[1].name, survivorName: st.pickers[0].name}
	for _, r := range st.pickers {
		m, err := pickerMetrics(ctx, r.metrics)
		if err != nil {
			return nil, fmt.Errorf("picker %s metrics: %w", r.name, err)
		}
		rep.startPeers = append(rep.startPeers, m[metricPeers])
	}
	gen := newStreamGen(spec.hetero, seed)
	if rep.primed, err = e.prime(ctx, c, st, gen, w.concurrency); err != nil {
		return nil, err
	}
	gen.skip = rep.primed
	rep.t0 = time.Now()
	loadCtx, stopLoad := context.WithDeadline(ctx, rep.t0.Add(spec.duration))
	defer stopLoad()
	fl := c.startFlood(loadCtx, gen, w.concurrency, st.router(), failBackoff)
	if err := e.killAndRestart(loadCtx, st, rep); err != nil {
		stopLoad()
		fl.wait()
		return nil, err
	}
	<-loadCtx.Done()
	rep.results = fl.wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("run cut short: %w", err)
	}
	survivor, restarted := st.pickers[0], st.pickers[1]
	m, err := pickerMetrics(ctx, survivor.metrics)
	if err != nil {
		return nil, fmt.Errorf("picker %s metrics: %w", survivor.name, err)
	}
	rep.survivor = peerFiguresOf(m, st.pickerBase[0])
	if m, err = pickerMetrics(ctx, restarted.metrics); err != nil {
		return nil, fmt.Errorf("picker %s metrics: %w", restarted.name, err)
	}
	rep.restarted, rep.restartedDecisions = peerFiguresOf(m, nil), m[metricDecisions]
	return rep, nil
}

// prime sends every prefix once, so that the steady load's first window
// holds no first sends (they would lower the hit rate before the kill).
func (e *env) prime(ctx context.Context, c *client, st *stack, gen *streamGen, concurrency int) (int, error) {
	sessions := make([]session, len(gen.prefixes))
	reqs := make([]request, len(sessions))
	for i := range sessions {
		reqs[i] = gen.request(i)
		sessions[i] = session{reqs[i]}
	}
	results, _ := c.runSessions(ctx, sessions, concurrency, e.ramp(reqs), st.router())
	if t := count(results); t.ok != len(sessions) {
		return 0, fmt.Errorf("priming: %d of %d requests answered (first error: %s)", t.ok, len(sessions), t.firstErr)
	}
	return len(sessions), nil
}

// killAndRestart kills the second replica (SIGKILL) at a third of the
// load and starts a new process on its addresses at two thirds, joining
// the survivor; it returns once the new one has made a decision or the
// load ended.
func (e *env) killAndRestart(ctx context.Context, st *stack, rep *failoverReport) error {
	survivor, victim := st.pickers[0], st.pickers[1]
	since := func() time.Duration { return time.Since(rep.t0) }
	if err := sleepCtx(ctx, rep.spec.duration/3-since()); err != nil {
		return err
	}
	// What each had learned of the other, before the victim's figures go
	// with it.
	for _, f := range []struct {
		r   *replica
		i   int
		dst *peerFigures
	}{{victim, 1, &rep.victim}, {survivor, 0, &rep.survivorAtKill}} {
		m, err := pickerMetrics(ctx, f.r.metrics)
		if err != nil {
			return fmt.Errorf("picker %s metrics: %w", f.r.name, err)
		}
		*f.dst = peerFiguresOf(m, st.pickerBase[f.i])
	}
	// The kill's time is taken before the signal: a request the kill
	// breaks can end before the process is reaped, and would otherwise
	// count as failing before the kill (0.4 ms before it once).
	rep.kill = since()
	if err := victim.proc.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", victim.name, err)
	}
	<-victim.proc.done
	fmt.Fprintf(os.Stderr, "failover: %s killed at %s, load average %s\n", victim.name, rep.kill.Round(time.Millisecond), loadAverage())
	if err := sleepCtx(ctx, 2*rep.spec.duration/3-since()); err != nil {
		return err
	}
	victim.name += "-restarted" // its own log
	if err := e.startReplica(st, victim, []*replica{survivor}); err != nil {
		return err
	}
	rep.restart = since()
	if err := st.waitReplica(ctx, victim, 1); err != nil {
		return err
	}
	rep.ready = since()
	decided := func() bool {
		m, err := pickerMetrics(ctx, victim.metrics)
		return err == nil && m[metricDecisions] > 0
	}
	rep.back = -1
	if waitFor(ctx, victim.proc, rep.spec.duration, "make a decision", decided) == nil {
		rep.back = since()
	}
	fmt.Fprintf(os.Stderr, "failover: %s started at %s, ready at %s, first decision at %s, load average %s\n", victim.name,
		rep.restart.Round(time.Millisecond), rep.ready.Round(time.Millisecond), rep.back.Round(time.Millisecond), loadAverage())
	return nil
}

// at is when a request ended, since the load started.
func (f *failoverReport) at(r result) time.Duration { return r.end.Sub(f.t0) }

// hitRate is the pool's hit rate over the requests answered in [from,
// to): their cached prompt tokens over their prompt tokens, from each
// response's usage; and how many there were.
func (f *failoverReport) hitRate(from, to time.Duration) (float64, int) {
	var cached, prompt, n int
	for _, r := range f.results {
		if t := f.at(r); r.ok() && t >= from && t < to {
			cached, prompt, n = cached+r.cached, prompt+r.prompt, n+1
		}
	}
	if prompt == 0 {
		return math.NaN(), n
	}
	return float64(cached) / float64(prompt), n
}

// before and after are the hit rates of the windows either side of the
// kill.
func (f *failoverReport) before() (float64, int) { return f.hitRate(f.kill-f.spec.window, f.kill) }
func (f *failoverReport) after() (float64, int)  { return f.hitRate(f.kill, f.kill+f.spec.window) }

// windows are the hit rates of the buckets from the restart to the end of
// the load.
func (f *failoverReport) windows() []float64 {
	var out []float64
	for t := f.restart; t+f.spec.bucket <= f.spec.duration; t += f.spec.bucket {
		h, _ := f.hitRate(t, t+f.spec.bucket)
		out = append(out, h)
	}
	return out
}

// recovery is how long after the restart the windows are back: the
// start of the first window from which every one holds at least share of
// the hit rate before the kill (0 if none fell below); false if the last
// did not.
func (f *failoverReport) recovery(share float64) (time.Duration, bool) {
	before, _ := f.before()
	ws := f.windows()
	from := len(ws)
	for i := len(ws) - 1; i >= 0 && ws[i] >= share*before; i-- {
		from = i
	}
	if from == len(ws) {
		return 0, false
	}
	return time.Duration(from) * f.spec.bucket, true
}

// failed are the failed requests' end times, sorted.
type failed struct {
	inKill, atRestart, outside []time.Duration
}

// failures sorts the failed requests' end times by whether they fell
// within killWindow after the kill, restartWindow after the restart, or
// elsewhere.
func (f *failoverReport) failures() failed {
	var out failed
	for _, r := range f.results {
		if r.ok() {
			continue
		}
		switch t := f.at(r); {
		case t >= f.kill && t <= f.kill+killWindow:
			out.inKill = append(out.inKill, t)
		case t >= f.restart && t <= f.restart+restartWindow:
			out.atRestart = append(out.atRestart, t)
		default:
			out.outside = append(out.outside, t)
		}
	}
	for _, ts := range [][]time.Duration{out.inKill, out.atRestart, out.outside} {
		slices.Sort(ts)
	}
	return out
}

// printFailover prints the timeline and the figures, and records the
// goals.
func (e *env) printFailover(f *failoverReport) {
	s := f.spec
	fmt.Printf("## Failover\n\nWorkload h's pool and prefixes (%d sims, %d prefixes of %d tokens + a unique %d-token suffix, max_tokens %d), infergate-default with 2 replicas behind the stand-in's round robin (FailClose; a gRPC health check every 2 s, 2 failures take a replica out, 1 success brings it back). Every prefix is sent once first (%d requests); then %d workers send the prefixes in rounds of random order for %s: at a third %s is killed (SIGKILL), at two thirds a new process starts on its addresses (ext_proc, metrics, peers) and joins %s. A worker pauses %s after a failed request. A window's hit rate is the cached prompt tokens over the prompt tokens of the requests that completed in it, from each response's usage.\n\n",
		len(s.hetero.Servers), s.hetero.Prefixes, s.hetero.PrefixTokens, s.hetero.SuffixTokens, s.hetero.MaxTokens, f.primed,
		s.hetero.Concurrency, s.duration, f.victimName, f.survivorName, failBackoff)
	fails := f.failures()
	inKill := fails.inKill
	t := &table{header: []string{"t", "event"}, right: []bool{true, false}}
	t.add("0 s", fmt.Sprintf("steady load starts; peers seen by each replica: %s", floats(f.startPeers)))
	t.add(secs(f.kill), f.victimName+" killed")
	if len(inKill) > 0 {
		t.add(secs(inKill[0])+"–"+secs(inKill[len(inKill)-1]), fmt.Sprintf("%d requests failed (+%s to +%s after the kill)", len(inKill),
			secs(inKill[0]-f.kill), secs(inKill[len(inKill)-1]-f.kill)))
	}
	t.add(secs(f.restart), fmt.Sprintf("%s started again on its addresses, joining %s", f.victimName, f.survivorName))
	t.add(secs(f.ready), fmt.Sprintf("it has fresh metrics of the %d sims and sees its peer", len(s.hetero.Servers)))
	if f.back >= 0 {
		t.add(secs(f.back), "its first decision: the stand-in's health check has brought it back")
	}
	if n := len(fails.atRestart); n > 0 {
		t.add(secs(fails.atRestart[0])+"–"+secs(fails.atRestart[n-1]), fmt.Sprintf("%d requests failed at the restart (the stand-in's ext_proc channel still in reconnect backoff)", n))
	}
	t.add(secs(s.duration), "load ends")
	fmt.Print(t.String())
	fmt.Println()

	before, nb := f.before()
	after, na := f.after()
	back, recovered := f.recovery(0.95)
	e.goals.record(goalFailoverHit, after/before)
	backFig, backGoal := "never", math.Inf(1)
	if recovered {
		backFig, backGoal = fmt.Sprintf("%.0f", back.Seconds()), back.Seconds()
	}
	e.goals.record(goalFailoverBack, backGoal)
	ws := f.windows()
	wsText := make([]string, len(ws))
	for i, w := range ws {
		wsText[i] = pctString(w)
	}
	ft := &table{header: []string{"figure", "value", "goal"}, right: []bool{false, true, false}}
	ft.add(fmt.Sprintf("hit rate, the %s before the kill", s.window), fmt.Sprintf("%s (%d requests)", pctString(before), nb), "")
	ft.add(fmt.Sprintf("hit rate, the %s after the kill", s.window), fmt.Sprintf("%s (%d requests)", pctString(after), na), "")
	ft.add("after / before", "**"+ratio(after, before)+"**", metString(goalFailoverHit, after/before))
	ft.add(fmt.Sprintf("hit rate of the %s windows from the restart", s.bucket), strings.Join(wsText, ", "), "")
	ft.add("seconds from the restart until every window holds ≥ 0.95 of before", "**"+backFig+"**", metString(goalFailoverBack, backGoal))
	ft.add("failed requests", fmt.Sprintf("%d within %s of the kill, %d within %s of the restart%s, %d elsewhere%s", len(inKill), killWindow,
		len(fails.atRestart), restartWindow, timesString(fails.atRestart), len(fails.outside), timesString(fails.outside)), "")
	ft.add(f.victimName+": peer state merges ok", fmt.Sprintf("%.0f", f.restarted.mergesOK), "")
	ft.add(f.victimName+": decisions learned from its peer / made", fmt.Sprintf("%.0f / %.0f", f.restarted.received, f.restartedDecisions), "")
	ft.add("decisions learned before the kill, "+f.victimName+" / "+f.survivorName, fmt.Sprintf("%.0f / %.0f", f.victim.received, f.survivorAtKill.received), "")
	for _, p := range []struct {
		name string
		f    peerFigures
	}{{f.survivorName + " (whole run)", f.survivor}, {f.victimName, f.restarted}} {
		ft.add(p.name+": index differed / mean lag / dropped", fmt.Sprintf("%.0f of %.0f / %s / %s", p.f.differed, p.f.agreed+p.f.differed, ms(p.f.lag), p.f.droppedString()), "")
	}
	fmt.Print(ft.String())
	fmt.Println()
}

// metString says whether figure v meets g.
func metString(g goal, v float64) string {
	op := "≥"
	if g.atMost {
		op = "≤"
	}
	verdict := "not met"
	if g.met(v) {
		verdict = "met"
	}
	return fmt.Sprintf("%s %g: %s", op, g.limit, verdict)
}

// secs formats a time of the failover run in seconds.
func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

func floats(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%g", x)
	}
	return strings.Join(parts, " / ")
}

// timesString lists up to five times, for failures outside the kill
// window.
func timesString(ts []time.Duration) string {
	if len(ts) == 0 {
		return ""
	}
	var parts []string
	for _, t := range ts[:min(len(ts), 5)] {
		parts = append(parts, secs(t))
	}
	return " (at " + strings.Join(parts, ", ") + ")"
}
