package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/infergate/infergate/bench/extprocload"
	"github.com/infergate/infergate/test/childproc"
)

// chartMemoryLimit is the memory limit the charts give a processor
// (charts/infergate-payload/values.yaml, resources.limits.memory).
const chartMemoryLimit = 512 << 20

// options are what a run attacks and how hard.
type options struct {
	binary     string
	processors []string
	transports []string
	attacks    []attack
	// scale multiplies every attack's count; limit bounds each attack's
	// active phase, hold how long held streams stay open after it.
	scale       float64
	limit, hold time.Duration
	// rate is the operations per second every attack offers, 0 as fast
	// as the server takes them (closed loop), ownRates each attack's own
	// rate times rateScale.
	rate, rateScale float64
	// measure is the victim's baseline window; workers its concurrent
	// requests.
	measure time.Duration
	workers int
}

// result is one attack on one processor served by one transport.
type result struct {
	attack, processor, transport string
	survived                     bool
	why                          string // why not
	// Resident memory just before the attack and its peak during it; the
	// Go heap's peak during it.
	rssBefore, rssPeak, heapPeak int64
	// The processor's CPU time during the attack, and during the victim's
	// baseline window (the victim alone).
	cpu, baseCPU time.Duration
	base, during sample // the victim's, before and during
	sent         outcome
	// forced says the processor did not stop on an interrupt within 10 s
	// once the attack was over and had to be killed.
	forced bool
}

func (r result) increase() int64 { return r.rssPeak - r.rssBefore }

// rateOf is the operations per second a offers, 0 for closed loop.
func (o options) rateOf(a attack) float64 {
	if o.rate >= 0 {
		return o.rate
	}
	return a.rate * o.rateScale
}

// attackCPU estimates the CPU the attack cost the processor: its CPU
// during the attack less what the victim's answers meanwhile cost at the
// baseline's CPU per answer (the victim runs flat out, and would
// otherwise be most of the figure).
func (r result) attackCPU() time.Duration {
	if r.base.answers == 0 {
		return r.cpu
	}
	victim := time.Duration(float64(r.baseCPU) * float64(r.during.answers) / float64(r.base.answers))
	return max(r.cpu-victim, 0)
}

// cpuPerOp is the attack's CPU per operation sent: with the same
// operations offered to both transports at the same rate, the figure that
// compares them.
func (r result) cpuPerOp() (seconds float64, ok bool) {
	if r.sent.sent <= 0 {
		return 0, false
	}
	return r.attackCPU().Seconds() / float64(r.sent.sent), true
}

// answerShare is the victim's answer rate during the attack as a share
// of its rate before.
func (r result) answerShare() float64 {
	if r.base.rate() == 0 {
		return 0
	}
	return r.during.rate() / r.base.rate()
}

// runAll runs every attack against every processor and transport, each
// on a fresh process, calling each with every result as it comes.
func runAll(ctx context.Context, o options, each func(result)) ([]result, error) {
	dir, err := os.MkdirTemp("", "h2attack")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var out []result
	for _, p := range o.processors {
		extra, stopPool, err := processorFlags(ctx, p, dir)
		if err != nil {
			return out, err
		}
		for _, a := range o.attacks {
			for _, tr := range o.transports {
				r, err := runOne(ctx, o, dir, p, tr, a, extra)
				if err != nil {
					stopPool()
					return out, fmt.Errorf("%s on %s over %s: %w", a.name, p, tr, err)
				}
				out = append(out, r)
				each(r)
			}
		}
		stopPool()
	}
	return out, nil
}

