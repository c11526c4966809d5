// Command eppload measures a running endpoint picker over real ext_proc
// streams: decisions per second and decision latency at several numbers of
// concurrent streams, and the picker's CPU and memory.
//
// By default it starts `infergate epp` as a separate process (plain text,
// loopback, free ports) over a pool of in-process simulators. With
// --target it drives any picker (or any ext_proc processor that answers a
// request path) already listening there instead, so that implementations
// can be compared with the same driver; --pid names that process, for its
// CPU and memory. Either way it drives the processor the way a proxy does
// (one stream per request: headers, a ~1 KiB chat body in one chunk, read
// the answer), prints a table, and stops what it started.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/bench/extprocload"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/childproc"
)

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "bin/infergate", "infergate binary to run as the picker")
	flag.IntVar(&o.endpoints, "endpoints", 8, "simulated model servers in the pool")
	flag.StringVar(&o.levels, "streams", "1,32,256", "concurrent stream counts to measure")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "measuring time per level")
	flag.IntVar(&o.conns, "conns", 4, "gRPC connections the streams are spread over (proxies use a few)")
	flag.IntVar(&o.idle, "idle-streams", 1000, "open streams held for the memory-per-stream figure")
	flag.IntVar(&o.rate, "rate", 5000, "offered load (decisions/s) for the fixed-rate latency row; 0 skips it")
	flag.IntVar(&o.rateStreams, "rate-streams", 32, "concurrent streams available to the fixed-rate row")
	flag.StringVar(&o.profile, "cpu-profile", "", "write the picker's CPU profile during the fixed-rate row to this file")
	flag.StringVar(&o.transport, "transport", "grpc", "what serves ext_proc in the picker started (--extproc-transport): grpc or h2")
	flag.StringVar(&o.target, "target", "", "drive the ext_proc processor listening at host:port instead of starting infergate's picker")
	flag.BoolVar(&o.tls, "tls", false, "with --target: dial with TLS, accepting any certificate, as gateways reach pickers")
	flag.IntVar(&o.pid, "pid", 0, "with --target: the processor's process id (local), for CPU per decision and RSS")
	flag.StringVar(&o.model, "model", "meta-llama/Llama-3.1-8B-Instruct", "the model of the chat requests")
	flag.IntVar(&o.bodyBytes, "body-bytes", 1024, "size of the chat request body (its prompt padded), at least 300")
	flag.IntVar(&o.chunkBytes, "chunk-bytes", 0, "send the body in chunks of this size (0: one chunk), as a proxy passes what it reads")
	flag.Parse()
	// The driver shares the machine with the picker; collect less often so
	// its own garbage collection disturbs the measurement less.
	debug.SetGCPercent(400)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "eppload:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	// infergate's picker, started unless target is set.
	binary, transport string
	endpoints         int
	// What is measured.
	levels            string
	duration          time.Duration
	conns, idle       int
	rate, rateStreams int
	profile           string
	// A processor already listening (--target), and its process.
	target string
	tls    bool
	pid    int
	// The requests.
	model                 string
	bodyBytes, chunkBytes int
}

// subject is the processor under load: the connections to it, its process
// (0: unknown) and, for infergate's picker, its metrics address.
type subject struct {
	conns       []*extprocload.Conn
	pid         int
	metricsAddr string
	desc        string
}

