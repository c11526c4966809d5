// Command stalled measures the payload processor under the shapes of
// pressure a hostile or broken client can put on it: uploads that stall,
// bodies that cost a parser most per byte, streams held open past the
// stream limit, messages announced and never sent, uploads that trickle
// under the idle timeout, answers never read, and bodies whose decision
// costs many times their size (text dense in zero-width characters and
// combining marks, a million findings to mask). For each shape, on each
// transport (grpc-go and h2), it prints what the pressure came to (for
// the costly bodies, how the processor answered them: forwarded, or the
// status and drop reason), the processor's peak resident memory against
// the charts' 512 MiB limit and the share of well-behaved requests (on a
// connection of their own) the processor forwarded while the pressure
// held, and exits 1 if a run peaked over 80% of the limit or forwarded
// under 99% of them.
//
// It starts `infergate payload` as a separate process per run (plain text,
// loopback, free ports) with --memory-limit at the charts' 512 MiB, from
// which the processor derives its buffer budget and Go soft limit as it
// does from a container's limit.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/infergate/infergate/test/childproc"
)

const (
	chartMemoryLimit = 512 << 20
	chunkBytes       = 64 << 10
	// The bounds a run must keep: peak RSS within 80% of the limit, and
	// 99% of the well-behaved requests forwarded.
	maxPeakShare = 0.80
	minGoodShare = 0.99
)

// options are the command's flags.
type options struct {
	binary     string
	shapes     []string
	transports []string
	scale      float64
	measure    time.Duration
	// processorArgs are added to the processor's flags.
	processorArgs []string
}

func main() {
	var o options
	names := make([]string, 0, len(shapes()))
	for _, s := range shapes() {
		names = append(names, s.name)
	}
	flag.StringVar(&o.binary, "binary", "bin/infergate", "infergate binary to run as the payload processor")
	shapeList := flag.String("shapes", strings.Join(names, ","), "shapes to run, comma-separated")
	transports := flag.String("transports", "grpc,h2", "processor transports (--extproc-transport), comma-separated")
	flag.Float64Var(&o.scale, "scale", 1, "multiplies every shape's stream and client counts (1: the figures in the table)")
	flag.DurationVar(&o.measure, "measure", 2*time.Second, "time well-behaved requests are timed, before and during the pressure")
	flag.Parse()
	o.shapes, o.transports = strings.Split(*shapeList, ","), strings.Split(*transports, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ok, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stalled:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// run runs every chosen shape on every transport and prints the table;
// ok is false when a run left the bounds.
func run(ctx context.Context, o options) (ok bool, err error) {
	byName := map[string]shape{}
	for _, s := range shapes() {
		byName[s.name] = s
	}
	fmt.Printf("payload processor, --memory-limit %d MiB (the charts' limit; the budget and Go soft limit derive from it), scale %g\n\n",
		chartMemoryLimit>>20, o.scale)
	for _, name := range o.shapes {
		if s, known := byName[name]; known {
			fmt.Printf("- %s: %s\n", s.name, s.what)
		}
	}
	fmt.Println()
	fmt.Println("| shape | transport | what the pressure came to | RSS idle | RSS peak | of 512 MiB | well-behaved forwarded | p50 before | p50 during | p99 during | within bounds |")
	fmt.Println("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
	ok = true
	for _, name := range o.shapes {
		s, known := byName[name]
		if !known {
			return false, fmt.Errorf("--shapes: no shape %q", name)
		}
		for _, tr := range o.transports {
			r, err := runOne(ctx, o, s, tr)
			if err != nil {
				return false, fmt.Errorf("%s on %s: %w", s.name, tr, err)
			}
			fmt.Println(r.row())
			ok = ok && r.within()
		}
	}
	return ok, nil
}

// result is one run's figures.
type result struct {
	shape, transport, pressure string
	reached                    int64 // streams or bodies of the pressure that reached the processor
	idleRSS, peakRSS           int64
	before, during             goodRun
}

func (r result) within() bool {
	return float64(r.peakRSS) <= maxPeakShare*chartMemoryLimit && r.during.share() >= minGoodShare
}

func (r result) row() string {
	verdict := "yes"
	if !r.within() {
		verdict = "**no**"
	}
	return fmt.Sprintf("| %s | %s | %s | %d MiB | %d MiB | %.0f%% | %d/%d (%.1f%%) | %s | %s | %s | %s |", r.shape, r.transport, r.pressure,
		r.idleRSS>>20, r.peakRSS>>20, 100*float64(r.peakRSS)/chartMemoryLimit, len(r.during.lat), r.during.attempts, 100*r.during.share(),
		pct(r.before.lat, 50), pct(r.during.lat, 50), pct(r.during.lat, 99), verdict)
}

// runOne starts a processor, times well-behaved requests, puts the
// shape's pressure on, times them again and stops everything.
func runOne(ctx context.Context, o options, s shape, transport string) (result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir, err := os.MkdirTemp("", "stalled")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	policy := s.config
	if policy == "" {
		policy = emailConfig
	}
	p, err := startProcessor(ctx, o.binary, transport, dir, policy, o.processorArgs)
	if err != nil {
		return result{}, err
	}
	defer p.Stop(5 * time.Second) // held streams may outlast a drain
	good, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return result{}, err
	}
	defer good.Close()
	t := target{addr: p.GRPCAddr, scale: o.scale}
	for range 8 {
		// A fixed 64 KiB window: an attacker that does not read takes
		// no more than that per stream off the processor.
		c, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		if err != nil {
			return result{}, err
		}
		defer c.Close()
		t.conns = append(t.conns, c)
	}
	timeGood(ctx, good, 300*time.Millisecond) // warm up
	r := result{shape: s.name, transport: transport, before: timeGood(ctx, good, o.measure)}
	if r.idleRSS, err = childproc.RSS(p.Pid()); err != nil {
		return result{}, err
	}
	var peak atomic.Int64
	stopSampling := sampleRSS(p.Pid(), &peak)
	defer stopSampling()
	pressure, release := context.WithCancel(ctx)
	defer release()
	report, err := s.start(pressure, t)
	if err != nil {
		return result{}, err
	}
	time.Sleep(200 * time.Millisecond) // let the processor settle before timing
	r.during = timeGood(ctx, good, max(o.measure, time.Duration(float64(s.measure)*o.scale)))
	stopSampling()
	r.pressure, r.reached = report()
	r.peakRSS = peak.Load()
	release()
	return r, nil
}
