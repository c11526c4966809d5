package datalayer

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

func TestScrapeFailures(t *testing.T) {
	good := fixture(t, "vllm.txt")
	cases := []struct {
		name    string
		reason  string
		timeout time.Duration
		breakIt func(*testServer)
		fixIt   func(*testServer)
	}{
		{name: "501", reason: ReasonStatus,
			breakIt: func(ts *testServer) { ts.set(serveStatus(http.StatusNotImplemented)) }},
		{name: "garbage", reason: ReasonParse,
			breakIt: func(ts *testServer) { ts.set(serveText("<html><body>metrics moved</body></html>\n")) }},
		{name: "too large", reason: ReasonParse,
			breakIt: func(ts *testServer) { ts.set(serveText(good + strings.Repeat("# padding\n", 1<<10))) }},
		{name: "missing series", reason: ReasonMissingSeries,
			breakIt: func(ts *testServer) { ts.set(serveText(fixture(t, "sglang.txt"))) }},
		{name: "timeout", reason: ReasonTimeout, timeout: 100 * time.Millisecond,
			breakIt: func(ts *testServer) { ts.set(serveSlowly(5*time.Second, good)) }},
		{name: "connection refused", reason: ReasonConnect,
			breakIt: func(ts *testServer) { ts.stop() },
			fixIt:   func(ts *testServer) { ts.start() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestServer(t, serveText(good))
			s, reg := newTestScraper(t, Options{Timeout: tc.timeout})
			s.maxBody = int64(len(good)) + 100
			e := endpoint(ts.addr, datastore.EngineVLLM)
			ctx := context.Background()
			if err := s.ScrapeOnce(ctx, e); err != nil {
				t.Fatalf("first scrape: %v", err)
			}
			prev := e.Metrics()

			tc.breakIt(ts)
			err := s.ScrapeOnce(ctx, e)
			if se, ok := errors.AsType[*ScrapeError](err); !ok || se.Reason != tc.reason {
				t.Fatalf("err = %v, want reason %s", err, tc.reason)
			}
			if got := e.ScrapeError(); !strings.Contains(got, ts.addr) || !strings.Contains(got, tc.reason+": ") {
				t.Errorf("ScrapeError = %q, want the address and reason %s", got, tc.reason)
			}
			if e.Metrics() != prev {
				t.Error("a failed scrape replaced the previous metrics")
			}
			for reason, n := range failures(t, reg) {
				want := 0.0
				if reason == tc.reason {
					want = 1
				}
				if n != want {
					t.Errorf("failures{reason=%s} = %v, want %v", reason, n, want)
				}
			}

			if tc.fixIt != nil {
				tc.fixIt(ts)
			} else {
				ts.set(serveText(good))
			}
			if err := s.ScrapeOnce(ctx, e); err != nil {
				t.Fatalf("scrape after recovery: %v", err)
			}
			if e.ScrapeError() != "" {
				t.Errorf("ScrapeError = %q after recovery", e.ScrapeError())
			}
			if m := e.Metrics(); m == prev || !m.UpdatedAt.After(prev.UpdatedAt) {
				t.Error("recovery did not publish new metrics")
			}
		})
	}
}

// A scrape cut short by its caller (endpoint removed, shutdown) is not the
// endpoint's failure: nothing is recorded.
func TestScrapeCancelledRecordsNothing(t *testing.T) {
	ts := newTestServer(t, serveSlowly(5*time.Second, fixture(t, "vllm.txt")))
	s, reg := newTestScraper(t, Options{})
	e := endpoint(ts.addr, "")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.ScrapeOnce(ctx, e); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's error", err)
	}
	if e.ScrapeError() != "" {
		t.Errorf("ScrapeError = %q", e.ScrapeError())
	}
	for reason, n := range failures(t, reg) {
		if n != 0 {
			t.Errorf("failures{reason=%s} = %v", reason, n)
		}
	}
}

func TestUnknownEngineIsNotCounted(t *testing.T) {
	s, reg := newTestScraper(t, Options{})
	e := endpoint("127.0.0.1:1", "tgi")
	if err := s.ScrapeOnce(context.Background(), e); err == nil || !strings.Contains(err.Error(), `"tgi"`) {
		t.Fatalf("err = %v, want unknown engine", err)
	}
	if e.ScrapeError() == "" {
		t.Error("no scrape error recorded")
	}
	for reason, n := range failures(t, reg) {
		if n != 0 {
			t.Errorf("failures{reason=%s} = %v", reason, n)
		}
	}
}