func run(ctx context.Context, o options) error {
	var counts []int
	for _, f := range strings.Split(o.levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("--streams: %q is not a positive count", f)
		}
		counts = append(counts, n)
	}
	var (
		sub  *subject
		stop func()
		err  error
	)
	if o.target != "" {
		if o.profile != "" {
			return errors.New("--cpu-profile reads infergate's pprof endpoint: not with --target")
		}
		sub, err = dialExternal(o)
		stop = func() {}
	} else {
		if o.tls || o.pid != 0 {
			return errors.New("--tls and --pid go with --target")
		}
		sub, stop, err = startInfergate(ctx, o)
	}
	if err != nil {
		return err
	}
	defer stop()
	defer extprocload.Close(sub.conns)
	body, err := extprocload.Chat(o.model, o.bodyBytes, o.chunkBytes)
	if err != nil {
		return fmt.Errorf("--body-bytes: %w", err)
	}
	fmt.Printf("%s, %d gRPC connections, %d B request body in %d chunk(s), %s per level\n\n", sub.desc, o.conns, body.Size(), len(body.Chunks), o.duration)
	fmt.Printf("Closed loop: each stream sends its next request as soon as the last is answered (throughput at saturation).\n")
	fmt.Printf("CPU is the processor's user+system time per 1,000 decisions, RSS its resident memory after the level (with --pid, or infergate's own).\n\n")
	fmt.Printf("| streams | decisions | decisions/s | p50 | p99 | p999 | max | errors | CPU-s / 1k | RSS |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var notes []string
	for _, n := range counts {
		// Warm up connections and the processor before measuring.
		if _, err := extprocload.Closed(ctx, sub.conns, body, n, 300*time.Millisecond); err != nil {
			return err
		}
		cpu0, err := sub.cpu()
		if err != nil {
			return err
		}
		r, err := extprocload.Closed(ctx, sub.conns, body, n, o.duration)
		if err != nil {
			return err
		}
		cpu1, err := sub.cpu()
		if err != nil {
			return err
		}
		cpuCol, rssCol := "-", "-"
		if sub.pid != 0 {
			cpuCol = fmt.Sprintf("%.3f", (cpu1-cpu0).Seconds()*1000/float64(max(len(r.Latencies), 1)))
			rss, err := childproc.RSS(sub.pid)
			if err != nil {
				return err
			}
			rssCol = fmt.Sprintf("%.0f MiB", float64(rss)/(1<<20))
		}
		fmt.Printf("| %d | %d | %.0f | %s | %s | %s | %s | %d | %s | %s |\n", n, len(r.Latencies), r.Rate(),
			extprocload.Pct(r.Latencies, 0.50), extprocload.Pct(r.Latencies, 0.99), extprocload.Pct(r.Latencies, 0.999), extprocload.Pct(r.Latencies, 1), r.Errors, cpuCol, rssCol)
		if r.First != nil {
			notes = append(notes, fmt.Sprintf("%d streams: the first error was %v", n, r.First))
		}
	}
	for _, n := range notes {
		fmt.Printf("\n(%s)\n", n)
	}
	if o.rate > 0 {
		if err := openLoop(ctx, sub, body, o); err != nil {
			return err
		}
	}
	if sub.pid == 0 {
		return nil
	}
	perStream, err := memoryPerStream(ctx, sub.conns, sub.pid, o.idle)
	if err != nil {
		return err
	}
	fmt.Printf("\nmemory per open stream: %.1f KiB (RSS growth with %d idle streams open, each past its request headers)\n", perStream/1024, o.idle)
	return nil
}

// cpu is the subject's CPU time so far, 0 when its process is unknown.
func (s *subject) cpu() (time.Duration, error) {
	if s.pid == 0 {
		return 0, nil
	}
	return childproc.CPUTime(s.pid)
}

// dialExternal connects to a processor eppload did not start.
func dialExternal(o options) (*subject, error) {
	sub := &subject{pid: o.pid, desc: fmt.Sprintf("ext_proc processor at %s (process %d)", o.target, o.pid)}
	if o.pid == 0 {
		sub.desc = fmt.Sprintf("ext_proc processor at %s (no --pid: no CPU or memory figures)", o.target)
	} else if _, err := childproc.CPUTime(o.pid); err != nil {
		return nil, fmt.Errorf("--pid %d: %w", o.pid, err)
	}
	conns, err := extprocload.Dial(o.target, o.tls, o.conns)
	if err != nil {
		return nil, err
	}
	sub.conns = conns
	return sub, nil
}

