package main

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/infergate/infergate/bench/extprocload"
)

// victim is a well-behaved client: a few workers sending real ext_proc
// requests back to back over one connection of their own, as a proxy's
// worker does beside the attacker.
type victim struct {
	conn    *extprocload.Conn
	req     extprocload.Request
	workers int
}

// sample is what the victim measured over one window.
type sample struct {
	answers int             // answered within the window
	errors  int             // failed, or still unanswered a grace period after it
	first   error           // the first failure
	window  time.Duration   // how long the window was open
	lat     []time.Duration // latencies of every answered request, sorted
}

// rate is the answers per second within the window.
func (s sample) rate() float64 {
	if s.window <= 0 {
		return 0
	}
	return float64(s.answers) / s.window.Seconds()
}

func (s sample) p99() string { return extprocload.Pct(s.lat, 0.99) }

// graceAfterStop is how long requests in flight when a window closes may
// still be answered (their latency counts, the answer not towards the
// rate); then they are cut and count as failures, so that a processor the
// attack left unable to answer does not hold the run for the driver's own
// 10 s timeout.
const graceAfterStop = 2 * time.Second

// measure runs the workers until stop is closed.
func (v victim) measure(ctx context.Context, stop <-chan struct{}) sample {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopped := make(chan time.Time, 1)
	start := time.Now()
	go func() {
		select {
		case <-stop:
		case <-ctx.Done():
		}
		stopped <- time.Now()
		select {
		case <-time.After(graceAfterStop):
			cancel()
		case <-ctx.Done():
		}
	}()
	var (
		mu  sync.Mutex
		out sample
		wg  sync.WaitGroup
	)
	for range v.workers {
		wg.Go(func() {
			var (
				lat            []time.Duration
				answers, fails int
				first          error
			)
			for {
				select {
				case <-stop:
				case <-ctx.Done():
				default:
					d, err := extprocload.One(ctx, v.conn, v.req)
					if err != nil {
						fails++
						first = cmp.Or(first, err)
						continue
					}
					lat = append(lat, d)
					select {
					case <-stop: // answered after the window closed
					default:
						answers++
					}
					continue
				}
				break
			}
			mu.Lock()
			out.lat = append(out.lat, lat...)
			out.answers += answers
			out.errors += fails
			out.first = cmp.Or(out.first, first)
			mu.Unlock()
		})
	}
	wg.Wait()
	out.window = (<-stopped).Sub(start)
	slices.Sort(out.lat)
	return out
}

// measureFor runs the workers for d.
func (v victim) measureFor(ctx context.Context, d time.Duration) sample {
	stop := make(chan struct{})
	t := time.AfterFunc(d, func() { close(stop) })
	defer t.Stop()
	return v.measure(ctx, stop)
}
