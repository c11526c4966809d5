package flowcontrol

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Errors Admit returns instead of admitting.
var (
	// ErrTTLExpired: the request waited its whole TTL without the pool
	// gaining room.
	ErrTTLExpired = errors.New("request waited its whole TTL in the flow-control queue")
	// ErrQueueFull: the queue holds its maximum already.
	ErrQueueFull = errors.New("flow-control queue is full")
)

// Capacity tells the controller how many more requests the pool can take
// before its metrics next change: headroom, and a version that changes
// whenever the metrics behind the figure do.
type Capacity func() (headroom int, version int64)

// QueueOptions configure a Queue.
type QueueOptions struct {
	Capacity Capacity
	// TTL bounds the wait of a queued request (default 60s).
	TTL time.Duration
	// MaxQueued bounds the queued requests (default 5000).
	MaxQueued int
	// Poll is how often a full pool is re-checked (default 10ms).
	Poll time.Duration
}

// Queue is late-binding flow control: requests that find the pool full
// wait here and are released as room appears, highest priority first and,
// within a priority, round robin over fairness ids (FIFO within each), so
// one tenant's flood cannot starve another's trickle.
//
// Releases from the queue are charged against the pool's headroom until
// the metrics behind it change: otherwise one good scrape would release
// the whole queue at once onto a pool that just had room for a few.
type Queue struct {
	opts QueueOptions

	mu      sync.Mutex
	bands   []*band // by priority, highest first
	queued  int
	version int64
	spent   int // requests released since version
	kick    chan struct{}
}

type band struct {
	priority int
	flows    map[string]*flow
	order    []string // round-robin order of fairness ids
	next     int
}

type flow struct{ waiting []*ticket }

type ticket struct {
	ready chan struct{} // closed when released
	done  bool          // released; guarded by Queue.mu
	// Where the ticket waits, so giving up removes it at once: a ticket
	// left for dispatch to skip stays in memory for as long as the pool
	// is full, and a flood of abandoned requests would grow the queue
	// without bound.
	priority   int
	fairnessID string
}

// NewQueue returns a queue; Run must be running for queued requests to move.
func NewQueue(opts QueueOptions) *Queue {
	if opts.TTL <= 0 {
		opts.TTL = 60 * time.Second
	}
	if opts.MaxQueued <= 0 {
		opts.MaxQueued = 5000
	}
	if opts.Poll <= 0 {
		opts.Poll = 10 * time.Millisecond
	}
	return &Queue{opts: opts, kick: make(chan struct{}, 1)}
}

// Admit returns nil when the request may be scheduled: at once if nothing
// waits and the pool has room, else after waiting its turn. It fails with
// ErrTTLExpired, ErrQueueFull, or the context's error.
//
// The direct path is not charged against the headroom: while the pool is
// not full, flow control must cost nothing.
func (q *Queue) Admit(ctx context.Context, priority int, fairnessID string) error {
	q.mu.Lock()
	if q.queued == 0 {
		if headroom, _ := q.opts.Capacity(); headroom > 0 {
			q.mu.Unlock()
			return nil
		}
	}
	if q.queued >= q.opts.MaxQueued {
		q.mu.Unlock()
		return ErrQueueFull
	}
	t := &ticket{ready: make(chan struct{}), priority: priority, fairnessID: fairnessID}
	q.enqueueLocked(t)
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}

	timer := time.NewTimer(q.opts.TTL)
	defer timer.Stop()
	var err error
	select {
	case <-t.ready:
		return nil
	case <-timer.C:
		err = ErrTTLExpired
	case <-ctx.Done():
		err = ctx.Err()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if t.done { // released while we were giving up: take it
		return nil
	}
	q.removeLocked(t)
	return err
}

// Len is the number of waiting requests.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.queued
}

// Run releases waiting requests as room appears, until ctx ends.
func (q *Queue) Run(ctx context.Context) {
	t := time.NewTicker(q.opts.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-q.kick:
		}
		q.dispatch()
	}
}

func (q *Queue) dispatch() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.queued > 0 {
		b, f := q.peekLocked()
		if f == nil || !q.takeRoomLocked() {
			return
		}
		t := f.waiting[0]
		// removeLocked drops the flow if this empties it, leaving next
		// on the flow after it; otherwise step past this flow.
		q.removeLocked(t)
		if len(f.waiting) > 0 {
			b.next++
		}
		t.done = true
		close(t.ready)
	}
}

// takeRoomLocked charges one request against the current headroom.
func (q *Queue) takeRoomLocked() bool {
	headroom, version := q.opts.Capacity()
	if version != q.version {
		q.version, q.spent = version, 0
	}
	if q.spent >= headroom {
		return false
	}
	q.spent++
	return true
}

// bandIndex finds priority's band (highest priority first).
func (q *Queue) bandIndex(priority int) (int, bool) {
	return slices.BinarySearchFunc(q.bands, priority, func(b *band, p int) int { return p - b.priority })
}

func (q *Queue) enqueueLocked(t *ticket) {
	i, found := q.bandIndex(t.priority)
	if !found {
		q.bands = slices.Insert(q.bands, i, &band{priority: t.priority, flows: map[string]*flow{}})
	}
	b := q.bands[i]
	f := b.flows[t.fairnessID]
	if f == nil {
		f = &flow{}
		b.flows[t.fairnessID] = f
		b.order = append(b.order, t.fairnessID)
	}
	f.waiting = append(f.waiting, t)
	q.queued++
}

// removeLocked takes a waiting ticket out of its flow, and the flow and
// band out of the queue when they empty, keeping the band's round-robin
// position on the flow that was due next.
func (q *Queue) removeLocked(t *ticket) {
	i, found := q.bandIndex(t.priority)
	if !found {
		return
	}
	b := q.bands[i]
	f := b.flows[t.fairnessID]
	if f == nil {
		return
	}
	j := slices.Index(f.waiting, t)
	if j < 0 {
		return
	}
	f.waiting = slices.Delete(f.waiting, j, j+1)
	q.queued--
	if len(f.waiting) > 0 {
		return
	}
	delete(b.flows, t.fairnessID)
	k := slices.Index(b.order, t.fairnessID)
	b.order = slices.Delete(b.order, k, k+1)
	if k < b.next {
		b.next--
	}
	if len(b.order) == 0 {
		q.bands = slices.Delete(q.bands, i, i+1)
	}
}

// peekLocked finds the flow whose head goes next: the highest band, then
// the band's next flow in round-robin order. Flows and bands are removed
// as they empty, so every one here has a waiting ticket.
func (q *Queue) peekLocked() (*band, *flow) {
	if len(q.bands) == 0 {
		return nil, nil
	}
	b := q.bands[0]
	b.next %= len(b.order)
	return b, b.flows[b.order[b.next]]
}