func TestHTTPSAndPath(t *testing.T) {
	body := fixture(t, "sglang.txt")
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/custom/metrics" {
			http.NotFound(w, r)
			return
		}
		serveText(body)(w, r)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")

	verified, _ := newTestScraper(t, Options{Scheme: "https", Path: "/custom/metrics"})
	if err := verified.ScrapeOnce(context.Background(), endpoint(addr, datastore.EngineSGLang)); err == nil {
		t.Error("self-signed certificate accepted without InsecureSkipVerify")
	}
	s, _ := newTestScraper(t, Options{Scheme: "https", Path: "/custom/metrics", InsecureSkipVerify: true})
	e := endpoint(addr, datastore.EngineSGLang)
	if err := s.ScrapeOnce(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	if got := e.Metrics().RunningRequests; got != 11 {
		t.Errorf("RunningRequests = %d, want 11", got)
	}
}

func TestNewOptions(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := s.opts
	if o.Scheme != "http" || o.Path != "/metrics" || o.Interval != DefaultInterval ||
		o.Timeout != 500*time.Millisecond || o.LogEvery != DefaultLogEvery {
		t.Errorf("defaults = %+v", o)
	}
	if s, _ := New(Options{Interval: 5 * time.Second}); s.opts.Timeout != MaxTimeout {
		t.Errorf("timeout for a 5s interval = %s, want %s", s.opts.Timeout, MaxTimeout)
	}

	for _, bad := range []Options{
		{Scheme: "ftp"},
		{Path: "metrics"},
		{Interval: 10 * time.Millisecond},
		{Interval: -time.Second},
		{Timeout: -time.Second},
	} {
		if _, err := New(bad); err == nil {
			t.Errorf("New(%+v) accepted", bad)
		}
	}

	// Two scrapers may share a registry (e.g. a restart in tests).
	reg := prometheus.NewRegistry()
	for range 2 {
		if _, err := New(Options{Registerer: reg}); err != nil {
			t.Fatalf("second New on one registry: %v", err)
		}
	}
}

func TestFailureLogsAreRateLimited(t *testing.T) {
	ts := newTestServer(t, serveStatus(http.StatusNotImplemented))
	var lines lineCounter
	s, _ := newTestScraper(t, Options{Logger: funcr.New(lines.write, funcr.Options{}), LogEvery: time.Hour})
	e := endpoint(ts.addr, "")
	ctx := context.Background()

	for range 20 {
		_ = s.ScrapeOnce(ctx, e)
	}
	if got := lines.snapshot(); len(got) != 1 || !strings.Contains(got[0], `"suppressed"=0`) {
		t.Fatalf("20 failures logged %d lines, want 1: %q", len(got), got)
	}

	ts.set(serveText(fixture(t, "vllm.txt")))
	for range 3 {
		if err := s.ScrapeOnce(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	got := lines.snapshot()
	if len(got) != 2 || !strings.Contains(got[1], "recovered") || !strings.Contains(got[1], `"failures"=20`) {
		t.Fatalf("after recovery: %d lines, want one more saying recovered after 20 failures: %q", len(got), got)
	}

	// A new run of failures is news again.
	ts.set(serveStatus(http.StatusServiceUnavailable))
	_ = s.ScrapeOnce(ctx, e)
	if got := lines.snapshot(); len(got) != 3 {
		t.Fatalf("new failure after recovery: %d lines, want 3: %q", len(got), got)
	}
}

func TestFailureLogRepeatsAfterLogEvery(t *testing.T) {
	ts := newTestServer(t, serveStatus(http.StatusNotImplemented))
	var lines lineCounter
	s, _ := newTestScraper(t, Options{Logger: funcr.New(lines.write, funcr.Options{}), LogEvery: 50 * time.Millisecond})
	e := endpoint(ts.addr, "")
	for range 3 {
		_ = s.ScrapeOnce(context.Background(), e)
	}
	time.Sleep(60 * time.Millisecond)
	_ = s.ScrapeOnce(context.Background(), e)
	got := lines.snapshot()
	if len(got) != 2 || !strings.Contains(got[1], `"suppressed"=2`) {
		t.Fatalf("got %d lines, want 2, the second counting 2 suppressed: %q", len(got), got)
	}
}
