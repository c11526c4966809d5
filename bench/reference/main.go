// Command reference measures infergate's endpoint picker and payload
// processor beside the reference implementations of the Gateway API
// Inference Extension (its endpoint picker and body-based router, built
// from module source by hack/reference.sh), with one driver
// (bench/extprocload), in the same run: rounds interleaved, the order of
// the two swapped each round, medians printed with their ratios.
//
// The pickers run as they do in a cluster: each follows the same
// InferencePool and the ready Pods it selects on a real API server (the
// test control plane), TLS on, over simulated model servers whose metrics
// they scrape. The payload processors read the same chat bodies, model
// headers only (no guardrails). The reference binaries bind every
// interface and read a kubeconfig, so the command re-runs itself in a
// network namespace of its own (unshare, as root): nothing it starts is
// reachable from outside, and its model servers listen on loopback
// addresses inside it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/bench/extprocload"
	"github.com/infergate/infergate/test/childproc"
	"github.com/infergate/infergate/test/gatewaytest"
)

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "bin/infergate", "infergate binary")
	flag.StringVar(&o.reference, "reference", "", "folder holding the reference epp and bbr binaries and their CRDs (hack/reference.sh prints it)")
	flag.StringVar(&o.what, "what", "epp,payload", "comparisons to run: epp, payload or both")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds; each measures both processors, in alternating order")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measuring time of each processor in a round")
	flag.IntVar(&o.streams, "streams", 32, "concurrent streams (closed loop: each sends its next request as soon as the last is answered)")
	flag.IntVar(&o.conns, "conns", 4, "gRPC connections the streams are spread over")
	flag.IntVar(&o.endpoints, "endpoints", 8, "simulated model servers (Pods) in the pool")
	flag.IntVar(&o.eppBodyBytes, "epp-body-bytes", 1024, "chat body size for the pickers, in one chunk")
	flag.IntVar(&o.payloadBodyBytes, "payload-body-bytes", 65536, "chat body size for the payload processors")
	flag.IntVar(&o.payloadChunkBytes, "payload-chunk-bytes", 16384, "chunk size of the payload processors' bodies")
	flag.StringVar(&o.profile, "cpu-profile", "", "write infergate's CPU profile during its first round of each comparison to this path, suffixed -epp.pprof or -payload.pprof")
	flag.StringVar(&o.trace, "trace", "", "write an execution trace of infergate during its first round of each comparison to this path, suffixed -epp.trace or -payload.trace (go tool trace reads it): what waited, and for what")
	flag.StringVar(&o.driverProfile, "driver-cpu-profile", "", "write the driver's own CPU profile during infergate's first round of each comparison to this path, suffixed as --cpu-profile")
	flag.StringVar(&o.env, "processor-env", "", "environment both processors run with, as KEY=VALUE pairs separated by spaces (e.g. GOGC=800), to see how a runtime setting changes both")
	flag.StringVar(&o.transport, "transport", "auto", "what serves ext_proc in infergate's processors (--extproc-transport): auto (the processors' default: grpc), grpc or h2")
	flag.BoolVar(&o.pin, "pin", false, "pin the driver (and the API server and model servers) to CPU 0 and the processor under load to CPU 1, so that neither takes the other's core")
	flag.Parse()
	if !gatewaytest.InNamespace() {
		var wrapper []string
		if o.pin {
			wrapper = []string{"taskset", "-c", "0"}
		}
		os.Exit(gatewaytest.Reexec([]string{"--net"}, wrapper...))
	}
	// The driver shares the two cores with the processors; collect less
	// often so that its own garbage collection disturbs them less.
	debug.SetGCPercent(400)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "reference:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	binary, reference, what, transport  string
	rounds, streams, conns              int
	duration                            time.Duration
	endpoints                           int
	eppBodyBytes                        int
	payloadBodyBytes, payloadChunkBytes int
	pin                                 bool
	profile, trace, driverProfile       string
	env                                 string
}

// pprof reports whether infergate serves pprof: a profile or trace of it
// is asked for.
func (o options) pprof() bool { return o.profile != "" || o.trace != "" }

