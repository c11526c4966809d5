package main

import (
	"fmt"
	"strings"
	"time"
)

// The RSS tolerance for h2 against grpc-go: h2's increase may be at most
// the larger of 1.5× grpc-go's and grpc-go's plus 32 MiB. RSS is noisy:
// whether the collector ran just before the peak was sampled moves it by
// about the live heap (at GOGC 100 the heap may double before a cycle),
// which for these processors is 10–30 MiB under load, and the two
// transports' processes are separate runs seconds apart on a shared
// machine; the additive 32 MiB absorbs that where both increases are
// small, the ratio where they are large. A transport that holds what an
// attack announces rather than what it sends (hundreds of MiB) is far
// outside either.
const (
	rssRatio = 1.5
	rssSlack = 32 << 20
)

// check is one assertion on an attack's results on the two transports; it
// returns what failed, nothing when it holds.
type check struct {
	name string
	fail func(grpc, h2 result) string
}

func checks() []check {
	both := func(grpc, h2 result, f func(r result) string) string {
		var out []string
		for _, r := range []result{grpc, h2} {
			if msg := f(r); msg != "" {
				out = append(out, r.transport+": "+msg)
			}
		}
		return strings.Join(out, "; ")
	}
	return []check{
		{"the attack got onto the wire", func(grpc, h2 result) string {
			return both(grpc, h2, func(r result) string {
				if r.sent.volume <= 0 {
					return "sent nothing: " + r.sent.note
				}
				return ""
			})
		}},
		{"the processor survives (alive, health answering)", func(grpc, h2 result) string {
			return both(grpc, h2, func(r result) string {
				if !r.survived {
					return r.why
				}
				return ""
			})
		}},
		{"peak RSS below the charts' 512 MiB limit", func(grpc, h2 result) string {
			return both(grpc, h2, func(r result) string {
				if r.rssPeak >= chartMemoryLimit {
					return fmt.Sprintf("peak RSS %s", mib(r.rssPeak))
				}
				return ""
			})
		}},
		// RSS misses allocated memory not yet written; in a pod the
		// runtime's memory limit (90% of 512 MiB) counts it, and a heap
		// past it makes the collector run without end.
		{"Go heap below the charts' 512 MiB limit", func(grpc, h2 result) string {
			return both(grpc, h2, func(r result) string {
				if r.heapPeak >= chartMemoryLimit {
					return fmt.Sprintf("Go heap peak %s", mib(r.heapPeak))
				}
				return ""
			})
		}},
		{fmt.Sprintf("h2's RSS increase at most max(%.1f×, +%d MiB) of grpc-go's", rssRatio, rssSlack>>20), func(grpc, h2 result) string {
			allowed := max(int64(rssRatio*float64(max(grpc.increase(), 0))), max(grpc.increase(), 0)+rssSlack)
			if h2.increase() > allowed {
				return fmt.Sprintf("h2 %+d MiB against grpc-go's %+d MiB (allowed %d MiB)", h2.increase()>>20, grpc.increase()>>20, allowed>>20)
			}
			return ""
		}},
		{"the victim is answered during the attack", func(grpc, h2 result) string {
			return both(grpc, h2, func(r result) string {
				if r.during.rate() <= 0 {
					return fmt.Sprintf("no answer in %s (%d failed, the first: %v)", r.during.window.Round(time.Millisecond), r.during.errors, r.during.first)
				}
				return ""
			})
		}},
	}
}

// pairs are the results of each processor and attack, by transport, in
// the order run.
func pairs(results []result) []map[string]result {
	type key struct{ processor, attack string }
	idx := map[key]int{}
	var out []map[string]result
	for _, r := range results {
		k := key{r.processor, r.attack}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, map[string]result{})
		}
		out[i][r.transport] = r
	}
	return out
}
