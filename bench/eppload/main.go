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
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

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
	binary    string
	endpoints int
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
	conns       []*grpc.ClientConn
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
	defer func() {
		for _, c := range sub.conns {
			_ = c.Close()
		}
	}()
	body, err := chatBody(o.model, o.bodyBytes, o.chunkBytes)
	if err != nil {
		return err
	}
	fmt.Printf("%s, %d gRPC connections, %d B request body in %d chunk(s), %s per level\n\n", sub.desc, o.conns, body.size(), len(body.chunks), o.duration)
	fmt.Printf("Closed loop: each stream sends its next request as soon as the last is answered (throughput at saturation).\n")
	fmt.Printf("CPU is the processor's user+system time per 1,000 decisions, RSS its resident memory after the level (with --pid, or infergate's own).\n\n")
	fmt.Printf("| streams | decisions | decisions/s | p50 | p99 | p999 | max | errors | CPU-s / 1k | RSS |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var notes []string
	for _, n := range counts {
		// Warm up connections and the processor before measuring.
		if _, err := drive(ctx, sub.conns, body, n, 300*time.Millisecond); err != nil {
			return err
		}
		cpu0, err := sub.cpu()
		if err != nil {
			return err
		}
		r, err := drive(ctx, sub.conns, body, n, o.duration)
		if err != nil {
			return err
		}
		cpu1, err := sub.cpu()
		if err != nil {
			return err
		}
		cpuCol, rssCol := "-", "-"
		if sub.pid != 0 {
			cpuCol = fmt.Sprintf("%.3f", (cpu1-cpu0).Seconds()*1000/float64(max(len(r.lat), 1)))
			rss, err := childproc.RSS(sub.pid)
			if err != nil {
				return err
			}
			rssCol = fmt.Sprintf("%.0f MiB", float64(rss)/(1<<20))
		}
		fmt.Printf("| %d | %d | %.0f | %s | %s | %s | %s | %d | %s | %s |\n", n, len(r.lat), float64(len(r.lat))/r.elapsed.Seconds(),
			pct(r.lat, 0.50), pct(r.lat, 0.99), pct(r.lat, 0.999), pct(r.lat, 1), r.errors, cpuCol, rssCol)
		if r.first != nil {
			notes = append(notes, fmt.Sprintf("%d streams: the first error was %v", n, r.first))
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
	creds := insecure.NewCredentials()
	if o.tls {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // pickers serve self-signed certificates, as gateways accept
	}
	sub := &subject{pid: o.pid, desc: fmt.Sprintf("ext_proc processor at %s (process %d)", o.target, o.pid)}
	if o.pid == 0 {
		sub.desc = fmt.Sprintf("ext_proc processor at %s (no --pid: no CPU or memory figures)", o.target)
	} else if _, err := childproc.CPUTime(o.pid); err != nil {
		return nil, fmt.Errorf("--pid %d: %w", o.pid, err)
	}
	for range o.conns {
		c, err := grpc.NewClient(o.target, grpc.WithTransportCredentials(creds))
		if err != nil {
			return nil, err
		}
		sub.conns = append(sub.conns, c)
	}
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
		"--metrics-bind-address", "127.0.0.1", "--metrics-port", mport, "--enable-pprof="+strconv.FormatBool(o.profile != ""))
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
	for range o.conns {
		c, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, err
		}
		sub.conns = append(sub.conns, c)
	}
	return sub, stop, nil
}

