package datalayer

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// testServer is a metrics server on 127.0.0.1 whose behaviour tests switch
// at run time. It can stop and start again on the same address, to test
// connection refusals and recovery.
type testServer struct {
	t        *testing.T
	addr     string
	srv      *httptest.Server
	requests atomic.Int64
	handler  atomic.Pointer[http.HandlerFunc]
}

func newTestServer(t *testing.T, h http.HandlerFunc) *testServer {
	t.Helper()
	ts := &testServer{t: t, addr: "127.0.0.1:0"}
	ts.set(h)
	ts.start()
	t.Cleanup(ts.stop)
	return ts
}

func (ts *testServer) set(h http.HandlerFunc) { ts.handler.Store(&h) }

func (ts *testServer) start() {
	ts.t.Helper()
	ln, err := net.Listen("tcp", ts.addr)
	if err != nil {
		ts.t.Fatalf("listen %s: %v", ts.addr, err)
	}
	ts.addr = ln.Addr().String()
	ts.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.requests.Add(1)
		(*ts.handler.Load())(w, r)
	}))
	ts.srv.Listener = ln
	ts.srv.Start()
}

func (ts *testServer) stop() {
	if ts.srv != nil {
		ts.srv.Close()
		ts.srv = nil
	}
}

func serveText(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(body))
	}
}

func serveStatus(code int) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "nope", code) }
}

// serveSlowly answers after d, or never if the client gives up first.
func serveSlowly(d time.Duration, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(d):
			serveText(body)(w, r)
		}
	}
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// newTestScraper builds a Scraper on its own registry, with the interval
// floor lowered so that loops run fast.
func newTestScraper(t *testing.T, opts Options) (*Scraper, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	opts.minInterval = time.Millisecond
	if opts.Interval == 0 {
		opts.Interval = 10 * time.Millisecond
	}
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Second
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, reg
}

func endpoint(addr, engine string) *datastore.Endpoint {
	return &datastore.Endpoint{Spec: datastore.Spec{Address: addr, Name: "pod-" + addr, Engine: engine}}
}

// failures reads infergate_epp_scrape_failures_total by reason.
func failures(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "infergate_epp_scrape_failures_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			out[labelValue(m, "reason")] = m.GetCounter().GetValue()
		}
	}
	return out
}

// eventually polls cond every few milliseconds until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// lineCounter is a funcr sink target that records log lines.
type lineCounter struct {
	mu    sync.Mutex
	lines []string
}

func (c *lineCounter) write(prefix, args string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, args)
}

func (c *lineCounter) snapshot() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}
