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

// scheduler hands out the MaxNumSeqs running slots. Waiting requests are
// admitted in arrival order, except that a request for an adapter that cannot
// be loaded (MaxLoRAs distinct adapters already running) is passed over so
// it does not block requests behind it, as vLLM's scheduler does.
type scheduler struct {
	base       string
	maxSeqs    int
	maxWaiting int
	maxLoRAs   int

	mu          sync.Mutex
	running     int
	runningLoRA map[string]int // adapter → running requests
	waiting     []*ticket
	changed     time.Time // last change of running or waiting
}

type ticket struct {
	model    string
	admitted chan struct{} // closed on admission
	done     bool          // admitted; guarded by scheduler.mu
}

func newScheduler(cfg Config) *scheduler {
	return &scheduler{
		base:        cfg.Model,
		maxSeqs:     cfg.MaxNumSeqs,
		maxWaiting:  cfg.MaxWaitingQueue,
		maxLoRAs:    cfg.MaxLoRAs,
		runningLoRA: map[string]int{},
		changed:     time.Now(),
	}
}

// acquire blocks until the request for model may run. On success the caller
// must call release(model). It fails with errQueueFull, or with the context's
// error when the client leaves while waiting.
func (s *scheduler) acquire(ctx context.Context, model string) error {
	t := &ticket{model: model, admitted: make(chan struct{})}
	s.mu.Lock()
	s.waiting = append(s.waiting, t)
	s.dispatchLocked()
	if !t.done && len(s.waiting) > s.maxWaiting {
		s.dropLocked(t)
		s.mu.Unlock()
		return errQueueFull
	}
	s.changed = time.Now()
	s.mu.Unlock()

	select {
	case <-t.admitted:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		if t.done { // admitted while we were giving up
			s.releaseLocked(model)
		} else {
			s.dropLocked(t)
			s.changed = time.Now()
		}
		return ctx.Err()
	}
}

// release frees the slot taken by a successful acquire.
func (s *scheduler) release(model string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked(model)
}

func (s *scheduler) releaseLocked(model string) {
	s.running--
	if model != s.base {
		if s.runningLoRA[model]--; s.runningLoRA[model] == 0 {
			delete(s.runningLoRA, model)
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

// dispatchLocked admits waiting requests while slots are free.
func (s *scheduler) dispatchLocked() {
	s.waiting = slices.DeleteFunc(s.waiting, func(t *ticket) bool {
		if s.running >= s.maxSeqs || !s.adapterFitsLocked(t.model) {
			return false
		}
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