// openLoop is the fixed-rate row: latency at an offered load, and, for
// infergate's picker, its CPU and its own decision histogram meanwhile.
func openLoop(ctx context.Context, sub *subject, body requestBody, o options) error {
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
		go func() { prof <- fetchProfile(ctx, sub.metricsAddr, o.profile, o.duration) }()
	}
	r, err := paced(ctx, sub.conns, body, o.rateStreams, o.rate, o.duration)
	if err != nil {
		return err
	}
	if prof != nil {
		if err := <-prof; err != nil {
			return err
		}
	}
	r.print(fmt.Sprintf("%d @ %d/s", o.rateStreams, o.rate))
	fmt.Printf("\nMeasured from the actual send of the body instead (driver wake-up delays excluded): p50 %s, p99 %s, max %s.\n",
		pct(r.service, 0.5), pct(r.service, 0.99), pct(r.service, 1))
	if sub.pid != 0 {
		cpuAfter, err := sub.cpu()
		if err != nil {
			return err
		}
		fmt.Printf("Processor CPU during this row: %.2f cores, %s per decision (gRPC transport, scraping and GC included).\n",
			(cpuAfter-cpuBefore).Seconds()/r.elapsed.Seconds(), ((cpuAfter - cpuBefore) / time.Duration(max(len(r.lat), 1))).Round(time.Microsecond))
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

// requestBody is a request as the driver sends it: its headers message,
// its body's chunks, and those as the body messages, built once so that
// the driver does not build them again for every request it sends (they
// are only read, so every stream may send the same ones).
type requestBody struct {
	headers *extprocv3.ProcessingRequest
	chunks  [][]byte
	bodies  []*extprocv3.ProcessingRequest
}

func (b requestBody) size() int {
	n := 0
	for _, c := range b.chunks {
		n += len(c)
	}
	return n
}

// chatBody is a chat completion of exactly size bytes (its user message
// padded with a repeated sentence), cut into chunks of chunk bytes (0: one).
func chatBody(model string, size, chunk int) (requestBody, error) {
	const sentence = "Summarise the quarterly report in three bullet points. "
	frame := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"%%s"}],"max_tokens":64}`, model)
	pad := size - (len(frame) - 2)
	if pad < 100 {
		return requestBody{}, fmt.Errorf("--body-bytes %d: too small for a chat request for model %q", size, model)
	}
	whole := []byte(fmt.Sprintf(frame, strings.Repeat(sentence, pad/len(sentence)+1)[:pad]))
	if chunk <= 0 {
		chunk = len(whole)
	}
	out := requestBody{headers: headersMsg(len(whole))}
	for len(whole) > 0 {
		n := min(chunk, len(whole))
		out.chunks = append(out.chunks, whole[:n])
		whole = whole[n:]
		out.bodies = append(out.bodies, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: out.chunks[len(out.chunks)-1], EndOfStream: len(whole) == 0}}})
	}
	return out, nil
}

type result struct {
	lat     []time.Duration
	errors  int64
	first   error // the first error, if any
	elapsed time.Duration
	// service is, for paced runs, the latency from the actual send of the
	// body instead of its scheduled time (excludes the driver's own delays).
	service []time.Duration
}

func (r *result) print(label string) {
	fmt.Printf("| %s | %d | %.0f | %s | %s | %s | %d |\n", label, len(r.lat), float64(len(r.lat))/r.elapsed.Seconds(),
		pct(r.lat, 0.50), pct(r.lat, 0.99), pct(r.lat, 1), r.errors)
}

// paced offers rate decisions/s for dur using at most n concurrent
// streams. Latency runs from each request's scheduled time, so a stall in
// the picker shows up instead of silently lowering the offered load.
func paced(ctx context.Context, conns []*grpc.ClientConn, body requestBody, n, rate int, dur time.Duration) (*result, error) {
	total := int(float64(rate) * dur.Seconds())
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	jobs := make(chan time.Time, total)
	for i := range total {
		jobs <- start.Add(time.Duration(i) * interval)
	}
	close(jobs)
	var (
		mu           sync.Mutex
		all, service []time.Duration
		errs         atomic.Int64
		wg           sync.WaitGroup
	)
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := extprocv3.NewExternalProcessorClient(conns[w%len(conns)])
			var local, localService []time.Duration
			for at := range jobs {
				time.Sleep(time.Until(at))
				d, err := oneDecision(ctx, client, body)
				if err != nil {
					errs.Add(1)
					continue
				}
				local = append(local, time.Since(at))
				localService = append(localService, d)
			}
			mu.Lock()
			all = append(all, local...)
			service = append(service, localService...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(all)
	slices.Sort(service)
	return &result{lat: all, service: service, errors: errs.Load(), elapsed: time.Since(start)}, nil
}

// drive runs n workers, each doing one request per stream back to back,
// until dur passes.
func drive(ctx context.Context, conns []*grpc.ClientConn, body requestBody, n int, dur time.Duration) (*result, error) {
	var (
		mu    sync.Mutex
		all   []time.Duration
		first error
		errs  atomic.Int64
		wg    sync.WaitGroup
	)
	start := time.Now()
	stop := start.Add(dur)
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := extprocv3.NewExternalProcessorClient(conns[w%len(conns)])
			var local []time.Duration
			var localErr error
			for time.Now().Before(stop) {
				d, err := oneDecision(ctx, client, body)
				if err != nil {
					errs.Add(1)
					localErr = cmp.Or(localErr, err)
					continue
				}
				local = append(local, d)
			}
			mu.Lock()
			all = append(all, local...)
			first = cmp.Or(first, localErr)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(all)
	if len(all) == 0 && first != nil {
		return nil, fmt.Errorf("all %d requests failed, the first with: %w", errs.Load(), first)
	}
	return &result{lat: all, errors: errs.Load(), first: first, elapsed: time.Since(start)}, nil
}

// headersMsg is a request's headers message, with the content-length a
// client sends for a body of size bytes (none for 0), as Envoy forwards it.
func headersMsg(size int) *extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
		{Key: "content-type", RawValue: []byte("application/json")},
	}
	if size > 0 {
		hs = append(hs, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(size))})
	}
	return &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}},
	}
}

// oneDecision is one request's request path: latency is from the first
// body chunk sent to the last body chunk answered (the pick is in between;
// with the body in one chunk, as by default, from its send).
func oneDecision(ctx context.Context, client extprocv3.ExternalProcessorClient, body requestBody) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := client.Process(ctx)
	if err != nil {
		return 0, err
	}
	if err := st.Send(body.headers); err != nil {
		return 0, err
	}
	t0 := time.Now()
	for _, m := range body.bodies {
		if err := st.Send(m); err != nil {
			return 0, err
		}
	}
	picked := false
	for {
		r, err := st.Recv()
		if err != nil {
			return 0, err
		}
		if h := r.GetRequestHeaders(); h != nil {
			picked = len(h.GetResponse().GetHeaderMutation().GetSetHeaders()) > 0
		}
		if r.GetImmediateResponse() != nil {
			return 0, fmt.Errorf("immediate response %d", r.GetImmediateResponse().GetStatus().GetCode())
		}
		if sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr != nil && sr.GetEndOfStream() {
			break
		}
	}
	d := time.Since(t0)
	_ = st.CloseSend()
	if !picked {
		return 0, errors.New("no pick in the headers response")
	}
	return d, nil
}

func pct(sorted []time.Duration, p float64) string {
	if len(sorted) == 0 {
		return "-"
	}
	i := min(int(float64(len(sorted))*p), len(sorted)-1)
	return sorted[i].Round(time.Microsecond).String()
}

// memoryPerStream opens n streams that stay open past their headers (as
// during a long request body upload) and reports the picker's RSS growth
// per stream.
func memoryPerStream(ctx context.Context, conns []*grpc.ClientConn, pid, n int) (float64, error) {
	before, err := childproc.RSS(pid)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range n {
		st, err := extprocv3.NewExternalProcessorClient(conns[i%len(conns)]).Process(ctx)
		if err != nil {
			return 0, err
		}
		if err := st.Send(headersMsg(0)); err != nil {
			return 0, err
		}
	}
	time.Sleep(time.Second) // let the picker accept them all
	after, err := childproc.RSS(pid)
	if err != nil {
		return 0, err
	}
	return float64(after-before) / float64(n), nil
}

// fetchProfile saves the picker's CPU profile over d.
func fetchProfile(ctx context.Context, metricsAddr, path string, d time.Duration) error {
	secs := max(int(d.Seconds())-1, 1)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", metricsAddr, secs), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
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
