// Command stalled measures the payload processor under stalled uploads:
// many ext_proc streams that send part of a large body and then stop, as a
// hostile or broken client behind the proxy makes them. It prints the
// processor's resident memory (against the charts' 512 MiB limit), how
// many uploads were held and how many refused with 503
// processor-overloaded, and the latency of well-behaved requests before
// and while the stalled ones are held.
//
// It starts `infergate payload` as a separate process (plain text,
// loopback, free ports) with the buffer budget the charts' memory limit
// gives by default (40% of 512 MiB), once per stalled-body size, and stops
// it after. Run it with GOMEMLIMIT at 90% of 512 MiB, as the processor sets
// itself in a container with that limit (make bench-stalled does).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/infergate/infergate/test/childproc"
)

const (
	chartMemoryLimit = 512 << 20
	chunkBytes       = 64 << 10
	// budgetBytes is the processor's default budget under that limit.
	budgetBytes = chartMemoryLimit / 5 * 2
)

func main() {
	binary := flag.String("binary", "bin/infergate", "infergate binary to run as the payload processor")
	streams := flag.Int("streams", 1000, "stalled streams to open")
	sizes := flag.String("sizes", "64KiB,1MiB,15MiB", "body bytes each stalled stream sends before it stops, one run per size")
	measure := flag.Duration("measure", 2*time.Second, "time well-behaved requests are timed, before and during the stall")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := run(ctx, *binary, *streams, *sizes, *measure); err != nil {
		fmt.Fprintln(os.Stderr, "stalled:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, binary string, streams int, sizes string, measure time.Duration) error {
	fmt.Printf("payload processor, --request-buffer-budget %d MiB (40%% of the charts' 512 MiB limit), GOMEMLIMIT %q; %d stalled streams over 8 connections, %d KiB chunks\n\n",
		budgetBytes>>20, os.Getenv("GOMEMLIMIT"), streams, chunkBytes>>10)
	fmt.Println("| stalled body | held | refused 503 | RSS idle | RSS peak | RSS per held body byte | good p50 before | good p99 before | good p50 during | good p99 during | good refused during |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, f := range strings.Split(sizes, ",") {
		size, err := parseSize(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		if err := runOne(ctx, binary, streams, size, measure, f); err != nil {
			return err
		}
	}
	return nil
}

func parseSize(s string) (int, error) {
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			var v int
			if _, err := fmt.Sscan(n, &v); err != nil || v <= 0 {
				return 0, fmt.Errorf("--sizes: %q", s)
			}
			return v * u.mult, nil
		}
	}
	return 0, fmt.Errorf("--sizes: %q needs KiB or MiB", s)
}

func runOne(ctx context.Context, binary string, streams, size int, measure time.Duration, label string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir, err := os.MkdirTemp("", "stalled")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := filepath.Join(dir, "payload.yaml")
	if err := os.WriteFile(cfg, []byte("pii:\n- {name: email, detector: email, action: mask}\n"), 0o600); err != nil {
		return err
	}
	grpcAddr, err := childproc.FreeAddr()
	if err != nil {
		return err
	}
	healthAddr, err := childproc.FreeAddr()
	if err != nil {
		return err
	}
	_, gport, _ := net.SplitHostPort(grpcAddr)
	_, hport, _ := net.SplitHostPort(healthAddr)
	cmd := exec.CommandContext(ctx, binary, "payload", "--config-file", cfg, "--secure-serving=false",
		"--grpc-bind-address", "127.0.0.1", "--grpc-port", gport,
		"--grpc-health-bind-address", "127.0.0.1", "--grpc-health-port", hport, "--metrics-port", "0",
		"--request-buffer-budget", fmt.Sprint(budgetBytes))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w (run make build first)", binary, err)
	}
	defer func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }()
	if err := childproc.WaitReady(ctx, healthAddr, 20*time.Second); err != nil {
		return err
	}
	conns := make([]*grpc.ClientConn, 8)
	for i := range conns {
		if conns[i], err = grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20))); err != nil {
			return err
		}
		defer conns[i].Close()
	}
	pid := cmd.Process.Pid
	good := conns[0]
	if _, _, err := timeGood(ctx, good, 300*time.Millisecond); err != nil { // warm up
		return err
	}
	before, _, err := timeGood(ctx, good, measure)
	if err != nil {
		return err
	}
	idleRSS, err := childproc.RSS(pid)
	if err != nil {
		return err
	}

	var peak atomic.Int64
	stopSampling := sampleRSS(pid, &peak)
	defer stopSampling()

	// Open the stalled streams; each sends its part of a body and stops.
	stallCtx, release := context.WithCancel(ctx)
	defer release()
	var held, refused atomic.Int64
	var wg sync.WaitGroup
	chunk := make([]byte, chunkBytes)
	sem := make(chan struct{}, 64) // opening concurrency, not a bound on held streams
	for i := range streams {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			st, err := extprocv3.NewExternalProcessorClient(conns[i%len(conns)]).Process(stallCtx)
			if err != nil {
				return
			}
			if st.Send(headers()) != nil {
				return
			}
			answered := make(chan bool, 1)
			go func() {
				r, err := st.Recv()
				answered <- err == nil && r.GetImmediateResponse().GetStatus().GetCode() == 503
			}()
			for sent := 0; sent < size; sent += chunkBytes {
				if st.Send(body(chunk[:min(chunkBytes, size-sent)], false)) != nil {
					break
				}
				select {
				case was503 := <-answered:
					if was503 {
						refused.Add(1)
					}
					return
				default:
				}
			}
			// Give a refusal a moment to arrive; otherwise the stream is
			// held, its body open, until the run ends.
			select {
			case was503 := <-answered:
				if was503 {
					refused.Add(1)
				}
			case <-time.After(500 * time.Millisecond):
				held.Add(1)
			}
		}()
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond) // let the processor settle before timing
	during, goodRefused, err := timeGood(ctx, good, measure)
	if err != nil {
		return err
	}
	release()
	stopSampling()
	// Memory per in-flight byte: the RSS the held bodies added over idle,
	// per byte of body they hold (each sent whole, not ended).
	perByte := "-"
	if h := held.Load(); h > 0 {
		perByte = fmt.Sprintf("%.2f", float64(peak.Load()-idleRSS)/float64(h*int64(size)))
	}
	fmt.Printf("| %s | %d | %d | %d MiB | %d MiB | %s | %s | %s | %s | %s | %d |\n", label, held.Load(), refused.Load(),
		idleRSS>>20, peak.Load()>>20, perByte, pct(before, 50), pct(before, 99), pct(during, 50), pct(during, 99), goodRefused)
	if peak.Load() > chartMemoryLimit {
		return fmt.Errorf("RSS peaked at %d MiB, over the charts' 512 MiB limit", peak.Load()>>20)
	}
	return nil
}

