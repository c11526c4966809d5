package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// detailHeader heads the table with a row per attack and transport.
const detailHeader = "| attack | processor | transport | survived | RSS before → peak (of 512 MiB) | RSS increase | Go heap peak | CPU: total (the attack's) | victim answers/s before → during | victim p99 before → during | victim errors during | sent; what the server did |\n" +
	"|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n"

func detailRow(r result) string {
	survived := "yes"
	if !r.survived {
		survived = "**no**: " + r.why
	}
	if r.forced {
		survived += " (killed: did not stop within 10 s of an interrupt)"
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s → %s (%.0f%%) | %+.0f MiB | %s | %.2f s (%.2f s) | %.0f → %.0f (%.0f%%) | %s → %s | %d | %s |\n",
		r.attack, r.processor, r.transport, escape(survived),
		mib(r.rssBefore), mib(r.rssPeak), 100*float64(r.rssPeak)/chartMemoryLimit, float64(r.increase())/(1<<20), mib(r.heapPeak),
		r.cpu.Seconds(), r.attackCPU().Seconds(), r.base.rate(), r.during.rate(), 100*r.answerShare(),
		r.base.p99(), r.during.p99(), r.during.errors, escape(r.sent.note))
}

// escape keeps a note inside its table cell.
func escape(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

// printSummary prints, per processor, a row per attack with the
// transports side by side, as the README's table has them.
func printSummary(w io.Writer, results []result, transports []string) {
	ts := strings.Join(transports, " / ")
	fmt.Fprintf(w, "| attack | processor | survived %[1]s | peak RSS %[1]s | RSS increase %[1]s | Go heap peak %[1]s | the attack's CPU %[1]s | victim answer rate during, of baseline, %[1]s | victim p99 during %[1]s |\n", ts)
	fmt.Fprintln(w, "|---|---|---|---:|---:|---:|---:|---:|---:|")
	for _, by := range pairs(results) {
		cells := make([][]string, 7)
		var attack, processor string
		for _, tr := range transports {
			r, ok := by[tr]
			if !ok {
				for i := range cells {
					cells[i] = append(cells[i], "-")
				}
				continue
			}
			attack, processor = r.attack, r.processor
			survived := "yes"
			if !r.survived {
				survived = "**no**"
			}
			cells[0] = append(cells[0], survived)
			cells[1] = append(cells[1], mib(r.rssPeak))
			cells[2] = append(cells[2], fmt.Sprintf("%+.0f MiB", float64(r.increase())/(1<<20)))
			cells[3] = append(cells[3], mib(r.heapPeak))
			cells[4] = append(cells[4], fmt.Sprintf("%.2f s", r.attackCPU().Seconds()))
			cells[5] = append(cells[5], fmt.Sprintf("%.0f%%", 100*r.answerShare()))
			cells[6] = append(cells[6], r.during.p99())
		}
		row := "| " + attack + " | " + processor
		for _, c := range cells {
			row += " | " + strings.Join(c, " / ")
		}
		fmt.Fprintln(w, row+" |")
	}
}

// printLegend says what each attack sends and how the figures are taken.
func printLegend(w io.Writer, o options) {
	fmt.Fprintf(w, "Scale %g: each attack's active phase at most %s, held streams held %s more; a fresh processor per attack and transport, no GOMEMLIMIT.\n",
		o.scale, o.limit, o.hold)
	fmt.Fprintf(w, "Victim: %d concurrent ext_proc requests (1 KiB chat body) back to back on a connection of its own; baseline over %s just before the attack, then during it.\n",
		o.workers, o.measure)
	fmt.Fprintln(w, "Peak RSS: the largest of VmRSS sampled every 10 ms and VmHWM (reset before the attack); Go heap: go_memstats_heap_inuse_bytes every 200 ms. CPU: the processor's user+system time during the attack; the attack's, that less the victim's answers meanwhile at the baseline's CPU per answer.")
	fmt.Fprintln(w)
	for _, a := range o.attacks {
		fmt.Fprintf(w, "- %s: %s\n", a.name, a.does)
	}
	fmt.Fprintln(w)
}

// printChecks prints which of the test's assertions fail, for the
// processors and attacks run on both grpc-go and h2.
func printChecks(w io.Writer, results []result) {
	fmt.Fprintln(w, "Checks (what go test asserts at scale 1; h2 held to grpc-go's bar):")
	failed, compared := 0, 0
	for _, by := range pairs(results) {
		grpc, okGRPC := by["grpc"]
		h2, okH2 := by["h2"]
		if !okGRPC || !okH2 {
			continue
		}
		compared++
		for _, c := range checks() {
			if msg := c.fail(grpc, h2); msg != "" {
				fmt.Fprintf(w, "- FAIL %s on %s: %s: %s\n", grpc.attack, grpc.processor, c.name, msg)
				failed++
			}
		}
	}
	switch {
	case compared == 0:
		fmt.Fprintln(w, "- none: they compare grpc and h2, and both were not run")
	case failed == 0:
		fmt.Fprintf(w, "- all hold, on %d attacks\n", compared)
	}
}

// printReadmeRow prints the suite's row of the README's side-by-side
// table, per processor: for each transport, the attacks survived and the
// worst of each figure, with the attack that set it.
func printReadmeRow(w io.Writer, results []result, transports []string) {
	var processors []string
	for _, r := range results {
		if !slices.Contains(processors, r.processor) {
			processors = append(processors, r.processor)
		}
	}
	fmt.Fprintf(w, "| HTTP/2 attacks | %s |\n|---|%s\n", strings.Join(transports, " | "), strings.Repeat("---|", len(transports)))
	for _, p := range processors {
		name := map[string]string{"payload": "payload processor", "epp": "endpoint picker"}[p]
		row := fmt.Sprintf("| bench/h2attack, %s", name)
		for _, tr := range transports {
			var rs []result
			for _, r := range results {
				if r.processor == p && r.transport == tr {
					rs = append(rs, r)
				}
			}
			if len(rs) == 0 {
				row += " | -"
				continue
			}
			survived := 0
			for _, r := range rs {
				if r.survived {
					survived++
				}
			}
			worst := func(better func(a, b result) bool) result {
				return slices.MinFunc(rs, func(a, b result) int {
					switch {
					case better(a, b):
						return 1
					case better(b, a):
						return -1
					}
					return 0
				})
			}
			rss := worst(func(a, b result) bool { return a.rssPeak < b.rssPeak })
			inc := worst(func(a, b result) bool { return a.increase() < b.increase() })
			heap := worst(func(a, b result) bool { return a.heapPeak < b.heapPeak })
			ans := worst(func(a, b result) bool { return a.answerShare() > b.answerShare() })
			row += fmt.Sprintf(" | %d/%d survived; peak RSS at most %s (%s), increase at most %+.0f MiB (%s); Go heap at most %s (%s); victim answered at least %.0f%% of its baseline rate (%s)",
				survived, len(rs), mib(rss.rssPeak), rss.attack, float64(inc.increase())/(1<<20), inc.attack, mib(heap.heapPeak), heap.attack, 100*ans.answerShare(), ans.attack)
		}
		fmt.Fprintln(w, row+" |")
	}
}
