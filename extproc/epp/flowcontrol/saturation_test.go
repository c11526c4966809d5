package flowcontrol

import (
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

func TestUtilizationDetector(t *testing.T) {
	now := time.Now()
	d := UtilizationDetector{QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8, MetricsStaleness: time.Second}
	ep := func(q int, kv float64, age time.Duration) *datastore.Endpoint {
		e := &datastore.Endpoint{}
		e.SetMetrics(&datastore.Metrics{WaitingQueueSize: q, KVCacheUsage: kv, UpdatedAt: now.Add(-age)})
		return e
	}
	cases := []struct {
		name      string
		eps       []*datastore.Endpoint
		want      float64
		saturated bool
	}{
		{"idle", []*datastore.Endpoint{ep(0, 0, 0), ep(0, 0, 0)}, 0, false},
		{"queue dominates", []*datastore.Endpoint{ep(5, 0.1, 0), ep(0, 0, 0)}, 0.5, false},
		{"kv dominates", []*datastore.Endpoint{ep(0, 0.8, 0), ep(10, 0.2, 0)}, 1.5, true},
		{"stale counts as full", []*datastore.Endpoint{ep(0, 0, 2*time.Second), ep(5, 0, 0)}, 1, true},
		{"never scraped counts as full", []*datastore.Endpoint{{}, ep(0, 0, 0)}, 0.5, false},
		{"empty pool", nil, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := d.Saturation(now, tc.eps); got != tc.want {
				t.Errorf("saturation = %v, want %v", got, tc.want)
			}
			// Without a SheddableThreshold, sheddable work is shed once
			// the pool is full.
			if got := d.Shed(now, tc.eps); got != tc.saturated {
				t.Errorf("shed = %v, want %v", got, tc.saturated)
			}
		})
	}
}

func TestCapacity(t *testing.T) {
	now := time.Now()
	d := UtilizationDetector{QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8, MetricsStaleness: time.Second}
	mk := func(q int, at time.Time) *datastore.Endpoint {
		e := &datastore.Endpoint{}
		e.SetMetrics(&datastore.Metrics{WaitingQueueSize: q, UpdatedAt: at})
		return e
	}
	idle := []*datastore.Endpoint{mk(0, now), mk(0, now.Add(-time.Millisecond))}
	if h, v := d.Capacity(now, idle); h != 10 || v != now.UnixNano() {
		t.Fatalf("idle pool of 2: headroom %d version %d", h, v)
	}
	if h, _ := d.Capacity(now, []*datastore.Endpoint{mk(5, now), mk(3, now)}); h != 2 {
		t.Fatalf("half-full pool: headroom %d, want 2", h)
	}
	if h, _ := d.Capacity(now, []*datastore.Endpoint{mk(9, now)}); h != 0 {
		t.Fatalf("saturated pool: headroom %d", h)
	}
}

func TestShedBeforeFull(t *testing.T) {
	now := time.Now()
	e := &datastore.Endpoint{}
	e.SetMetrics(&datastore.Metrics{KVCacheUsage: 0.68, UpdatedAt: now}) // saturation 0.85
	eps := []*datastore.Endpoint{e}
	if !(UtilizationDetector{QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8, MetricsStaleness: time.Second, SheddableThreshold: 0.8}).Shed(now, eps) {
		t.Error("a pool at 0.85 must shed at threshold 0.8")
	}
	if (UtilizationDetector{QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8, MetricsStaleness: time.Second}).Shed(now, eps) {
		t.Error("without a threshold, shedding waits for a full pool")
	}
}

func TestPendingTokensCountUntilTheNextScrape(t *testing.T) {
	now := time.Now()
	d := UtilizationDetector{QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8, MetricsStaleness: time.Second}
	e := &datastore.Endpoint{}
	e.SetMetrics(&datastore.Metrics{KVCacheUsage: 0.2, BlockSize: 16, NumGPUBlocks: 100, UpdatedAt: now}) // 1,600 tokens
	eps := []*datastore.Endpoint{e}
	e.AddPending(800) // half the cache routed since the scrape
	if got := d.Saturation(now, eps); got < 0.87 || got > 0.88 {
		t.Fatalf("saturation %v, want (0.2+0.5)/0.8 = 0.875", got)
	}
	e.SetMetrics(&datastore.Metrics{KVCacheUsage: 0.7, BlockSize: 16, NumGPUBlocks: 100, UpdatedAt: now})
	if e.Pending() != 0 {
		t.Fatal("a new scrape must absorb what was pending")
	}
}
