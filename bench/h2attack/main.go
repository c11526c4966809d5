// Command h2attack runs HTTP/2 attacks against infergate's ext_proc
// processors on both of their transports (grpc-go and the project's own
// HTTP/2 server, extproc/h2server) and prints, per attack and transport,
// whether the processor survived, its peak resident memory against the
// charts' 512 MiB limit, the CPU the attack cost it, and the answer rate
// and p99 of a well-behaved client on a connection of its own meanwhile.
//
// Every attack is bounded in count (scaled by --scale) and in time
// (--limit, and --hold for the streams an attack holds open), and meets a
// processor started fresh for it (plain text, loopback, free ports), so
// that one attack's garbage does not count against the next.
//
// Each attack is offered at a fixed rate of its operations (a frame, a
// header block, a stream; the legend says which), the same for both
// transports, and the report says how many got onto the wire and what
// each cost the processor. The default is open loop, each attack at its
// own rate (--rate-scale multiplies them all): closed loop (--rate 0, as
// fast as the server takes it) a server that handles an attack faster
// gets more of it, and on a shared two-core machine the attacker's extra
// frames take CPU from the victim too, so that the victim's answers would
// look worse on the faster server.
//
//	go build -o /tmp/infergate ./cmd/infergate
//	go run ./bench/h2attack --binary /tmp/infergate
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

func main() {
	var (
		o                             options
		processors, transports, names string
	)
	flag.StringVar(&o.binary, "binary", "bin/infergate", "infergate binary to run as the processor")
	flag.StringVar(&processors, "processors", "payload", "processors to attack, comma-separated: payload, epp (the picker, over two in-process simulators)")
	flag.StringVar(&transports, "transports", "grpc,h2", "--extproc-transport values to attack, comma-separated")
	flag.StringVar(&names, "attacks", "", "attacks to run, comma-separated (empty: all)")
	flag.Float64Var(&o.scale, "scale", 10, "multiplies every attack's count (the test runs 1)")
	flag.DurationVar(&o.limit, "limit", 5*time.Second, "bound on each attack's active phase")
	flag.DurationVar(&o.hold, "hold", 3*time.Second, "how long an attack that holds streams open keeps them after its active phase")
	// Open loop by default: see the package comment.
	flag.Float64Var(&o.rate, "rate", ownRates, "attack operations per second, for every attack (one operation per attack is in the legend); 0: as fast as the server takes them (closed loop); negative: each attack's own rate, times --rate-scale")
	flag.Float64Var(&o.rateScale, "rate-scale", 1, "multiplies each attack's own rate (when --rate is negative)")
	flag.DurationVar(&o.measure, "measure", 2*time.Second, "the victim's baseline window before each attack")
	flag.IntVar(&o.workers, "victim-streams", 4, "the victim's concurrent requests")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	if err := run(ctx, o, processors, transports, names); err != nil {
		fmt.Fprintln(os.Stderr, "h2attack:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, processors, transports, names string) error {
	var err error
	o.processors, o.transports = split(processors), split(transports)
	if o.attacks, err = pick(names); err != nil {
		return err
	}
	if o.scale <= 0 || o.limit <= 0 || o.hold < 0 || o.measure <= 0 || o.workers <= 0 || o.rateScale <= 0 {
		return fmt.Errorf("--scale, --limit, --measure, --victim-streams and --rate-scale must be positive, --hold not negative")
	}
	printLegend(os.Stdout, o)
	fmt.Print(detailHeader)
	results, err := runAll(ctx, o, func(r result) { fmt.Print(detailRow(r)) })
	if err != nil {
		return err
	}
	fmt.Println()
	printSummary(os.Stdout, results, o.transports)
	fmt.Println()
	printReadmeRow(os.Stdout, results, o.transports)
	fmt.Println()
	printChecks(os.Stdout, results)
	return nil
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// pick is the attacks named, all for none.
func pick(names string) ([]attack, error) {
	all := attacks()
	want := split(names)
	if len(want) == 0 {
		return all, nil
	}
	var out []attack
	for _, n := range want {
		i := slices.IndexFunc(all, func(a attack) bool { return a.name == n })
		if i < 0 {
			return nil, fmt.Errorf("no attack %q", n)
		}
		out = append(out, all[i])
	}
	return out, nil
}
