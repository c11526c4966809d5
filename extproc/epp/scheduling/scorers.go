package scheduling

import (
	"context"
	"math"
)

// Scorer plugin types.
const (
	QueueScorerType               = "queue-scorer"
	KVCacheUtilizationScorerType  = "kv-cache-utilization-scorer"
	RunningRequestsSizeScorerType = "running-requests-size-scorer"
	LoRAAffinityScorerType        = "lora-affinity-scorer"
)

// fillUnknown sets the score of every endpoint whose metrics are unknown
// (never scraped, stale, or failing) to the mean of the known scores (0.5
// when none is known): such an endpoint neither wins nor loses on a signal
// it cannot report, so it keeps receiving traffic by the other signals.
// Every built-in scorer of metrics ends with it.
func fillUnknown(eps []Endpoint, scores []float64) {
	sum, n := 0.0, 0
	for i, e := range eps {
		if e.Metrics != nil {
			sum += scores[i]
			n++
		}
	}
	if n == len(eps) {
		return
	}
	fill := 0.5
	if n > 0 {
		fill = sum / float64(n)
	}
	for i, e := range eps {
		if e.Metrics == nil {
			scores[i] = fill
		}
	}
}

// minMaxLower scores value v low-is-better: (max−v)/(max−min), 1 when all equal.
func minMaxLower(eps []Endpoint, scores []float64, value func(*Endpoint) float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range eps {
		if eps[i].Metrics == nil {
			continue
		}
		v := value(&eps[i])
		lo, hi = min(lo, v), max(hi, v)
	}
	for i := range eps {
		if eps[i].Metrics == nil {
			continue
		}
		if hi == lo {
			scores[i] = 1
			continue
		}
		scores[i] = (hi - value(&eps[i])) / (hi - lo)
	}
	fillUnknown(eps, scores)
}

// queueScorer prefers the endpoints with the shortest waiting queue.
type queueScorer struct{ named }

func (queueScorer) Score(_ context.Context, _ *Request, eps []Endpoint, scores []float64) {
	minMaxLower(eps, scores, func(e *Endpoint) float64 { return float64(e.Metrics.WaitingQueueSize) })
}

// runningScorer prefers the endpoints running the fewest requests.
type runningScorer struct{ named }

func (runningScorer) Score(_ context.Context, _ *Request, eps []Endpoint, scores []float64) {
	minMaxLower(eps, scores, func(e *Endpoint) float64 { return float64(e.Metrics.RunningRequests) })
}

// kvCacheScorer prefers the endpoints with the most free KV cache.
type kvCacheScorer struct{ named }

func (kvCacheScorer) Score(_ context.Context, _ *Request, eps []Endpoint, scores []float64) {
	for i, e := range eps {
		if e.Metrics != nil {
			scores[i] = 1 - e.Metrics.KVCacheUsage
		}
	}
	fillUnknown(eps, scores)
}

// loraAffinityScorer prefers servers where the requested adapter already
// runs, then servers with room to load it, then servers where it waits.
type loraAffinityScorer struct{ named }

func (loraAffinityScorer) Score(_ context.Context, req *Request, eps []Endpoint, scores []float64) {
	for i, e := range eps {
		m := e.Metrics
		if m == nil {
			continue
		}
		_, active := m.ActiveAdapters[req.Model]
		_, waiting := m.WaitingAdapters[req.Model]
		switch {
		case active:
			scores[i] = 1
		case len(m.ActiveAdapters) < m.MaxActiveAdapters:
			scores[i] = 0.8
		case waiting:
			scores[i] = 0.6
		default:
			scores[i] = 0
		}
	}
	fillUnknown(eps, scores)
}
