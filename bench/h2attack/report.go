package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// detailHeader heads the table with a row per attack and transport.
const detailHeader = "| attack | processor | transport | survived | operations sent of offered | RSS before → peak (of 512 MiB) | RSS increase | Go heap peak | CPU: total (the attack's; per operation) | victim answers/s before → during | victim p99 before → during | victim errors during | sent; what the server did |\n" +
	"|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"

func detailRow(r result) string {
	survived := "yes"
	if !r.survived {
		survived = "**no**: " + r.why
	}
	if r.forced {
		survived += " (killed: did not stop within 10 s of an interrupt)"
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s | %s → %s (%.0f%%) | %+.0f MiB | %s | %.2f s (%.2f s; %s) | %.0f → %.0f (%.0f%%) | %s → %s | %d | %s |\n",
		r.attack, r.processor, r.transport, escape(survived), sentOf(r.sent, true),
		mib(r.rssBefore), mib(r.rssPeak), 100*float64(r.rssPeak)/chartMemoryLimit, float64(r.increase())/(1<<20), mib(r.heapPeak),
		r.cpu.Seconds(), r.attackCPU().Seconds(), perOp(r), r.base.rate(), r.during.rate(), 100*r.answerShare(),
		r.base.p99(), r.during.p99(), r.during.errors, escape(r.sent.note))
}

// sentOf is the operations sent of those offered; long, with the rate.
func sentOf(o outcome, long bool) string {
	if o.rate <= 0 {
		return fmt.Sprintf("%d (closed loop)", o.sent)
	}
	share := 0.0
	if o.offered > 0 {
		share = 100 * float64(o.sent) / float64(o.offered)
	}
	if !long {
		return fmt.Sprintf("%.0f%%", share)
	}
	return fmt.Sprintf("%d of %d at %s/s (%.0f%%)", o.sent, o.offered, rateString(o.rate), share)
}

// rateString is a rate of operations per second, briefly.
func rateString(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%gM", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%gk", r/1e3)
	}
	return fmt.Sprintf("%g", r)
}

// perOp is the attack's CPU per operation sent, in a unit that suits it.
func perOp(r result) string {
	s, ok := r.cpuPerOp()
	switch {
	case !ok:
		return "-"
	case s >= 1e-3:
		return fmt.Sprintf("%.2f ms/op", s*1e3)
	case s >= 1e-6:
		return fmt.Sprintf("%.2f µs/op", s*1e6)
	}
	return fmt.Sprintf("%.0f ns/op", s*1e9)
}

// escape keeps a note inside its table cell.
func escape(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

// printSummary prints, per processor, a row per attack with the
// transports side by side, as the README's table has them.
func printSummary(w io.Writer, results []result, transports []string) {
	ts := strings.Join(transports, " / ")
	fmt.Fprintf(w, "| attack | processor | operations/s offered | sent of offered %[1]s | survived %[1]s | peak RSS %[1]s | RSS increase %[1]s | Go heap peak %[1]s | the attack's CPU %[1]s | the attack's CPU per operation %[1]s | victim answer rate during, of baseline, %[1]s | victim p99 during %[1]s |\n", ts)
	fmt.Fprintln(w, "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, by := range pairs(results) {
		cells := make([][]string, 9)
		var attack, processor, rate string
		for _, tr := range transports {
			r, ok := by[tr]
			if !ok {
				for i := range cells {
					cells[i] = append(cells[i], "-")
				}
				continue
			}
			attack, processor = r.attack, r.processor
			if rate = "closed loop"; r.sent.rate > 0 {
				rate = rateString(r.sent.rate)
			}
			survived := "yes"
			if !r.survived {
				survived = "**no**"
			}
			cells[0] = append(cells[0], sentOf(r.sent, false))
			cells[1] = append(cells[1], survived)
			cells[2] = append(cells[2], mib(r.rssPeak))
			cells[3] = append(cells[3], fmt.Sprintf("%+.0f MiB", float64(r.increase())/(1<<20)))
			cells[4] = append(cells[4], mib(r.heapPeak))
			cells[5] = append(cells[5], fmt.Sprintf("%.2f s", r.attackCPU().Seconds()))
			cells[6] = append(cells[6], perOp(r))
			cells[7] = append(cells[7], fmt.Sprintf("%.0f%%", 100*r.answerShare()))
			cells[8] = append(cells[8], r.during.p99())
		}
		row := "| " + attack + " | " + processor + " | " + rate
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
	switch {
	case o.rate == 0:
		fmt.Fprintln(w, "Closed loop (--rate 0): each attack sends as fast as the server takes it, so a server that handles it faster gets more of it.")
	default:
		fmt.Fprintln(w, "Open loop: each attack offers its operations at a fixed rate, the same for both transports, and never faster; an attacker the server (or the machine) holds up falls behind and loses what it could not send in time (sent of offered).")
	}
	fmt.Fprintf(w, "Victim: %d concurrent ext_proc requests (1 KiB chat body) back to back on a connection of its own; baseline over %s just before the attack, then during it.\n",
		o.workers, o.measure)
	fmt.Fprintln(w, "Peak RSS: the largest of VmRSS sampled every 10 ms and VmHWM (reset before the attack); Go heap: go_memstats_heap_inuse_bytes every 200 ms. CPU: the processor's user+system time during the attack; the attack's, that less the victim's answers meanwhile at the baseline's CPU per answer; per operation, that over the operations sent.")
	fmt.Fprintln(w)
	for _, a := range o.attacks {
		rate := "as fast as the server takes them"
		if r := o.rateOf(a); r > 0 {
			rate = rateString(r) + "/s"
		}
		fmt.Fprintf(w, "- %s: %s. One operation: %s; offered %s.\n", a.name, a.does, a.op, rate)
	}
	fmt.Fprintln(w)
}

// printChecks prints which of the test's assertions fail, for the
// processors and attacks run on both grpc-go and h2.
func printChecks(w io.Writer, results []result) {
	fmt.Fprintln(w, "Checks (what go test asserts at scale 1; h2 held to grpc-go's bar; the attack's CPU within 0.2 s, the noise of the test's short attacks, which longer ones exceed):")
	failed, compared := 0, 0
	for _, by := range pairs(results) {
		grpc, okGRPC := by["grpc"]
		h2, okH2 := by["h2"]
		if !okGRPC || !okH2 {
			continue
		}
		compared++
		for _, c := range checks() {
			msg, skipped := c.verdict(grpc, h2)
			if msg != "" {
				fmt.Fprintf(w, "- FAIL %s on %s: %s: %s\n", grpc.attack, grpc.processor, c.name, msg)
				failed++
			}
			if skipped != "" {
				fmt.Fprintf(w, "- skipped %s on %s: %s: %s\n", grpc.attack, grpc.processor, c.name, skipped)
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
