package kvevents

import "github.com/prometheus/client_golang/prometheus"

// Reasons of the dropped counter.
const (
	// A message that is not [topic, 8-byte seq, payload], or a payload
	// that does not decode (a batch).
	reasonMalformed = "malformed"
	// A payload over a decode limit, or a message over MaxMessageBytes (the
	// connection is closed then, as the rest of the stream cannot be
	// trusted).
	reasonOversized = "oversized"
	// An event of a type this package does not know (an event, skipped;
	// the rest of its batch is kept).
	reasonUnknownType = "unknown-type"
	// A batch numbered at or before the last one taken from its publisher.
	reasonOldSeq = "old-seq"
	// A connection beyond MaxPublishers in bind mode.
	reasonTooMany = "too-many-publishers"
)

// metrics are the subscriber's series, registered by the caller through
// the Subscriber, a prometheus.Collector.
type metrics struct {
	batches    *prometheus.CounterVec
	events     *prometheus.CounterVec
	dropped    *prometheus.CounterVec
	gaps       prometheus.Counter
	restarts   prometheus.Counter
	lag        prometheus.Histogram
	publishers *prometheus.GaugeVec

	// The children of the fixed label values, resolved once: a lookup
	// hashes the value and takes a lock.
	eventsBy  map[Kind]prometheus.Counter
	droppedBy map[string]prometheus.Counter
	connected prometheus.Gauge
	known     prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_epp_kv_events_batches_total",
			Help: "KV-event batches taken, by publisher (at most MaxPublishers of them).",
		}, []string{"source"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_epp_kv_events_total",
			Help: "KV events taken, by type.",
		}, []string{"type"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_epp_kv_events_dropped_total",
			Help: "KV-event messages dropped, by reason: malformed, oversized, old-seq (messages); too-many-publishers (connections refused); unknown-type (events).",
		}, []string{"reason"}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infergate_epp_kv_events_gaps_total",
			Help: "Jumps forward in a publisher's sequence numbers: batches were lost.",
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infergate_epp_kv_events_publisher_restarts_total",
			Help: "Publishers seen numbering their batches afresh.",
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "infergate_epp_kv_events_lag_seconds",
			Help:    "Time from a batch's timestamp (the publisher's clock) to its receipt; 0 if the clocks put it in the future.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		publishers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "infergate_epp_kv_events_publishers",
			Help: "Publishers: connected (live connections), known (publishers whose sequence is tracked).",
		}, []string{"state"}),
	}
	m.eventsBy = map[Kind]prometheus.Counter{}
	for _, k := range []Kind{BlockStored, BlockRemoved, AllBlocksCleared} {
		m.eventsBy[k] = m.events.WithLabelValues(k.String())
	}
	m.droppedBy = map[string]prometheus.Counter{}
	for _, r := range []string{reasonMalformed, reasonOversized, reasonUnknownType, reasonOldSeq, reasonTooMany} {
		m.droppedBy[r] = m.dropped.WithLabelValues(r)
	}
	m.connected = m.publishers.WithLabelValues("connected")
	m.known = m.publishers.WithLabelValues("known")
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.batches, m.events, m.dropped, m.gaps, m.restarts, m.lag, m.publishers}
}

// Describe implements prometheus.Collector.
func (s *Subscriber) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range s.m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (s *Subscriber) Collect(ch chan<- prometheus.Metric) {
	for _, c := range s.m.collectors() {
		c.Collect(ch)
	}
}