func run(ctx context.Context, o options) error {
	if o.reference == "" {
		return errors.New("--reference: the folder hack/reference.sh prints is required")
	}
	// The API server wants an address that is not loopback to advertise.
	if err := gatewaytest.SetUpBridge(); err != nil {
		return err
	}
	var comparisons []comparison
	for _, w := range strings.Split(o.what, ",") {
		switch strings.TrimSpace(w) {
		case "epp":
			comparisons = append(comparisons, pickers)
		case "payload":
			comparisons = append(comparisons, payloadProcessors)
		default:
			return fmt.Errorf("--what: %q is neither epp nor payload", w)
		}
	}
	rig, err := startRig(ctx, o)
	if err != nil {
		return err
	}
	defer rig.stop()
	for _, c := range comparisons {
		if err := compare(ctx, rig, c, o); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}

// comparison is one pair of processors and the request they are driven
// with.
type comparison struct {
	name, key string
	// start starts the reference (which false) or infergate's processor.
	start func(r *rig, infergate bool) (*process, error)
	// request is the request both are driven with.
	request func(o options) (extprocload.Request, error)
	// goals states the targets against the measured ratios.
	goals func(ref, ours sample) []string
}

// sample is one processor's figures in one round.
type sample struct {
	rate           float64
	p50, p99, p999 time.Duration
	cpuPer1k       float64 // CPU-seconds per 1,000 answered requests
	driverPer1k    float64 // the driver's, likewise
	// The processor's read and write system calls per answered request:
	// on loopback a write carries the receiver's TCP work too, so fewer,
	// larger writes are much of what a processor can save per request.
	readsPerReq, writesPerReq float64
	rssMiB                    float64
	errors                    int64
}

func compare(ctx context.Context, r *rig, c comparison, o options) error {
	req, err := c.request(o)
	if err != nil {
		return err
	}
	procs := [2]*process{}
	for i, infergate := range []bool{false, true} {
		p, err := c.start(r, infergate)
		if err != nil {
			return err
		}
		defer p.stop()
		if err := p.waitAnswering(ctx, req); err != nil {
			return err
		}
		procs[i] = p
	}
	fmt.Printf("\n## %s: %d streams, closed loop, %d B bodies in %d chunk(s), %s per processor per round; infergate on --extproc-transport %s\n\n", c.name, o.streams, req.Size(), len(req.Chunks), o.duration, o.transport)
	fmt.Printf("| round | processor | requests/s | p50 | p99 | p999 | errors | CPU-s / 1,000 | driver CPU-s / 1,000 (serving the simulators' metrics included) | reads, writes / request | RSS |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var samples [2][]sample
	for round := range o.rounds {
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			// The other processor is stopped meanwhile (SIGSTOP), so that
			// its scrapes and upkeep take no CPU from the one measured.
			if err := procs[1-i].pause(); err != nil {
				return err
			}
			if err := procs[i].resume(); err != nil {
				return err
			}
			var profiles []capture
			var driverProfile string
			if round == 0 && i == 1 {
				if o.profile != "" {
					profiles = append(profiles, capture{"profile", o.profile + "-" + c.key + ".pprof"})
				}
				if o.trace != "" {
					profiles = append(profiles, capture{"trace", o.trace + "-" + c.key + ".trace"})
				}
				if o.driverProfile != "" {
					driverProfile = o.driverProfile + "-" + c.key + ".pprof"
				}
			}
			s, err := measure(ctx, procs[i], req, o, profiles, driverProfile)
			if err != nil {
				return fmt.Errorf("%s: %w", procs[i].name, err)
			}
			samples[i] = append(samples[i], s)
			fmt.Printf("| %d | %s | %.0f | %s | %s | %s | %d | %.3f | %.3f | %.2f, %.2f | %.0f MiB |\n", round+1, procs[i].name, s.rate,
				ms(s.p50), ms(s.p99), ms(s.p999), s.errors, s.cpuPer1k, s.driverPer1k, s.readsPerReq, s.writesPerReq, s.rssMiB)
		}
	}
	ref, ours := median(samples[0]), median(samples[1])
	fmt.Printf("\nMedians of %d rounds:\n\n| processor | requests/s | p50 | p99 | p999 | CPU-s / 1,000 | reads, writes / request | RSS |\n|---|---:|---:|---:|---:|---:|---:|---:|\n", o.rounds)
	for i, m := range []sample{ref, ours} {
		fmt.Printf("| %s | %.0f | %s | %s | %s | %.3f | %.2f, %.2f | %.0f MiB |\n", procs[i].name, m.rate, ms(m.p50), ms(m.p99), ms(m.p999), m.cpuPer1k, m.readsPerReq, m.writesPerReq, m.rssMiB)
	}
	fmt.Printf("\ninfergate / reference: requests/s %.2f×, p99 %.2f×, CPU per request %.2f×, RSS %.2f×\n",
		ours.rate/ref.rate, ours.p99.Seconds()/ref.p99.Seconds(), ours.cpuPer1k/ref.cpuPer1k, ours.rssMiB/ref.rssMiB)
	// The two processors of a round ran back to back, so their ratio
	// shows how much of the spread between rounds is the machine's.
	rates, p99s := roundRatios(samples[0], samples[1])
	fmt.Printf("round by round: requests/s %s; p99 %s\n", rates, p99s)
	for _, g := range c.goals(ref, ours) {
		fmt.Println(g)
	}
	return nil
}

// capture is a profile of infergate's to take over a measured round: its
// pprof kind ("profile" for CPU, "trace") and where to write it.
type capture struct{ kind, path string }

// measure warms p up, then drives it for the round's time, taking p's
// profiles over the measured time, and with driverProfile the driver's
// own CPU profile.
func measure(ctx context.Context, p *process, req extprocload.Request, o options, profiles []capture, driverProfile string) (sample, error) {
	if _, err := extprocload.Closed(ctx, p.conns, req, o.streams, time.Second); err != nil {
		return sample{}, err
	}
	cpu0, err := p.cpu()
	if err != nil {
		return sample{}, err
	}
	self0, err := childproc.CPUTime(os.Getpid())
	if err != nil {
		return sample{}, err
	}
	reads0, writes0, err := childproc.Syscalls(p.cmd.Process.Pid)
	if err != nil {
		return sample{}, err
	}
	prof := make(chan error, len(profiles))
	for _, c := range profiles {
		go func() { prof <- extprocload.FetchProfile(ctx, p.pprofAddr, c.kind, c.path, o.duration) }()
	}
	if driverProfile != "" {
		stop, err := profileSelf(driverProfile)
		if err != nil {
			return sample{}, err
		}
		defer stop()
	}
	res, err := extprocload.Closed(ctx, p.conns, req, o.streams, o.duration)
	if err != nil {
		return sample{}, err
	}
	for range profiles {
		if err := <-prof; err != nil {
			return sample{}, err
		}
	}
	for _, c := range profiles {
		fmt.Fprintf(os.Stderr, "reference: %s's %s written to %s\n", p.name, c.kind, c.path)
	}
	cpu1, err := p.cpu()
	if err != nil {
		return sample{}, err
	}
	self1, err := childproc.CPUTime(os.Getpid())
	if err != nil {
		return sample{}, err
	}
	reads1, writes1, err := childproc.Syscalls(p.cmd.Process.Pid)
	if err != nil {
		return sample{}, err
	}
	answered := float64(max(len(res.Latencies), 1))
	rss, err := p.rss()
	if err != nil {
		return sample{}, err
	}
	return sample{
		rate: res.Rate(), p50: res.Quantile(0.5), p99: res.Quantile(0.99), p999: res.Quantile(0.999),
		cpuPer1k: (cpu1 - cpu0).Seconds() * 1000 / answered, driverPer1k: (self1 - self0).Seconds() * 1000 / answered,
		readsPerReq: float64(reads1-reads0) / answered, writesPerReq: float64(writes1-writes0) / answered,
		rssMiB: float64(rss) / (1 << 20), errors: res.Errors,
	}, nil
}

// profileSelf starts this process's CPU profile into path; stop ends it.
func profileSelf(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		fmt.Fprintf(os.Stderr, "reference: the driver's CPU profile written to %s\n", path)
	}, nil
}

