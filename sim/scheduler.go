package sim

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"time"
)

// errQueueFull is returned by acquire when the waiting queue is at capacity.
var errQueueFull = errors.New("waiting queue is full")

// scheduler hands out the MaxNumSeqs running slots and the KV cache blocks.
// Waiting requests are admitted in arrival order, as vLLM's scheduler does:
// a request for an adapter that cannot be loaded (MaxLoRAs distinct adapters
// already running) is passed over so it does not block requests behind it,
// while a request whose blocks do not fit in the KV cache stops admission
// until running requests free enough.
type scheduler struct {
	base       string
	maxSeqs    int
	maxWaiting int
	maxLoRAs   int
	cache      *prefixCache

	mu          sync.Mutex
	running     int
	runningLoRA map[string]int // adapter → running requests
	waiting     []*ticket
	changed     time.Time // last change of running or waiting
}

// ticket is one request's place in the scheduler.
type ticket struct {
	model    string
	seq      seqBlocks
	admitted chan struct{} // closed on admission
	// Guarded by scheduler.mu until admitted is closed.
	done  bool // admitted
	hits  int  // leading prompt blocks found in the cache
	alloc *allocation
}

func newScheduler(cfg Config, cache *prefixCache) *scheduler {
	return &scheduler{
		base:        cfg.Model,
		maxSeqs:     cfg.MaxNumSeqs,
		maxWaiting:  cfg.MaxWaitingQueue,
		maxLoRAs:    cfg.MaxLoRAs,
		cache:       cache,
		runningLoRA: map[string]int{},
		changed:     time.Now(),
	}
}

// acquire blocks until the request for model, which needs the KV cache
// blocks seq, may run. On success the ticket tells the cached prompt blocks
// and the caller must call release. It fails with errQueueFull, or with the
// context's error when the client leaves while waiting.
func (s *scheduler) acquire(ctx context.Context, model string, seq seqBlocks) (*ticket, error) {
	t := &ticket{model: model, seq: seq, admitted: make(chan struct{})}
	s.mu.Lock()
	s.waiting = append(s.waiting, t)
	s.dispatchLocked()
	if !t.done && len(s.waiting) > s.maxWaiting {
		s.dropLocked(t)
		s.mu.Unlock()
		return nil, errQueueFull
	}
	s.changed = time.Now()
	s.mu.Unlock()

	select {
	case <-t.admitted:
		return t, nil
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		if t.done { // admitted while we were giving up
			s.releaseLocked(t, false)
		} else {
			s.dropLocked(t)
			s.dispatchLocked() // it may have held back smaller requests
			s.changed = time.Now()
		}
		return nil, ctx.Err()
	}
}

// release frees the slot and blocks taken by a successful acquire. finished
// says the request generated all its tokens, whose full blocks then stay
// cached.
func (s *scheduler) release(t *ticket, finished bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked(t, finished)
}

func (s *scheduler) releaseLocked(t *ticket, finished bool) {
	if finished {
		s.cache.finish(t.alloc)
	} else {
		s.cache.release(t.alloc)
	}
	s.running--
	if t.model != s.base {
		if s.runningLoRA[t.model]--; s.runningLoRA[t.model] == 0 {
			delete(s.runningLoRA, t.model)
		}
	}
	s.dispatchLocked()
	s.changed = time.Now()
}

func (s *scheduler) dropLocked(t *ticket) {
	if i := slices.Index(s.waiting, t); i >= 0 {
		s.waiting = slices.Delete(s.waiting, i, i+1)
	}
}

// dispatchLocked admits waiting requests while slots and blocks are free. A
// request too large for the whole cache gets in once nothing else runs, so
// that it cannot wait forever.
func (s *scheduler) dispatchLocked() {
	blocked := false
	s.waiting = slices.DeleteFunc(s.waiting, func(t *ticket) bool {
		if blocked || s.running >= s.maxSeqs || !s.adapterFitsLocked(t.model) {
			return false
		}
		hits, a, ok := s.cache.tryAllocate(t.seq, s.running == 0)
		if !ok {
			blocked = true
			return false
		}
		t.hits, t.alloc = hits, a
		s.running++
		if t.model != s.base {
			s.runningLoRA[t.model]++
		}
		t.done = true
		close(t.admitted)
		return true
	})
}

func (s *scheduler) adapterFitsLocked(model string) bool {
	return model == s.base || s.runningLoRA[model] > 0 || len(s.runningLoRA) < s.maxLoRAs
}

// schedState is a consistent snapshot of the scheduler.
type schedState struct {
	running, waiting          int
	runningLoRAs, waitingLoRA []string // sorted, distinct
	changed                   time.Time
}

func (s *scheduler) state() schedState {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := schedState{running: s.running, waiting: len(s.waiting), changed: s.changed}
	for a := range s.runningLoRA {
		st.runningLoRAs = append(st.runningLoRAs, a)
	}
	sort.Strings(st.runningLoRAs)
	for _, t := range s.waiting {
		if t.model != s.base && !slices.Contains(st.waitingLoRA, t.model) {
			st.waitingLoRA = append(st.waitingLoRA, t.model)
		}
	}
	sort.Strings(st.waitingLoRA)
	return st
}
