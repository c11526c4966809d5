// Package e2e runs the real parts together on loopback: simulators as model
// servers, the standalone endpoint picker over TLS, and the Envoy stand-in
// (envoysim) in front, with HTTP requests from a real client.
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/extproc/epp"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/childproc"
	"github.com/infergate/infergate/test/loopback"
)

type simProc struct {
	name string
	addr string
	srv  *sim.Server
}

func startSims(t testing.TB, n int) []simProc {
	t.Helper()
	out := make([]simProc, n)
	for i := range out {
		name := fmt.Sprintf("sim-%d", i)
		s, err := sim.New(sim.Config{Name: name, TimeScale: 50})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = simProc{name: name, addr: loopback.Serve(t, s.Serve), srv: s}
	}
	return out
}

func writePool(t testing.TB, path string, sims []simProc) {
	t.Helper()
	var sb strings.Builder
	sb.WriteString("name: e2e\nendpoints:\n")
	for _, s := range sims {
		fmt.Fprintf(&sb, "- address: %s\n  name: %s\n", s.addr, s.name)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(sb.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // atomic, as a config manager would
		t.Fatal(err)
	}
}

type eppProc struct {
	*epp.Service
	stop func() // stops the picker and waits for it
}

// startEPP runs a picker over poolFile on loopback until the test ends;
// edits change its configuration first.
func startEPP(t testing.TB, poolFile string, edits ...func(*epp.Config)) *eppProc {
	t.Helper()
	cfg := epp.Config{
		Server: server.Options{GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
			TLS: server.TLSOptions{Enabled: true}, DrainTimeout: 2 * time.Second},
		PoolFile:         poolFile,
		PoolFilePoll:     50 * time.Millisecond,
		MetricsStaleness: 2 * time.Second,
		EmitScores:       true,
		Logger:           logr.Discard(),
	}
	for _, edit := range edits {
		edit(&cfg)
	}
	s, err := epp.NewService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	// A gateway checks the picker's health from the start, and one that
	// finds it not ready yet takes it in only at the next check (2 s on).
	if err := childproc.WaitReady(context.Background(), s.HealthAddr(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return &eppProc{Service: s, stop: stop}
}

// stopsAsCharted makes the picker stop as the charts stop it: it goes on
// serving for the charts' shutdownDelaySeconds (5) with its health service
// NOT_SERVING, which the gateway's health check (every 2 s) sees and takes
// it out for, before it drains.
func stopsAsCharted(c *epp.Config) { c.Server.ShutdownDelay = 5 * time.Second }

func startProxy(t testing.TB, eppAddr string, failOpen bool, fallback []string) string {
	t.Helper()
	p, err := envoysim.New(envoysim.Config{
		Filters:           []extprocfilter.FilterConfig{{Name: "epp", Target: eppAddr, TLS: true, FailureModeAllow: failOpen}},
		FallbackEndpoints: fallback,
		Timeouts:          envoysim.Timeouts{Route: 10 * time.Second, Connect: time.Second, Shutdown: time.Second},
		DebugMetadata:     true,
		Logger:            logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + loopback.Serve(t, p.Serve)
}

func newPool(t testing.TB, n int) ([]simProc, string) {
	sims := startSims(t, n)
	pool := filepath.Join(t.TempDir(), "pool.yaml")
	writePool(t, pool, sims)
	return sims, pool
}

type reply struct {
	status   int
	upstream string
	pod      string
	debug    string
	body     string
}

var client = &http.Client{Timeout: 15 * time.Second}

func post(t testing.TB, base, body string, kv ...string) (reply, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Add(kv[i], kv[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, upstream: resp.Header.Get(envoysim.UpstreamHeader),
		pod: resp.Header.Get("x-inference-pod"), debug: resp.Header.Get(envoysim.DebugMetadataHeader), body: string(b)}, err
}

const completion = `{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Say hello","max_tokens":4}`

func TestRequestsReachTheEndpointThePickerChose(t *testing.T) {
	sims, pool := newPool(t, 3)
	e := startEPP(t, pool)
	base := startProxy(t, e.GRPCAddr(), false, nil)
	byAddr := map[string]string{}
	for _, s := range sims {
		byAddr[s.addr] = s.name
	}
	for range 30 {
		r, err := post(t, base, completion)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if byAddr[r.upstream] == "" || byAddr[r.upstream] != r.pod {
			t.Fatalf("proxy went to %q, the sim there is %q, answered %q", r.upstream, byAddr[r.upstream], r.pod)
		}
		var lb struct {
			Dest   string             `json:"x-gateway-destination-endpoint"`
			Scores map[string]float64 `json:"x-gateway-destination-endpoint-scores"`
		}
		if err := json.Unmarshal([]byte(r.debug), &lb); err != nil {
			t.Fatalf("debug metadata %q: %v", r.debug, err)
		}
		if lb.Dest != r.upstream || len(lb.Scores) != 3 {
			t.Fatalf("picker said %q with scores %v, proxy went to %q", lb.Dest, lb.Scores, r.upstream)
		}
	}
}

func TestLoadedEndpointIsAvoided(t *testing.T) {
	sims, pool := newPool(t, 3)
	waiting, kv := 40, 0.95
	sims[1].srv.SetFakeMetrics(&sim.FakeMetrics{Waiting: &waiting, KVCacheUsage: &kv})
	e := startEPP(t, pool)
	base := startProxy(t, e.GRPCAddr(), false, nil)
	waitFor(t, "the picker scrapes the loaded sim", func() bool {
		m := e.Store().Get(sims[1].addr).Metrics()
		return m != nil && m.WaitingQueueSize == 40
	})
	for range 40 {
		r, err := post(t, base, completion)
		if err != nil || r.status != 200 {
			t.Fatalf("%v %+v", err, r)
		}
		if r.upstream == sims[1].addr {
			t.Fatalf("request routed to the endpoint with 40 waiting and 95%% KV use")
		}
	}
}

func TestBodylessRequestIsRouted(t *testing.T) {
	_, pool := newPool(t, 2)
	e := startEPP(t, pool)
	base := startProxy(t, e.GRPCAddr(), false, nil)
	resp, err := client.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(envoysim.UpstreamHeader) == "" {
		t.Fatalf("GET /v1/models: %d via %q", resp.StatusCode, resp.Header.Get(envoysim.UpstreamHeader))
	}
}

func TestMalformedBodyIs400WithReason(t *testing.T) {
	_, pool := newPool(t, 1)
	e := startEPP(t, pool)
	base := startProxy(t, e.GRPCAddr(), false, nil)
	for body, want := range map[string]string{`{"model":`: "not valid JSON", `{"prompt":"x"}`: `no \"model\"`} {
		r, err := post(t, base, body)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != 400 || !strings.Contains(r.body, want) {
			t.Fatalf("body %s: got %d %s", body, r.status, r.body)
		}
	}
}

func TestPoolFileChangeIsFollowed(t *testing.T) {
	sims, pool := newPool(t, 2)
	writePool(t, pool, sims[:1])
	e := startEPP(t, pool)
	base := startProxy(t, e.GRPCAddr(), false, nil)
	for range 10 {
		if r, _ := post(t, base, completion); r.upstream != sims[0].addr {
			t.Fatalf("went to %q with one endpoint in the pool", r.upstream)
		}
	}
	writePool(t, pool, sims[1:])
	waitFor(t, "the picker reloads the pool file", func() bool {
		return len(e.Store().Endpoints()) == 1 && e.Store().Endpoints()[0].Address == sims[1].addr
	})
	if r, _ := post(t, base, completion); r.upstream != sims[1].addr {
		t.Fatalf("went to %q after the pool changed to %s", r.upstream, sims[1].addr)
	}
	// A broken edit keeps the last good set.
	if err := os.WriteFile(pool, []byte("endpoints: [{address: nope}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if r, _ := post(t, base, completion); r.status != 200 || r.upstream != sims[1].addr {
		t.Fatalf("after a broken pool file: %d via %q", r.status, r.upstream)
	}
}

func TestReadinessAndLiveness(t *testing.T) {
	_, pool := newPool(t, 1)
	e := startEPP(t, pool)
	conn, err := grpc.NewClient(e.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{server.HealthLiveness, server.HealthReadiness, server.HealthExtProc} {
		waitFor(t, svc+" serving", func() bool {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
		})
	}
}

// TestFailureModeWhenThePickerStops keeps traffic flowing while the picker
// is stopped as its chart stops it (stopsAsCharted): with FailOpen no
// request fails, the last ones before the health check takes the picker
// out at its pick and the rest on endpoints the proxy picks itself; with
// FailClose those after the stop get 5xx; none hangs.
func TestFailureModeWhenThePickerStops(t *testing.T) {
	for _, failOpen := range []bool{true, false} {
		name := map[bool]string{true: "FailOpen", false: "FailClose"}[failOpen]
		t.Run(name, func(t *testing.T) {
			sims, pool := newPool(t, 2)
			e := startEPP(t, pool, stopsAsCharted)
			base := startProxy(t, e.GRPCAddr(), failOpen, []string{sims[0].addr, sims[1].addr})

			// phase: 0 picker running, 1 stopping, 2 stopped. A request is
			// judged by the phases it started and ended in; one that spans
			// the stop may go either way but must not hang.
			var (
				mu            sync.Mutex
				phase         int
				before, after []reply
				failed        []reply // any not 200, whenever it ran
				errs          []error
			)
			current := func() int { mu.Lock(); defer mu.Unlock(); return phase }
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						start := current()
						r, err := post(t, base, completion)
						mu.Lock()
						switch {
						case err != nil:
							errs = append(errs, err)
						case start == 0 && phase == 0:
							before = append(before, r)
						case start == 2:
							after = append(after, r)
						}
						if err == nil && r.status != 200 {
							failed = append(failed, r)
						}
						mu.Unlock()
					}
				}()
			}
			waitFor(t, "traffic flows", func() bool { mu.Lock(); defer mu.Unlock(); return len(before) >= 20 })
			mu.Lock()
			phase = 1
			mu.Unlock()
			e.stop()
			mu.Lock()
			phase = 2
			mu.Unlock()
			waitFor(t, "traffic after the stop", func() bool { mu.Lock(); defer mu.Unlock(); return len(after) >= 40 })
			cancel()
			wg.Wait()

			if len(errs) > 0 {
				t.Fatalf("%d requests failed at the client (hang or reset), first: %v", len(errs), errs[0])
			}
			for _, r := range before {
				if r.status != 200 {
					t.Fatalf("before the stop: %d %s", r.status, r.body)
				}
			}
			if failOpen && len(failed) > 0 {
				t.Fatalf("FailOpen: %d requests failed across the stop, first %d %s", len(failed), failed[0].status, failed[0].body)
			}
			for _, r := range after {
				if failOpen && (r.status != 200 || (r.upstream != sims[0].addr && r.upstream != sims[1].addr)) {
					t.Fatalf("FailOpen after the stop: %d via %q: %s", r.status, r.upstream, r.body)
				}
				if !failOpen && r.status < 500 {
					t.Fatalf("FailClose after the stop: got %d, want 5xx", r.status)
				}
			}
		})
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEndpointWithBrokenMetricsKeepsServing puts a model server whose
// /metrics answers 501 beside two healthy ones: it is reported as failing
// and still gets its share of traffic by the other signals.
func TestEndpointWithBrokenMetricsKeepsServing(t *testing.T) {
	sims := startSims(t, 2)
	broken, err := sim.New(sim.Config{Name: "broken-metrics", TimeScale: 50})
	if err != nil {
		t.Fatal(err)
	}
	h := broken.Handler()
	addr := loopback.Serve(t, func(ctx context.Context, ln net.Listener) error {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/metrics" {
				http.Error(w, "metrics not implemented", http.StatusNotImplemented)
				return
			}
			h.ServeHTTP(w, r)
		})}
		go func() { <-ctx.Done(); _ = srv.Close() }()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	sims = append(sims, simProc{name: "broken-metrics", addr: addr, srv: broken})
	pool := filepath.Join(t.TempDir(), "pool.yaml")
	writePool(t, pool, sims)
	e := startEPP(t, pool)
	base := startProxy(t, e.GRPCAddr(), false, nil)
	waitFor(t, "the healthy sims are scraped and the broken one has failed", func() bool {
		return e.Store().Get(sims[0].addr).Metrics() != nil && e.Store().Get(sims[1].addr).Metrics() != nil &&
			e.Store().Get(addr).ScrapeError() != ""
	})
	counts := map[string]int{}
	for range 90 {
		r, err := post(t, base, completion)
		if err != nil || r.status != 200 {
			t.Fatalf("%v %+v", err, r)
		}
		counts[r.pod]++
	}
	// All three are idle, so all score alike; the broken one should get
	// about a third. Far fewer would mean unknown metrics are punished.
	if counts["broken-metrics"] < 10 {
		t.Fatalf("the endpoint with broken metrics got %d of 90 requests: %v", counts["broken-metrics"], counts)
	}
	resp, err := client.Get("http://" + e.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`infergate_epp_endpoints{state="scrape_failing"} 1`, `infergate_epp_scrape_failures_total{reason="status"}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("picker metrics lack %s", want)
		}
	}
}

// TestPickerWithoutResponseBodies runs the picker the way the project's
// integrations configure it: response headers only (the served endpoint
// comes with them), no response body round trips.
func TestPickerWithoutResponseBodies(t *testing.T) {
	_, pool := newPool(t, 2)
	e := startEPP(t, pool)
	fc, _, err := envoysim.ParseFilterFlag("epp=" + e.GRPCAddr() + ",tls=true,response-body=none")
	if err != nil {
		t.Fatal(err)
	}
	p, err := envoysim.New(envoysim.Config{Filters: []extprocfilter.FilterConfig{fc}, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + loopback.Serve(t, p.Serve)
	for range 10 {
		r, err := post(t, base, `{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"hi","max_tokens":3,"stream":true}`)
		if err != nil || r.status != 200 || !strings.Contains(r.body, "[DONE]") {
			t.Fatalf("%v %+v", err, r)
		}
	}
	// The picker counts a response when its stream closes, which can be a
	// moment after the client has read the last byte.
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := client.Get("http://" + e.MetricsAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), `infergate_epp_served_total{match="primary"} 10`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("served endpoints not recorded from response headers alone:\n%s", grepLines(string(body), "served"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
