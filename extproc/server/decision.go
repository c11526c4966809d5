package server

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"
)

// What deciding a request costs beyond its body (DecisionCoster) is
// charged to the buffer budget while HandleRequest runs: parsing a body,
// folding its text and masking what the guardrails find takes several
// times the body (a million e-mail addresses in one tool call's arguments,
// 14 MiB, took the process to 395–463 MiB of its 512 MiB limit while the
// budget counted the 14 MiB), and huge bodies take seconds of CPU each.
//
// Memory. A decision is charged by the work its exchange says it takes:
//
//   - A small one (at most smallDecisionBytes of work, or a body under
//     offConnectionBytes, decided on the h2 connection's goroutine, which
//     must not wait) is charged whatever the budget says, as answers in
//     flight are: its body is already in the budget, its work is bounded
//     and lasts microseconds, and refusing it would refuse the
//     well-behaved requests the budget is there to keep answering.
//   - A large one is charged only within the decisions' share of the
//     budget (1/decisionShare of it, for all large decisions running), so
//     that however many huge bodies arrive, half the budget stays for the
//     bodies and small decisions of other requests. One that does not fit
//     waits for the large decisions before it to end, in the order they
//     came. One whose work alone is over the share runs alone: it waits
//     until no other large decision holds any, so a body the processor
//     accepts (16 MiB under every guardrail is charged about 106 MiB, of
//     a 154 MiB budget under a 512 MiB limit) is decided, one at a time;
//     one whose work and body could not fit the budget even alone is
//     answered 413 at once. Once its turn has room in the share, a
//     decision for which the rest of the budget (bodies, answers, other
//     decisions, and a sixteenth kept for small requests) has no room is
//     answered 503 at once, as a body that does not fit is: bodies are
//     freed when their uploads end, which no wait can count on.
//
// CPU. A decision over a body of heavyBodyBytes or more waits first for
// one of maxRunning cores (all but one; see maxLargeDecisions), in the
// order they came, so that small requests and the health service keep a
// core while huge bodies are decided. It holds no share while it waits
// for a core, so the large decisions of smaller bodies behind it are not
// held up by it.
//
// Why wait rather than answer 503 at once: the share and the cores are
// freed by decisions that are running, which end in bounded time (a
// decision waits on nothing), so a large request that meets another one
// being decided is answered seconds later instead of refused, and a
// client that sends huge bodies in a loop is served them one after
// another rather than re-uploading each until it finds the share free.
// What a waiting decision holds is its body, already charged. The wait is
// bounded by the request idle timeout; past it the request is answered
// 503 processor-overloaded. Waiting cannot deadlock: the bodies that wait
// are not in the share, and a decision waiting for a core holds none of
// it.

// decisionShare: large decisions hold at most 1/decisionShare of the
// buffer budget together.
const decisionShare = 2

// smallRoom: a large decision is charged only while 1/smallRoom of the
// budget stays free beside it, for the bodies of small requests: large
// uploads and their decisions together would otherwise fill the budget to
// the byte, and the well-behaved requests that come meanwhile would be
// refused for want of a few KiB (make bench-stalled, empty-strings on h2:
// 2 of 339 refused with large decisions charged to the last byte; none of
// 232 and 209 in two runs with this room kept).
const smallRoom = 16

// smallDecisionBytes is the most work a decision may be charged without
// waiting for the share, whatever its body.
const smallDecisionBytes = 1 << 20

// heavyBodyBytes is the body from which a decision waits for a core: 1 MiB
// of prose decides in about 10 ms under every guardrail, of text dense in
// invisible characters and marks in about 150 ms; smaller bodies decide in
// less than the runtime's 10 ms time slice and are left to its scheduler.
const heavyBodyBytes = 1 << 20

// maxLargeDecisions is how many decisions over heavy bodies may run at
// once (Limits.MaxLargeDecisions; 0 is none). By default all the cores but
// one: a decision is CPU work that yields only when the runtime preempts
// it. On 2 cores (make bench-stalled's harness, 4 clients sending 3 MiB
// prompts dense in zero-width characters and combining marks, two of them
// decided at once within the share), the well-behaved requests beside
// them took p50 16 ms and p99 121 ms (grpc; h2 20 and 81 ms), 329 answered
// in 10 s; with one decided at a time, p50 0.29 ms and p99 2.3 ms (h2 0.26
// and 4.3 ms), 27,524 answered, for fewer heavy decisions (28 against 48
// in 10 s; h2 17 against 48).
func maxLargeDecisions(limit int) int64 {
	switch {
	case limit < 0:
		return 0 // no bound
	case limit > 0:
		return int64(limit)
	}
	return int64(max(1, runtime.GOMAXPROCS(0)-1))
}

// decisionCharge is what a decision was charged: give it back with
// uncharge.
type decisionCharge struct {
	n     int64
	large bool // n is in the share
	core  bool // it holds one of the cores for heavy decisions
}

