package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/envoysim/xdstest"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/loopback"
)

// BenchmarkStandIn measures requests per second through the Envoy stand-in
// configured by flags and over xDS (the Istio shape, whose routing is the
// flag mode's override-host), with the same picker and simulators behind
// both, so the difference is the cost of the xDS-built tables (route
// matching, per-route filter configs, metadata forwarding).
//
//	go test -run '^$' -bench StandIn -benchtime 1x -v ./test/e2e/
func BenchmarkStandIn(b *testing.B) {
	sims := make([]simProc, 3)
	for i := range sims {
		s, err := sim.New(sim.Config{Name: fmt.Sprintf("sim-%d", i), TimeScale: 1000})
		if err != nil {
			b.Fatal(err)
		}
		sims[i] = simProc{name: fmt.Sprintf("sim-%d", i), addr: loopback.Serve(b, s.Serve), srv: s}
	}
	pool := b.TempDir() + "/pool.yaml"
	writePool(b, pool, sims)
	e := startEPP(b, pool)
	var endpoints []string
	for _, s := range sims {
		endpoints = append(endpoints, s.addr)
	}
	flagProxy, err := envoysim.New(envoysim.Config{
		Filters:           []extprocfilter.FilterConfig{{Name: "epp", Target: e.GRPCAddr(), TLS: true}},
		FallbackEndpoints: endpoints,
		Timeouts:          envoysim.Timeouts{Route: 10 * time.Second, Connect: time.Second, Shutdown: time.Second},
		Logger:            logr.Discard(),
	})
	if err != nil {
		b.Fatal(err)
	}
	srv := xdstest.Start(b)
	srv.Set(b, "1", xdstest.Istio(xdstest.Pool{Endpoints: endpoints, EPP: e.GRPCAddr(), EPPTLS: true, ListenerPort: 80})...)
	_, xdsBase := startNode(b, srv, xdstest.IstioListener)
	modes := []struct{ name, url string }{
		{"flags", "http://" + loopback.Serve(b, flagProxy.Serve) + "/v1/completions"},
		{"xds", xdsBase + "/v1/completions"},
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	send := func(b *testing.B, url string) bool {
		resp, err := c.Post(url, "application/json", strings.NewReader(completion))
		if err != nil {
			b.Error(err)
			return false
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Errorf("status %d", resp.StatusCode)
			return false
		}
		return true
	}
	// Warm both (connections, TLS sessions, the picker's state) so that
	// neither mode pays for starting up inside its measurement.
	for _, m := range modes {
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for range 100 {
					if !send(b, m.url) {
						return
					}
				}
			})
		}
		wg.Wait()
	}
	// Rounds alternate the modes, so drift in the shared machine's speed
	// over the run (it is large on a 2-core VM) falls on both alike; the
	// figure is each mode's median round.
	rates := map[string][]float64{}
	for range b.N {
		for round := range standInRounds {
			for _, m := range modes {
				r := closedLoop(func() bool { return send(b, m.url) }, 16, standInRound)
				rates[m.name] = append(rates[m.name], r)
				b.Logf("round %d %-5s %6.0f req/s", round+1, m.name, r)
			}
		}
	}
	flags, xds := median(rates["flags"]), median(rates["xds"])
	b.ReportMetric(flags, "flags-req/s")
	b.ReportMetric(xds, "xds-req/s")
	b.ReportMetric(xds/flags, "xds/flags")
}

const (
	standInRounds = 8
	standInRound  = 2 * time.Second
)

// closedLoop runs workers that send back to back for d and returns the
// requests per second they completed.
func closedLoop(send func() bool, workers int, d time.Duration) float64 {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done int
	)
	start := time.Now()
	deadline := start.Add(d)
	for range workers {
		wg.Go(func() {
			n := 0
			for time.Now().Before(deadline) && send() {
				n++
			}
			mu.Lock()
			done += n
			mu.Unlock()
		})
	}
	wg.Wait()
	return float64(done) / time.Since(start).Seconds()
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
