// Package flowcontrol decides whether the pool can take more work and which
// requests give way when it cannot.
package flowcontrol

import (
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// UtilizationDetector measures pool saturation from scraped metrics: each
// endpoint's saturation is max(queue/QueueDepthThreshold, kv/KVCacheUtilThreshold),
// where kv includes the estimated tokens routed there since the scrape,
// the pool's is their average. An endpoint with stale or missing metrics
// counts as fully saturated, so a pool that cannot be observed sheds
// sheddable work rather than piling it on.
//
// Sheddable requests are refused from SheddableThreshold on, before the
// pool is full: if they could fill it to the brim, the servers would queue
// and the requests that must not be shed would wait behind them.
type UtilizationDetector struct {
	QueueDepthThreshold  float64
	KVCacheUtilThreshold float64
	MetricsStaleness     time.Duration
	// SheddableThreshold in (0,1]; 0 means 1 (shed only when full).
	SheddableThreshold float64
}

// Saturation returns the pool's saturation at now (1.0 = at capacity).
// An empty pool is fully saturated.
func (d UtilizationDetector) Saturation(now time.Time, eps []*datastore.Endpoint) float64 {
	if len(eps) == 0 {
		return 1
	}
	total := 0.0
	for _, e := range eps {
		m := e.FreshMetrics(now, d.MetricsStaleness)
		if m == nil {
			total++
			continue
		}
		kv := m.KVCacheUsage
		// Requests routed since the scrape are not in its figures yet; a
		// burst inside one scrape interval would otherwise overfill the
		// pool before the detector sees it.
		if capacity := m.BlockSize * m.NumGPUBlocks; capacity > 0 {
			kv += float64(e.Pending()) / float64(capacity)
		}
		total += max(float64(m.WaitingQueueSize)/d.QueueDepthThreshold, kv/d.KVCacheUtilThreshold)
	}
	return total / float64(len(eps))
}

// Shed reports whether a sheddable request should be refused now.
func (d UtilizationDetector) Shed(now time.Time, eps []*datastore.Endpoint) bool {
	at := d.SheddableThreshold
	if at <= 0 {
		at = 1
	}
	return d.Saturation(now, eps) >= at
}

// Capacity is the pool's headroom for flow control: how many more requests
// it can take, assuming each one waits in an endpoint's queue (the
// conservative case), and a version that changes with the newest metrics.
// A saturated pool has none.
func (d UtilizationDetector) Capacity(now time.Time, eps []*datastore.Endpoint) (int, int64) {
	var version int64
	for _, e := range eps {
		if m := e.Metrics(); m != nil {
			version = max(version, m.UpdatedAt.UnixNano())
		}
	}
	sat := d.Saturation(now, eps)
	if sat >= 1 {
		return 0, version
	}
	// The epsilon keeps 1.9999999 from rounding down to 1.
	return max(1, int((1-sat)*d.QueueDepthThreshold*float64(len(eps))+1e-9)), version
}
