package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/test/childproc"
	"golang.org/x/net/http2/hpack"
)

// TestAttacks runs every attack, at scale 1 and each at its own rate (open
// loop, as the driver does by default), against the payload processor on
// grpc-go and on h2, each on a fresh process, and holds h2 to grpc-go's
// bar. Latency and answer-rate ratios are printed, not asserted: on a
// shared two-core machine they measure the neighbours too.
//
// The attack clients run here, in the test binary (race-instrumented
// under make test): their loops encode frames into a buffer and write it
// in batches, and the reader skips payloads it does not need, so the
// instrumentation costs the clients little beside the processor's work;
// in exchange the race detector also covers the suite's own concurrency
// (the reader, the flow-control waits, the victim's workers).
func TestAttacks(t *testing.T) {
	// The binary is built here rather than in a TestMain so that no
	// package-level state carries its path; this is the one test that
	// needs it. It is built without -race: the processor under attack is
	// the production build.
	bin, dir := childproc.Command(t, "infergate"), t.TempDir() // dir: the processors' logs
	o := options{binary: bin, processors: []string{"payload"}, transports: []string{"grpc", "h2"}, attacks: attacks(),
		scale: 1, limit: 1500 * time.Millisecond, hold: time.Second, rate: ownRates, rateScale: 1, measure: 500 * time.Millisecond, workers: 4}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	var all []result
	for _, a := range o.attacks {
		t.Run(a.name, func(t *testing.T) {
			by := map[string]result{}
			for _, tr := range o.transports {
				r, err := runOne(ctx, o, dir, "payload", tr, a, nil)
				if err != nil {
					t.Fatalf("%s over %s: %v", a.name, tr, err)
				}
				by[tr] = r
				all = append(all, r)
				t.Log(strings.TrimSpace(detailRow(r)))
			}
			for _, c := range checks() {
				msg, skipped := c.verdict(by["grpc"], by["h2"])
				if msg != "" {
					t.Errorf("%s: %s", c.name, msg)
				}
				if skipped != "" {
					t.Logf("not checked: %s: %s", c.name, skipped)
				}
			}
		})
	}
	var b strings.Builder
	printLegend(&b, o)
	b.WriteString(detailHeader)
	for _, r := range all {
		b.WriteString(detailRow(r))
	}
	b.WriteString("\n")
	printSummary(&b, all, o.transports)
	b.WriteString("\n")
	printReadmeRow(&b, all, o.transports)
	t.Log("\n" + b.String())
}

// TestChecks: each assertion fails on the result it is there to catch
// (the figures of h2 before its message buffers were charged as bytes
// arrive, among them) and passes on a good one.
func TestChecks(t *testing.T) {
	// The victim's answers cost 0.5 s of CPU in either window, the
	// attack 0.3 s beside them.
	good := func(tr string) result {
		return result{transport: tr, survived: true, rssBefore: 56 << 20, rssPeak: 70 << 20, heapPeak: 12 << 20,
			sent: outcome{rate: 400, offered: 600, sent: 600}, cpu: 800 * time.Millisecond, baseCPU: 500 * time.Millisecond,
			base: sample{answers: 1000, window: time.Second}, during: sample{answers: 1000, window: time.Second}}
	}
	const cpuCheck = "h2's attack CPU at most max(1.5×, +0.2 s) of grpc-go's"
	tests := []struct {
		name   string
		change func(h2 *result)
		fails  []string // the checks that must fail
	}{
		{"good", func(*result) {}, nil},
		{"nothing sent", func(r *result) { r.sent.sent = 0 }, []string{"the attack got onto the wire"}},
		{"died", func(r *result) { r.survived, r.why = false, "exited" }, []string{"the processor survives (alive, health answering)"}},
		{"peak RSS at the limit", func(r *result) { r.rssPeak = chartMemoryLimit },
			[]string{"peak RSS below the charts' 512 MiB limit", "h2's RSS increase at most max(1.5×, +32 MiB) of grpc-go's"}},
		{"announced bytes held, untouched", func(r *result) { r.heapPeak = 1157 << 20 }, []string{"Go heap below the charts' 512 MiB limit"}},
		{"RSS increase past the slack", func(r *result) { r.rssPeak = r.rssBefore + 14<<20 + rssSlack + 1<<20 },
			[]string{"h2's RSS increase at most max(1.5×, +32 MiB) of grpc-go's"}},
		{"RSS increase within the slack", func(r *result) { r.rssPeak = r.rssBefore + 14<<20 + rssSlack }, nil},
		// The victim's answers then cost nothing: all 0.8 s is the
		// attack's, 0.5 s more than grpc-go's and 2.7×.
		{"victim starved", func(r *result) { r.during = sample{errors: 40, window: time.Second} },
			[]string{cpuCheck, "the victim is answered during the attack"}},
		{"attack CPU past the slack", func(r *result) { r.cpu += 201 * time.Millisecond }, []string{cpuCheck}},
		{"attack CPU within the slack", func(r *result) { r.cpu += 200 * time.Millisecond }, nil},
		// The CPU comparison is skipped, however far off, where the
		// transports did different work.
		{"fell behind: not compared", func(r *result) { r.cpu, r.sent.sent = 3*time.Second, 569 }, nil},
		{"kept up, within the share: compared", func(r *result) { r.cpu, r.sent.sent = 3*time.Second, 570 }, []string{cpuCheck}},
		{"closed loop: not compared", func(r *result) { r.cpu, r.sent = 3*time.Second, outcome{sent: 600} }, nil},
		{"offered differently: not compared", func(r *result) { r.cpu, r.sent.offered, r.sent.sent = 3*time.Second, 700, 700 }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h2 := good("h2")
			tc.change(&h2)
			var failed []string
			for _, c := range checks() {
				if msg, _ := c.verdict(good("grpc"), h2); msg != "" {
					failed = append(failed, c.name)
				}
			}
			if !slices.Equal(failed, tc.fails) {
				t.Errorf("failed %q, want %q", failed, tc.fails)
			}
		})
	}

	// Where grpc-go's attack CPU is 2 s, the ratio sets the bar: 3 s.
	all := checks()
	i := slices.IndexFunc(all, func(c check) bool { return c.name == cpuCheck })
	if i < 0 {
		t.Fatalf("no check %q", cpuCheck)
	}
	big := good("grpc")
	big.cpu += 1700 * time.Millisecond
	for _, tc := range []struct {
		name string
		cpu  time.Duration // h2's, the victim's 0.5 s included
		fail bool
	}{{"within the ratio", 3490 * time.Millisecond, false}, {"past the ratio", 3510 * time.Millisecond, true}} {
		t.Run(tc.name, func(t *testing.T) {
			h2 := good("h2")
			h2.cpu = tc.cpu
			if msg, skipped := all[i].verdict(big, h2); (msg != "") != tc.fail || skipped != "" {
				t.Errorf("failed %q, skipped %q", msg, skipped)
			}
		})
	}
}

