// Package flowcontrol decides whether the pool can take more work and which
// requests give way when it cannot.
package flowcontrol

import (
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// UtilizationDetector measures pool saturation from scraped metrics: each
// endpoint's saturation is max(queue/QueueDepthThreshold, kv/KVCacheUtilThreshold),
// the pool's is their average. An endpoint with stale or missing metrics
// counts as fully saturated, so a pool that cannot be observed sheds
// sheddable work rather than piling it on.
type UtilizationDetector struct {
	QueueDepthThreshold  float64
	KVCacheUtilThreshold float64
	MetricsStaleness     time.Duration
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
		total += max(float64(m.WaitingQueueSize)/d.QueueDepthThreshold, m.KVCacheUsage/d.KVCacheUtilThreshold)
	}
	return total / float64(len(eps))
}

// Saturated reports whether the pool is at or beyond capacity.
func (d UtilizationDetector) Saturated(now time.Time, eps []*datastore.Endpoint) bool {
	return d.Saturation(now, eps) >= 1
}