// decisionRequest is what chargeDecision weighs: the work n the exchange
// said the decision takes, and the body's size.
type decisionRequest struct {
	n    int64
	body int
}

// chargeDecision charges a decision about to run, waiting at most wait
// (0: as long as ctx lasts) for a core if its body is heavy and for its
// turn and room in the decisions' share if its work is large. It returns
// the charge, or the rejection to answer, or ctx's error if the stream
// ended meanwhile.
func (b *budget) chargeDecision(ctx context.Context, r decisionRequest, wait time.Duration) (decisionCharge, *Rejection, error) {
	small := r.n <= smallDecisionBytes || r.body < offConnectionBytes
	// A decision over the share runs alone: its own work is its bound.
	share := max(b.maxBuffered/decisionShare, r.n)
	if most := b.maxBuffered - b.maxBuffered/smallRoom - int64(r.body); !small && b.maxBuffered > 0 && r.n > most {
		b.refused.WithLabelValues("decision").Inc()
		return decisionCharge{}, &Rejection{Status: 413, Reason: "request-too-large",
			Message: fmt.Sprintf("deciding this request takes up to %d bytes beyond its body, more than the processor's request buffer budget can hold beside it (%d bytes); send a smaller body", r.n, most)}, nil
	}
	w := waiter{b: b, wait: wait}
	defer w.done()
	var c decisionCharge
	if r.body >= heavyBodyBytes && b.cores != nil {
		if err := w.take(ctx, b.cores); err != nil {
			return w.refuse(err)
		}
		c.core = true
	}
	if small || b.maxBuffered <= 0 {
		b.deciding.Add(r.n)
		c.n = r.n
		return c, nil, nil
	}
	// The turn: only its holder adds to large, so what it finds here can
	// only grow roomier before it adds.
	if err := w.take(ctx, b.turn); err != nil {
		b.uncharge(c)
		return w.refuse(err)
	}
	defer func() { <-b.turn }()
	for b.large.Load()+r.n > share {
		if err := w.until(ctx, b.freed); err != nil {
			b.uncharge(c)
			return w.refuse(err)
		}
	}
	if v := b.deciding.Add(r.n); v+b.buffered.Load()+b.inflight.Load() > b.maxBuffered-b.maxBuffered/smallRoom {
		b.deciding.Add(-r.n)
		b.uncharge(c)
		return w.refuse(errNoRoom)
	}
	b.large.Add(r.n)
	c.n, c.large = r.n, true
	return c, nil, nil
}

// errNoRoom is a wait that ran out, or a decision for which the budget
// has no room.
var errNoRoom = errors.New("no room to decide the request")

// waiter is one decision's wait for a core and for the share, bounded by
// its stream's context and the decision wait; it counts in the waiting
// gauge while it waits.
type waiter struct {
	b       *budget
	wait    time.Duration
	timer   *time.Timer
	waiting bool
}

// expired is the wait's deadline; nil (never) when it has none.
func (w *waiter) expired() <-chan time.Time {
	if w.wait <= 0 {
		return nil // ctx alone ends the wait
	}
	if w.timer == nil {
		w.timer = time.NewTimer(w.wait)
	}
	return w.timer.C
}

// counted counts w in the waiting gauge, once.
func (w *waiter) counted() {
	if !w.waiting {
		w.waiting = true
		w.b.waiting.Add(1)
	}
}

// take takes a slot of sem: at once if one is free, else after those who
// came first (a channel serves its blocked senders in order).
func (w *waiter) take(ctx context.Context, sem chan struct{}) error {
	select {
	case sem <- struct{}{}:
		return nil
	default:
	}
	w.counted()
	select {
	case sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-w.expired():
		return errNoRoom
	}
}

// until waits for a signal on ch.
func (w *waiter) until(ctx context.Context, ch <-chan struct{}) error {
	w.counted()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-w.expired():
		return errNoRoom
	}
}

// refuse is what chargeDecision returns when err ended its wait: the
// stream's end, or a 503 counted as a refusal.
func (w *waiter) refuse(err error) (decisionCharge, *Rejection, error) {
	if !errors.Is(err, errNoRoom) {
		return decisionCharge{}, nil, err
	}
	w.b.refused.WithLabelValues("decision").Inc()
	return decisionCharge{}, overloaded("memory budget for deciding requests"), nil
}

// done ends the wait: its timer stopped, the gauge given back.
func (w *waiter) done() {
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.waiting {
		w.b.waiting.Add(-1)
	}
}

// uncharge gives back what chargeDecision charged (a core, work in the
// budget and in the share), and wakes the large decision whose turn it is.
func (b *budget) uncharge(c decisionCharge) {
	if c.core {
		<-b.cores
	}
	b.deciding.Add(-c.n)
	if !c.large {
		return
	}
	b.large.Add(-c.n)
	select {
	case b.freed <- struct{}{}:
	default: // already woken
	}
}