// TestHeaderBlocks: the hand-encoded header fields decode to what they
// say, with the lengths the attacks count on.
func TestHeaderBlocks(t *testing.T) {
	var got []hpack.HeaderField
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) { got = append(got, f) })
	frag := floodFragment()
	if len(frag) != 16<<10 {
		t.Fatalf("flood fragment of %d bytes, want 16384", len(frag))
	}
	if _, err := dec.Write(frag); err != nil {
		t.Fatal(err)
	}
	if err := dec.Close(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 16 || got[0].Name != "x-flood" || len(got[0].Value) != 1012 || !got[15].Sensitive {
		t.Fatalf("decoded %d fields, the first %q with %d bytes", len(got), got[0].Name, len(got[0].Value))
	}

	got = nil
	block := append(requestBlock("127.0.0.1:1"), bombInsert()...)
	block = append(block, bombRef, bombRef)
	if _, err := dec.Write(block); err != nil {
		t.Fatal(err)
	}
	if len(got) != 9 || got[0].Name != ":method" || got[0].Value != "POST" {
		t.Fatalf("decoded %v", got)
	}
	for _, f := range got[6:] {
		if f.Name != bombName || len(f.Value) != bombValue {
			t.Fatalf("bomb field %q with %d bytes", f.Name, len(f.Value))
		}
	}
	if hf := (hpack.HeaderField{Name: bombName, Value: got[6].Value}); hf.Size() > 4096 {
		t.Fatalf("the bomb entry takes %d bytes, more than the table", hf.Size())
	}
}

// TestPacer: open loop, every batch is handed over once its last
// operation is due and no earlier, however fast the attack asks; an
// attacker held up loses what is older than a batch and lagAllowed;
// closed loop, batches come at once; the count bounds what is offered.
func TestPacer(t *testing.T) {
	ctx := context.Background()
	t.Run("open loop", func(t *testing.T) {
		start := time.Now()
		p := newPacer(2000, 1_000_000, start, start.Add(100*time.Millisecond))
		if p.offered() != 200 {
			t.Fatalf("offered %d, want 200 (2000/s for 100 ms)", p.offered())
		}
		taken := 0
		for k := p.take(ctx, 10); k > 0; k = p.take(ctx, 10) {
			if k > 10 {
				t.Fatalf("a batch of %d, more than 10", k)
			}
			if early := time.Until(p.at(p.next - 1)); early > 0 {
				t.Fatalf("operation %d handed over %s before its time", p.next-1, early)
			}
			taken += k
		}
		if taken > 200 || time.Since(start) < 95*time.Millisecond {
			t.Fatalf("%d operations taken in %s", taken, time.Since(start))
		}
	})
	t.Run("held up", func(t *testing.T) {
		// 50 ms behind at 2000/s: 100 operations owed, of which a batch
		// (10) and lagAllowed's worth (40) may still go.
		now := time.Now()
		p := newPacer(2000, 1_000_000, now.Add(-50*time.Millisecond), now.Add(time.Second))
		if k := p.take(ctx, 10); k != 10 {
			t.Fatalf("took %d, want 10", k)
		}
		if lost := p.next - 10; lost < 50 || lost > 60 {
			t.Fatalf("lost %d operations, want about 51", lost)
		}
	})
	t.Run("closed loop", func(t *testing.T) {
		p := newPacer(0, 25, time.Now(), time.Now().Add(time.Hour))
		var got []int
		for k := p.take(ctx, 10); k > 0; k = p.take(ctx, 10) {
			got = append(got, k)
		}
		if !slices.Equal(got, []int{10, 10, 5}) {
			t.Fatalf("batches %v, want [10 10 5]", got)
		}
	})
	t.Run("count", func(t *testing.T) {
		p := newPacer(1e6, 5, time.Now(), time.Now().Add(time.Hour))
		if k := p.take(ctx, 10); k != 5 || p.offered() != 5 {
			t.Fatalf("took %d of %d offered, want 5 of 5", k, p.offered())
		}
	})
}