// runOne starts a processor, measures the victim alone, then attacks
// while the victim goes on and the processor's memory is sampled, and
// checks the processor's health after. An error is the harness failing
// (the processor would not start, or never answered the victim before
// the attack), not the processor failing the attack: that is in the
// result.
func runOne(ctx context.Context, o options, dir, processor, transport string, a attack, extra []string) (r result, err error) {
	r = result{attack: a.name, processor: processor, transport: transport}
	ch, err := startChild(ctx, o.binary, processor, transport, dir, extra...)
	if err != nil {
		return r, err
	}
	// Killed after 10 s: the drain of a stream the attack left open must
	// not hold the run.
	defer func() { r.forced = ch.Stop(10 * time.Second) }()
	conns, err := extprocload.Dial(ch.GRPCAddr, false, 1)
	if err != nil {
		return r, err
	}
	defer extprocload.Close(conns)
	req, err := extprocload.Chat(victimModel, 1024, 0)
	if err != nil {
		return r, err
	}
	v := victim{conn: conns[0], req: req, workers: o.workers}
	if warm := v.measureFor(ctx, 300*time.Millisecond); warm.answers == 0 {
		return r, fmt.Errorf("the victim got no answer before the attack: %w", warm.first)
	}
	cpuStart, err := ch.cpu()
	if err != nil {
		return r, err
	}
	r.base = v.measureFor(ctx, o.measure)
	if r.base.answers == 0 {
		return r, fmt.Errorf("the victim got no answer before the attack: %w", r.base.first)
	}

	pid := ch.Pid()
	if r.rssBefore, err = childproc.RSS(pid); err != nil {
		return r, err
	}
	hwmBefore, err := childproc.PeakRSS(pid)
	if err != nil {
		return r, err
	}
	peakReset := childproc.ResetPeakRSS(pid) == nil
	cpuBefore, err := ch.cpu()
	if err != nil {
		return r, err
	}
	r.baseCPU = cpuBefore - cpuStart
	sampling, stopSampling := context.WithCancel(ctx)
	rssPeak, heapPeak := sampleRSS(sampling, pid), sampleHeap(sampling, ch.MetricsAddr)

	stop := make(chan struct{})
	during := make(chan sample, 1)
	go func() { during <- v.measure(ctx, stop) }()
	start := time.Now()
	t := target{addr: ch.GRPCAddr, scale: o.scale, rate: o.rateOf(a), start: start, until: start.Add(o.limit), hold: o.hold, obs: newObserver()}
	actx, cancel := context.WithDeadline(ctx, t.until.Add(o.hold+5*time.Second))
	r.sent, err = a.run(actx, t)
	cancel() // closes whatever the attack left open
	close(stop)
	r.during = <-during
	stopSampling()
	r.rssPeak, r.heapPeak = <-rssPeak, <-heapPeak
	if err != nil {
		return r, fmt.Errorf("the attack: %w", err)
	}
	if r.sent.note != "" {
		r.sent.note += ". "
	}
	r.sent.note += "Server: " + t.obs.summary()

	cpuAfter, err := ch.cpu()
	if err != nil {
		return r, err
	}
	r.cpu = cpuAfter - cpuBefore
	// VmHWM catches a peak between two samples; without the reset it is
	// the attack's only if the attack set it.
	if hwm, err := childproc.PeakRSS(pid); err == nil && (peakReset || hwm > hwmBefore) {
		r.rssPeak = max(r.rssPeak, hwm)
	}
	r.rssPeak = max(r.rssPeak, r.rssBefore)
	r.survived, r.why = ch.healthy(ctx)
	return r, nil
}

// sampleRSS samples the process's RSS until ctx ends and then sends the
// largest seen.
func sampleRSS(ctx context.Context, pid int) <-chan int64 {
	return samplePeak(ctx, 10*time.Millisecond, func() (int64, error) { return childproc.RSS(pid) })
}

// sampleHeap samples the processor's Go heap from its metrics until ctx
// ends and then sends the largest seen; scraping costs the processor a
// little CPU, so less often than RSS.
func sampleHeap(ctx context.Context, metricsAddr string) <-chan int64 {
	client := &http.Client{Timeout: time.Second}
	return samplePeak(ctx, 200*time.Millisecond, func() (int64, error) { return heapInuse(ctx, client, metricsAddr) })
}

// samplePeak calls read every interval until ctx ends and then sends the
// largest value it returned.
func samplePeak(ctx context.Context, every time.Duration, read func() (int64, error)) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		var peak int64
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if v, err := read(); err == nil {
				peak = max(peak, v)
			}
			select {
			case <-ctx.Done():
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return out
}
