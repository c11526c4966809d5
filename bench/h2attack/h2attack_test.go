package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
)

// TestAttacks runs every attack, at scale 1, against the payload
// processor on grpc-go and on h2, each on a fresh process, and holds h2 to
// grpc-go's bar. Latency and answer-rate ratios are printed, not
// asserted: on a shared two-core machine they measure the neighbours too.
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
	dir := t.TempDir()
	bin := filepath.Join(dir, "infergate")
	build := exec.Command("go", "build", "-o", bin, "github.com/infergate/infergate/cmd/infergate")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building infergate: %v\n%s", err, out)
	}
	o := options{binary: bin, processors: []string{"payload"}, transports: []string{"grpc", "h2"}, attacks: attacks(),
		scale: 1, limit: 1500 * time.Millisecond, hold: time.Second, measure: 500 * time.Millisecond, workers: 4}
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
				if msg := c.fail(by["grpc"], by["h2"]); msg != "" {
					t.Errorf("%s: %s", c.name, msg)
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
	good := func(tr string) result {
		return result{transport: tr, survived: true, rssBefore: 56 << 20, rssPeak: 70 << 20, heapPeak: 12 << 20,
			sent: outcome{volume: 250}, during: sample{answers: 1000, window: time.Second}}
	}
	tests := []struct {
		name   string
		change func(h2 *result)
		fails  []string // the checks that must fail
	}{
		{"good", func(*result) {}, nil},
		{"nothing sent", func(r *result) { r.sent.volume = 0 }, []string{"the attack got onto the wire"}},
		{"died", func(r *result) { r.survived, r.why = false, "exited" }, []string{"the processor survives (alive, health answering)"}},
		{"peak RSS at the limit", func(r *result) { r.rssPeak = chartMemoryLimit },
			[]string{"peak RSS below the charts' 512 MiB limit", "h2's RSS increase at most max(1.5×, +32 MiB) of grpc-go's"}},
		{"announced bytes held, untouched", func(r *result) { r.heapPeak = 1157 << 20 }, []string{"Go heap below the charts' 512 MiB limit"}},
		{"RSS increase past the slack", func(r *result) { r.rssPeak = r.rssBefore + 14<<20 + rssSlack + 1<<20 },
			[]string{"h2's RSS increase at most max(1.5×, +32 MiB) of grpc-go's"}},
		{"RSS increase within the slack", func(r *result) { r.rssPeak = r.rssBefore + 14<<20 + rssSlack }, nil},
		{"victim starved", func(r *result) { r.during = sample{errors: 40, window: time.Second} }, []string{"the victim is answered during the attack"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h2 := good("h2")
			tc.change(&h2)
			var failed []string
			for _, c := range checks() {
				if c.fail(good("grpc"), h2) != "" {
					failed = append(failed, c.name)
				}
			}
			if !slices.Equal(failed, tc.fails) {
				t.Errorf("failed %q, want %q", failed, tc.fails)
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