// sampleRSS records the child's peak RSS every 20 ms until stopped.
func sampleRSS(pid int, peak *atomic.Int64) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, err := childproc.RSS(pid); err == nil && rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-finished }) }
}

// timeGood sends well-behaved requests one after another for d (a 1 KiB
// chat body with an e-mail to mask, in one chunk) and returns their
// latencies and how many were refused.
func timeGood(ctx context.Context, conn *grpc.ClientConn, d time.Duration) ([]time.Duration, int, error) {
	text := strings.Repeat("Summarise the quarterly report in three bullet points. ", 17) + " Mail jane@example.com."
	b := []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, text))
	var lat []time.Duration
	refused := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		start := time.Now()
		ok, err := oneRequest(ctx, conn, b)
		if err != nil {
			return nil, 0, err
		}
		if !ok {
			refused++
			continue
		}
		lat = append(lat, time.Since(start))
	}
	return lat, refused, nil
}

func oneRequest(ctx context.Context, conn *grpc.ClientConn, b []byte) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return false, err
	}
	if err := st.Send(headers()); err != nil {
		return false, err
	}
	if err := st.Send(body(b, true)); err != nil {
		return false, err
	}
	r, err := st.Recv()
	if err != nil {
		return false, fmt.Errorf("well-behaved request: %w", err)
	}
	if r.GetImmediateResponse() != nil {
		return false, nil
	}
	// Headers answer, then the body re-emitted: read to its end.
	for {
		r, err := st.Recv()
		if err != nil {
			return false, fmt.Errorf("well-behaved request body: %w", err)
		}
		if r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
			break
		}
	}
	_ = st.CloseSend()
	if _, err := st.Recv(); err != nil && !errors.Is(err, io.EOF) {
		return false, nil
	}
	return true, nil
}

func headers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
			{Key: "content-type", RawValue: []byte("application/json")},
		}}}},
	}
}

func body(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func pct(lat []time.Duration, p int) string {
	if len(lat) == 0 {
		return "—"
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(10 * time.Microsecond).String()
}