// startInfergate runs `infergate epp` over o.endpoints simulators until
// stop is called.
func startInfergate(ctx context.Context, o options) (_ *subject, stop func(), err error) {
	simCtx, stopSims := context.WithCancel(ctx)
	var cleanups []func()
	stop = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	cleanups = append(cleanups, stopSims)
	pool, err := startSims(simCtx, o.endpoints)
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "eppload")
	if err != nil {
		return nil, nil, err
	}
	cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
	poolFile := filepath.Join(dir, "pool.yaml")
	if err := os.WriteFile(poolFile, []byte(pool), 0o600); err != nil {
		return nil, nil, err
	}
	var addrs [3]string
	for i := range addrs {
		if addrs[i], err = childproc.FreeAddr(); err != nil {
			return nil, nil, err
		}
	}
	grpcAddr, healthAddr, metricsAddr := addrs[0], addrs[1], addrs[2]
	_, gport, _ := net.SplitHostPort(grpcAddr)
	_, hport, _ := net.SplitHostPort(healthAddr)
	_, mport, _ := net.SplitHostPort(metricsAddr)
	cmd := exec.CommandContext(ctx, o.binary, "epp", "--pool-file", poolFile, "--secure-serving=false",
		"--grpc-bind-address", "127.0.0.1", "--grpc-port", gport,
		"--grpc-health-bind-address", "127.0.0.1", "--grpc-health-port", hport,
		"--metrics-bind-address", "127.0.0.1", "--metrics-port", mport, "--enable-pprof="+strconv.FormatBool(o.profile != ""),
		"--extproc-transport", o.transport)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w (run make build first)", o.binary, err)
	}
	cleanups = append(cleanups, func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() })
	if err := childproc.WaitReady(ctx, healthAddr, 20*time.Second); err != nil {
		return nil, nil, err
	}
	sub := &subject{pid: cmd.Process.Pid, metricsAddr: metricsAddr,
		desc: fmt.Sprintf("infergate's endpoint picker at %s, %d simulated endpoints", grpcAddr, o.endpoints)}
	if sub.conns, err = extprocload.Dial(grpcAddr, false, o.conns); err != nil {
		return nil, nil, err
	}
	return sub, stop, nil
}

// openLoop is the fixed-rate row: latency at an offered load, and, for
// infergate's picker, its CPU and its own decision histogram meanwhile.
func openLoop(ctx context.Context, sub *subject, body extprocload.Request, o options) error {
	fmt.Printf("\nOpen loop: %d decisions/s offered over up to %d concurrent streams; latency counts from the scheduled send time.\n\n", o.rate, o.rateStreams)
	fmt.Printf("| streams | decisions | decisions/s | p50 | p99 | max | errors |\n|---:|---:|---:|---:|---:|---:|---:|\n")
	var hBefore *histogram
	if sub.metricsAddr != "" {
		var err error
		if hBefore, err = decisionHistogram(ctx, sub.metricsAddr); err != nil {
			return err
		}
	}
	cpuBefore, err := sub.cpu()
	if err != nil {
		return err
	}
	var prof chan error
	if o.profile != "" {
		prof = make(chan error, 1)
		go func() { prof <- extprocload.FetchProfile(ctx, sub.metricsAddr, "profile", o.profile, o.duration) }()
	}
	r := extprocload.Paced(ctx, sub.conns, body, o.rateStreams, o.rate, o.duration)
	if prof != nil {
		if err := <-prof; err != nil {
			return err
		}
	}
	printRow(fmt.Sprintf("%d @ %d/s", o.rateStreams, o.rate), r)
	fmt.Printf("\nMeasured from the actual send of the body instead (driver wake-up delays excluded): p50 %s, p99 %s, max %s.\n",
		extprocload.Pct(r.Service, 0.5), extprocload.Pct(r.Service, 0.99), extprocload.Pct(r.Service, 1))
	if sub.pid != 0 {
		cpuAfter, err := sub.cpu()
		if err != nil {
			return err
		}
		fmt.Printf("Processor CPU during this row: %.2f cores, %s per decision (gRPC transport, scraping and GC included).\n",
			(cpuAfter-cpuBefore).Seconds()/r.Elapsed.Seconds(), ((cpuAfter - cpuBefore) / time.Duration(max(len(r.Latencies), 1))).Round(time.Microsecond))
	}
	if hBefore != nil {
		hAfter, err := decisionHistogram(ctx, sub.metricsAddr)
		if err != nil {
			return err
		}
		fmt.Printf("Inside the picker (infergate_epp_decision_duration_seconds, complete request to answer, during this row): p50 <= %s, p99 <= %s (bucket bounds)\n",
			hAfter.quantileSince(hBefore, 0.5), hAfter.quantileSince(hBefore, 0.99))
	}
	return nil
}

