package epp

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// Decision outcomes, the label of the decisions counter.
const (
	outcomePicked      = "picked"
	outcomeNoEndpoints = "no_endpoints"
	outcomeSubsetEmpty = "subset_no_match"
	outcomeShed        = "shed"
	outcomeBadRequest  = "bad_request"
	outcomeError       = "error"
	outcomeCancelled   = "cancelled"
)

// Matches of the served endpoint to the pick, the label of the served
// counter.
const (
	servedPrimary    = "primary"
	servedFallback   = "fallback"
	servedOther      = "other"
	servedUnreported = "unreported"
)

// metrics are the picker's Prometheus series.
type metrics struct {
	decisions *prometheus.CounterVec
	latency   prometheus.Histogram
	served    *prometheus.CounterVec
	// The counters of every label value, resolved once: looking a label
	// up hashes it and takes a lock, for every request.
	decisionsBy, servedBy map[string]prometheus.Counter
}

// decided is the decisions counter of outcome.
func (m *metrics) decided(outcome string) prometheus.Counter {
	return resolved(m.decisionsBy, m.decisions, outcome)
}

// servedAs is the served counter of match.
func (m *metrics) servedAs(match string) prometheus.Counter {
	return resolved(m.servedBy, m.served, match)
}

// resolved is the counter of label value l, from those resolved once or,
// for a value not listed there, from v.
func resolved(by map[string]prometheus.Counter, v *prometheus.CounterVec, l string) prometheus.Counter {
	if c, ok := by[l]; ok {
		return c
	}
	return v.WithLabelValues(l)
}

// counters resolves v's counter of each label value.
func counters(v *prometheus.CounterVec, values ...string) map[string]prometheus.Counter {
	out := make(map[string]prometheus.Counter, len(values))
	for _, l := range values {
		out[l] = v.WithLabelValues(l)
	}
	return out
}

func newMetrics(reg prometheus.Registerer, store *datastore.Store, staleness time.Duration, saturation func() float64) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_epp_decisions_total",
			Help: "Scheduling decisions by outcome.",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "infergate_epp_decision_duration_seconds",
			Help:    "Time from a complete request to the picker's answer.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 16), // 10µs … 330ms
		}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_epp_served_total",
			Help: "Responses by how the endpoint that served (reported by the proxy) relates to the pick: primary, fallback (later in the list), other (not picked), unreported.",
		}, []string{"match"}),
	}
	m.decisionsBy = counters(m.decisions, outcomePicked, outcomeNoEndpoints, outcomeSubsetEmpty, outcomeShed, outcomeBadRequest, outcomeError, outcomeCancelled)
	m.servedBy = counters(m.served, servedPrimary, servedFallback, servedOther, servedUnreported)
	reg.MustRegister(m.decisions, m.latency, m.served,
		&endpointCollector{store: store, staleness: staleness},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "infergate_epp_pool_saturation",
			Help: "Pool saturation from the utilization detector (1 = at capacity).",
		}, saturation),
	)
	return m
}

// endpointCollector counts endpoints by metrics state when scraped, so the
// figure is never older than the scrape.
type endpointCollector struct {
	store     *datastore.Store
	staleness time.Duration
}

var endpointsDesc = prometheus.NewDesc("infergate_epp_endpoints",
	"Endpoints by metrics state: fresh (recent metrics), stale (none or too old), scrape_failing (last scrape failed).",
	[]string{"state"}, nil)

func (c *endpointCollector) Describe(ch chan<- *prometheus.Desc) { ch <- endpointsDesc }

func (c *endpointCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	var fresh, stale, failing float64
	for _, e := range c.store.Endpoints() {
		if e.ScrapeError() != "" {
			failing++
		}
		if e.FreshMetrics(now, c.staleness) != nil {
			fresh++
		} else {
			stale++
		}
	}
	ch <- prometheus.MustNewConstMetric(endpointsDesc, prometheus.GaugeValue, fresh, "fresh")
	ch <- prometheus.MustNewConstMetric(endpointsDesc, prometheus.GaugeValue, stale, "stale")
	ch <- prometheus.MustNewConstMetric(endpointsDesc, prometheus.GaugeValue, failing, "scrape_failing")
}
