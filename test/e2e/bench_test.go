package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/infergate/infergate/extproc/devproxy"
	"github.com/infergate/infergate/extproc/devproxy/xdstest"
	"github.com/infergate/infergate/extproc/extproctest"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/loopback"
)

// BenchmarkStandIn measures requests per second through the Envoy stand-in
// configured by flags and over xDS (the Istio shape, whose routing is the
// flag mode's override-host), with the same picker and simulators behind
// both, so the difference is the cost of the xDS-built tables (route
// matching, per-route filter configs, metadata forwarding).
//
//	go test -run '^$' -bench StandIn -benchtime 3s -count 5 ./test/e2e/
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
	modes := []struct {
		name string
		url  func(b *testing.B) string
	}{
		{"flags", func(b *testing.B) string {
			p, err := devproxy.New(devproxy.Config{
				Filters:           []extproctest.FilterConfig{{Name: "epp", Target: e.GRPCAddr(), TLS: true}},
				FallbackEndpoints: endpoints,
				Timeouts:          devproxy.Timeouts{Route: 10 * time.Second, Connect: time.Second, Shutdown: time.Second},
				Logger:            logr.Discard(),
			})
			if err != nil {
				b.Fatal(err)
			}
			return "http://" + loopback.Serve(b, p.Serve)
		}},
		{"xds", func(b *testing.B) string {
			srv := xdstest.Start(b)
			srv.Set(b, "1", xdstest.Istio(xdstest.Pool{Endpoints: endpoints, EPP: e.GRPCAddr(), EPPTLS: true, ListenerPort: 80})...)
			_, base := startNode(b, srv, xdstest.IstioListener)
			return base
		}},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			url := m.url(b) + "/v1/completions"
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			b.SetParallelism(8)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := c.Post(url, "application/json", strings.NewReader(completion))
					if err != nil {
						b.Error(err)
						return
					}
					_ = resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}