func startSims(ctx context.Context, n int) (string, error) {
	var sb strings.Builder
	sb.WriteString("endpoints:\n")
	for i := range n {
		s, err := sim.New(sim.Config{Name: fmt.Sprintf("sim-%d", i)})
		if err != nil {
			return "", err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		go func() { _ = s.Serve(ctx, ln) }()
		fmt.Fprintf(&sb, "- address: %s\n  name: sim-%d\n", ln.Addr(), i)
	}
	return sb.String(), nil
}

func printRow(label string, r *extprocload.Result) {
	fmt.Printf("| %s | %d | %.0f | %s | %s | %s | %d |\n", label, len(r.Latencies), r.Rate(),
		extprocload.Pct(r.Latencies, 0.50), extprocload.Pct(r.Latencies, 0.99), extprocload.Pct(r.Latencies, 1), r.Errors)
}

// memoryPerStream opens n streams that stay open past their headers (as
// during a long request body upload) and reports the picker's RSS growth
// per stream.
func memoryPerStream(ctx context.Context, conns []*extprocload.Conn, pid, n int) (float64, error) {
	before, err := childproc.RSS(pid)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := extprocload.OpenIdle(ctx, conns, n); err != nil {
		return 0, err
	}
	time.Sleep(time.Second) // let the picker accept them all
	after, err := childproc.RSS(pid)
	if err != nil {
		return 0, err
	}
	return float64(after-before) / float64(n), nil
}

// histogram is a cumulative Prometheus histogram: upper bounds and counts.
type histogram struct {
	bounds []float64
	counts []uint64
}

func decisionHistogram(ctx context.Context, metricsAddr string) (*histogram, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("picker metrics: %w", err)
	}
	defer resp.Body.Close()
	h := &histogram{}
	sc := bufio.NewScanner(resp.Body)
	const prefix = `infergate_epp_decision_duration_seconds_bucket{le="`
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		le, count, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		b, err1 := strconv.ParseFloat(le, 64)
		c, err2 := strconv.ParseUint(count, 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		h.bounds = append(h.bounds, b)
		h.counts = append(h.counts, c)
	}
	if len(h.bounds) == 0 {
		return nil, errors.New("picker metrics: no decision histogram")
	}
	return h, sc.Err()
}

// quantileSince returns the upper bound of the bucket holding quantile q of
// the observations made between before and h.
func (h *histogram) quantileSince(before *histogram, q float64) string {
	total := h.counts[len(h.counts)-1] - before.counts[len(before.counts)-1]
	if total == 0 {
		return "-"
	}
	for i, c := range h.counts {
		if float64(c-before.counts[i]) >= q*float64(total) {
			if math.IsInf(h.bounds[i], 1) {
				return "+Inf"
			}
			return time.Duration(h.bounds[i] * float64(time.Second)).String()
		}
	}
	return "+Inf"
}
