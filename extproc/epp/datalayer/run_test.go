package datalayer

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// runScraper starts s.Run and returns a stop function that cancels it and
// fails the test unless Run returns promptly.
func runScraper(t *testing.T, s *Scraper, store *datastore.Store) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		s.Run(ctx, store)
		close(done)
	}()
	stopped := false
	stop = func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-done:
		case <-time.After(time.Second):
			t.Fatal("Run did not return within 1s of cancel")
		}
	}
	t.Cleanup(stop)
	return stop
}

func TestRunFollowsTheStore(t *testing.T) {
	a := newTestServer(t, serveText(fixture(t, "vllm.txt")))
	b := newTestServer(t, serveText(fixture(t, "sglang.txt")))
	const interval = 10 * time.Millisecond
	baseline := runtime.NumGoroutine()

	store := datastore.New()
	s, _ := newTestScraper(t, Options{Interval: interval})
	stop := runScraper(t, s, store)

	if err := store.Replace([]datastore.Spec{{Address: a.addr}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*interval, "endpoint a never scraped", func() bool {
		return store.Get(a.addr).Metrics() != nil
	})
	eventually(t, 50*interval, "endpoint a not scraped every interval", func() bool {
		return a.requests.Load() >= 5
	})

	// Swap a for b: b gets scraped, a's loop stops.
	if err := store.Replace([]datastore.Spec{{Address: b.addr, Engine: datastore.EngineSGLang}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*interval, "endpoint b never scraped", func() bool {
		return store.Get(b.addr).Metrics() != nil
	})
	time.Sleep(3 * interval) // lets a scrape of a that was in flight finish
	before := a.requests.Load()
	time.Sleep(10 * interval)
	if after := a.requests.Load(); after != before {
		t.Errorf("removed endpoint scraped %d more times", after-before)
	}

	stop()
	// Loops, and the client's connections, are gone once Run returns; the
	// servers' side of the connections closes shortly after.
	eventually(t, 2*time.Second, "goroutines left after Run", func() bool {
		return runtime.NumGoroutine() <= baseline
	})
}

// An endpoint whose scrapes hang does not slow the others down.
func TestSlowEndpointDelaysNoOther(t *testing.T) {
	slow := newTestServer(t, serveSlowly(time.Second, fixture(t, "vllm.txt")))
	fast := newTestServer(t, serveText(fixture(t, "vllm.txt")))
	const interval = 10 * time.Millisecond

	store := datastore.New()
	if err := store.Replace([]datastore.Spec{{Address: slow.addr}, {Address: fast.addr}}); err != nil {
		t.Fatal(err)
	}
	s, _ := newTestScraper(t, Options{Interval: interval, Timeout: 5 * time.Second})
	runScraper(t, s, store)

	eventually(t, 40*interval, "fast endpoint not scraped 10 times while the slow one hangs", func() bool {
		return fast.requests.Load() >= 10
	})
	if n := slow.requests.Load(); n != 1 {
		t.Errorf("slow endpoint got %d requests, want 1 in flight", n)
	}
}

// A changed spec gives a new Endpoint object, which gets its own loop.
func TestRunFollowsSpecChanges(t *testing.T) {
	ts := newTestServer(t, serveText(fixture(t, "trtllm_serve.txt")))
	store := datastore.New()
	if err := store.Replace([]datastore.Spec{{Address: ts.addr, Engine: datastore.EngineVLLM}}); err != nil {
		t.Fatal(err)
	}
	s, _ := newTestScraper(t, Options{Interval: 10 * time.Millisecond})
	runScraper(t, s, store)
	eventually(t, time.Second, "vLLM mapping never failed on a trtllm-serve page", func() bool {
		return store.Get(ts.addr).ScrapeError() != ""
	})

	if err := store.Replace([]datastore.Spec{{Address: ts.addr, Engine: datastore.EngineTRTLLMServe}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "new spec never scraped", func() bool {
		m := store.Get(ts.addr).Metrics()
		return m != nil && m.RunningRequests == 64
	})
}
