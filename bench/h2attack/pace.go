package main

import (
	"context"
	"errors"
	"math"
	"time"
)

// ownRates, as options.rate, runs each attack at its own rate from the
// table (times options.rateScale): the default.
const ownRates = -1

// lagAllowed is how far behind its schedule an attack may be and still
// send the operations it owes: a timer firing late, a reconnection or a
// write the server held that long is made up for; what is older is lost,
// so that an attacker never sends faster than its rate over any longer
// stretch (a token bucket refilled by the clock, a batch and this deep).
const lagAllowed = 20 * time.Millisecond

// errPaceOver ends an attack's loop: its count is reached or its active
// phase is over.
var errPaceOver = errors.New("the attack's operations are all offered")

// errConnEnded ends an attack's use of a connection the server ended.
var errConnEnded = errors.New("connection ended")

// pacer schedules an attack's operations and counts those that got onto
// the wire. One goroutine, the attack's, uses it.
//
// Open loop, operation i is due at start + i/rate whatever the server did
// with the ones before; that is the default. Closed loop (as fast as TCP
// backpressure and the server's windows let the attacker write), a server
// that handles an attack's frames faster gets more of them: on a shared
// two-core machine the attacker, the victim and the server compete for
// the same cores, so the faster server's victim also loses more CPU to
// the attacker, and neither its answers nor the server's CPU compare the
// transports. At a fixed rate both get the same work, and what each did
// with it (its CPU per operation above all) does.
type pacer struct {
	// rate is the operations per second offered; 0 is closed loop.
	rate         float64
	start, until time.Time
	// total is how many operations are offered: the attack's count, and
	// open loop no more than are due within the active phase.
	total int
	next  int // operations handed to the attack or lost to lag
	sent  int64
	timer *time.Timer
}

func newPacer(rate float64, n int, start, until time.Time) *pacer {
	p := &pacer{rate: rate, start: start, until: until, total: n}
	if rate > 0 {
		p.total = int(min(float64(n), math.Ceil(rate*until.Sub(start).Seconds())))
	}
	return p
}

// more says whether operations remain to be offered: closed loop, until
// the active phase ends; open loop, until the last batch, due just before
// it ends, is as late as any may be.
func (p *pacer) more() bool {
	if p.rate <= 0 {
		return p.next < p.total && time.Now().Before(p.until)
	}
	return p.next < p.total && !time.Now().After(p.until.Add(lagAllowed))
}

// at is when operation i is due (rounded up, so that it is due then).
func (p *pacer) at(i int) time.Time {
	return p.start.Add(time.Duration(math.Ceil(float64(i) / p.rate * float64(time.Second))))
}

// dueBy is how many operations are due by now (operation 0 at start).
func (p *pacer) dueBy(now time.Time) int {
	return min(p.total, int(p.rate*now.Sub(p.start).Seconds())+1)
}

// take waits for the attack's next batch of operations and hands it over:
// most of them (the attack's operations per write), or those left, once
// the last of them is due, so that the attacker never runs ahead of its
// rate; 0 once the count is reached, the active phase is over or ctx
// ends. Closed loop, it hands them over at once. Batches at a fixed size
// make the writes, and the connections of an attack the server closes
// after a write, follow the rate too, rather than how fast the attacker
// can reconnect.
func (p *pacer) take(ctx context.Context, most int) int {
	if p.rate <= 0 {
		if !p.more() || ctx.Err() != nil {
			return 0
		}
		k := min(most, p.total-p.next)
		p.next += k
		return k
	}
	for {
		now := time.Now()
		if !p.more() || ctx.Err() != nil {
			return 0
		}
		due := p.dueBy(now)
		if lost := due - p.next - most - int(p.rate*lagAllowed.Seconds()); lost > 0 {
			p.next += lost // behind: the server (or the machine) did not take them in time
		}
		k := min(most, p.total-p.next)
		if due-p.next >= k {
			p.next += k
			return k
		}
		wait := p.at(p.next + k - 1).Sub(now)
		if p.timer == nil {
			p.timer = time.NewTimer(wait)
		} else {
			p.timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			p.timer.Stop()
			return 0
		case <-p.timer.C:
		}
	}
}

// back returns k operations taken but not written (the connection ended
// under them): the next connection sends them, if still in time.
func (p *pacer) back(k int) { p.next -= k }

// flush writes what c has buffered and counts its k operations as sent;
// if the write fails (the server closed the connection), they are the
// next connection's, as for an attacker with more connections than one.
func (p *pacer) flush(c *rawConn, k int) error {
	if err := c.flush(); err != nil {
		p.back(k)
		return err
	}
	p.sent += int64(k)
	return nil
}

// offered is how many operations the schedule had due within the active
// phase (up to the count); closed loop, those sent.
func (p *pacer) offered() int64 {
	if p.rate <= 0 {
		return p.sent
	}
	return int64(p.total)
}

// outcome is the attack's outcome with note.
func (p *pacer) outcome(note string) outcome {
	return outcome{rate: p.rate, offered: p.offered(), sent: p.sent, note: note}
}