// roundRatios formats infergate's requests/s and p99 over the reference's
// in each round.
func roundRatios(ref, ours []sample) (rates, p99s string) {
	var r, p []string
	for i := range min(len(ref), len(ours)) {
		r = append(r, fmt.Sprintf("%.2f×", ours[i].rate/ref[i].rate))
		p = append(p, fmt.Sprintf("%.2f×", ours[i].p99.Seconds()/ref[i].p99.Seconds()))
	}
	return strings.Join(r, ", "), strings.Join(p, ", ")
}

// median takes each figure's median over the rounds on its own.
func median(ss []sample) sample {
	pick := func(f func(sample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	dur := func(f func(sample) time.Duration) time.Duration {
		return time.Duration(pick(func(s sample) float64 { return float64(f(s)) }))
	}
	return sample{
		rate: pick(func(s sample) float64 { return s.rate }),
		p50:  dur(func(s sample) time.Duration { return s.p50 }), p99: dur(func(s sample) time.Duration { return s.p99 }),
		p999:         dur(func(s sample) time.Duration { return s.p999 }),
		cpuPer1k:     pick(func(s sample) float64 { return s.cpuPer1k }),
		driverPer1k:  pick(func(s sample) float64 { return s.driverPer1k }),
		readsPerReq:  pick(func(s sample) float64 { return s.readsPerReq }),
		writesPerReq: pick(func(s sample) float64 { return s.writesPerReq }),
		rssMiB:       pick(func(s sample) float64 { return s.rssMiB }),
		errors:       int64(pick(func(s sample) float64 { return float64(s.errors) })),
	}
}

func ms(d time.Duration) string { return strconv.FormatFloat(d.Seconds()*1000, 'f', 1, 64) + " ms" }

// met words a goal's outcome.
func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
