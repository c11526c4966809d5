package flowcontrol

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// room is a controllable pool capacity: headroom for the current version.
type room struct {
	mu       sync.Mutex
	headroom int
	version  int64
}

func (r *room) set(headroom int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.headroom = headroom
	r.version++
}

func (r *room) capacity() (int, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.headroom, r.version
}

func startQueue(t *testing.T, opts QueueOptions) (*Queue, *room) {
	t.Helper()
	r := &room{}
	opts.Capacity = r.capacity
	if opts.Poll == 0 {
		opts.Poll = time.Millisecond
	}
	q := NewQueue(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { q.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return q, r
}

func waitQueued(t *testing.T, q *Queue, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for q.Len() != n {
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d, want %d", q.Len(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAdmitsAtOnceWhileThePoolHasRoom(t *testing.T) {
	q, r := startQueue(t, QueueOptions{TTL: time.Second})
	r.set(2)
	for i := range 10 { // the direct path is not rationed
		if err := q.Admit(context.Background(), 0, "a"); err != nil {
			t.Fatalf("admit %d: %v", i, err)
		}
	}
	r.set(0)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := q.Admit(ctx, 0, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("admit into a full pool: %v, want to wait", err)
	}
	if q.Len() != 0 {
		t.Fatal("a request that gave up is still counted")
	}
}

// TestDispatchOrder queues requests while the pool is full, then releases
// them one at a time and checks the order: priority first, then round
// robin over fairness ids, FIFO within an id.
func TestDispatchOrder(t *testing.T) {
	q, r := startQueue(t, QueueOptions{TTL: 10 * time.Second})
	type req struct {
		priority int
		flow     string
		name     string
	}
	reqs := []req{
		{0, "tenant-a", "a1"}, {0, "tenant-a", "a2"}, {0, "tenant-a", "a3"},
		{0, "tenant-b", "b1"}, {-1, "batch", "s1"}, {10, "tenant-c", "c1"}, {0, "tenant-b", "b2"},
	}
	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	for i, rq := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := q.Admit(context.Background(), rq.priority, rq.flow); err != nil {
				t.Errorf("%s: %v", rq.name, err)
				return
			}
			mu.Lock()
			order = append(order, rq.name)
			mu.Unlock()
		}()
		waitQueued(t, q, i+1) // enqueue in this order
	}
	for i := range reqs {
		r.set(1)
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			n := len(order)
			mu.Unlock()
			if n == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("release %d did not happen", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	wg.Wait()
	want := []string{"c1", "a1", "b1", "a2", "b2", "a3", "s1"}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("dispatch order %v, want %v", order, want)
	}
}

func TestTTLAndQueueLimit(t *testing.T) {
	q, _ := startQueue(t, QueueOptions{TTL: 30 * time.Millisecond, MaxQueued: 2})
	var expired atomic.Int32
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := q.Admit(context.Background(), 0, "x"); errors.Is(err, ErrTTLExpired) {
				expired.Add(1)
			}
		}()
	}
	waitQueued(t, q, 2)
	if err := q.Admit(context.Background(), 0, "y"); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third request with MaxQueued 2: %v", err)
	}
	wg.Wait()
	if expired.Load() != 2 || q.Len() != 0 {
		t.Fatalf("%d expired, %d still queued", expired.Load(), q.Len())
	}
}

func TestReleasedBurstIsBoundedByHeadroom(t *testing.T) {
	q, r := startQueue(t, QueueOptions{TTL: 5 * time.Second})
	var admitted atomic.Int32
	for range 10 {
		go func() {
			if q.Admit(context.Background(), 0, "x") == nil {
				admitted.Add(1)
			}
		}()
	}
	waitQueued(t, q, 10)
	r.set(3)
	time.Sleep(50 * time.Millisecond)
	if got := admitted.Load(); got != 3 {
		t.Fatalf("headroom 3 released %d", got)
	}
	r.set(7) // the metrics changed: new headroom
	waitQueued(t, q, 0)
}

// held counts the tickets the queue's structure still references.
func (q *Queue) held() (tickets, flows int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, b := range q.bands {
		flows += len(b.flows)
		for _, f := range b.flows {
			tickets += len(f.waiting)
		}
	}
	return tickets, flows
}

// TestAbandonedRequestsLeaveNothingBehind: requests that give up while
// the pool stays full must not stay in memory until a release reaches
// them; a flood of abandoned requests would otherwise grow the queue
// without bound.
func TestAbandonedRequestsLeaveNothingBehind(t *testing.T) {
	q, r := startQueue(t, QueueOptions{TTL: time.Minute})
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = q.Admit(ctx, i%3, fmt.Sprintf("tenant-%d", i%7))
		}()
	}
	waitQueued(t, q, 1000)
	// One survivor in the middle of a band keeps its place.
	survivor := make(chan error, 1)
	go func() { survivor <- q.Admit(context.Background(), 1, "tenant-3") }()
	waitQueued(t, q, 1001)
	cancel()
	wg.Wait()
	if tickets, flows := q.held(); tickets != 1 || flows != 1 || q.Len() != 1 {
		t.Fatalf("after 1000 gave up: %d tickets in %d flows held, Len %d; want the one survivor", tickets, flows, q.Len())
	}
	r.set(1)
	if err := <-survivor; err != nil {
		t.Fatalf("survivor: %v", err)
	}
	if tickets, flows := q.held(); tickets != 0 || flows != 0 {
		t.Fatalf("empty queue still holds %d tickets in %d flows", tickets, flows)
	}
}

// TestGivingUpKeepsTheRoundRobinTurn: a flow leaving the band must not
// make the band skip the flow whose turn it was.
func TestGivingUpKeepsTheRoundRobinTurn(t *testing.T) {
	q, r := startQueue(t, QueueOptions{TTL: 10 * time.Second})
	var (
		mu    sync.Mutex
		order []string
	)
	admit := func(ctx context.Context, flow, name string) {
		if q.Admit(ctx, 0, flow) == nil {
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
		}
	}
	released := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			got := len(order)
			mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d released, want %d", got, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	gone, leave := context.WithCancel(context.Background())
	defer leave()
	var wg sync.WaitGroup
	for i, rq := range []struct {
		flow, name string
		ctx        context.Context
	}{
		{"a", "a1", context.Background()}, {"b", "b1", gone}, {"c", "c1", context.Background()},
		{"a", "a2", context.Background()}, {"c", "c2", context.Background()},
	} {
		wg.Add(1)
		go func() { defer wg.Done(); admit(rq.ctx, rq.flow, rq.name) }()
		waitQueued(t, q, i+1)
	}
	r.set(1)
	released(1) // a1; b is next
	leave()     // b leaves: c is next, not a
	waitQueued(t, q, 3)
	for i := 2; i <= 4; i++ {
		r.set(1)
		released(i)
	}
	wg.Wait()
	if want := "[a1 c1 a2 c2]"; fmt.Sprint(order) != want {
		t.Fatalf("order %v, want %s", order, want)
	}
}
