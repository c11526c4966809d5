package payload

import "github.com/prometheus/client_golang/prometheus"

// metrics are the payload processor's Prometheus series. Their label
// values are fixed words, reasons the policy defines, or names the
// configuration spells out (labels.go): never a string a client sent, so
// clients cannot add series.
type metrics struct {
	requests *prometheus.CounterVec
	masked   *prometheus.CounterVec
	tokens   *prometheus.CounterVec
	decision prometheus.Histogram
	reloads  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_payload_requests_total",
			Help: "Requests by outcome (forwarded, rewritten: masked or clamped, rejected, passed: no body) and rejection reason.",
		}, []string{"outcome", "reason"}),
		masked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_payload_masked_total",
			Help: "Requests in which a PII rule masked something, by rule (its name; other if longer than 128 bytes).",
		}, []string{"rule"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_payload_tokens_total",
			Help: "Tokens the model servers reported in response usage, by model (a configured base model, adapter or literal allow-list entry; other for any other model) and type (prompt, completion).",
		}, []string{"model", "type"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "infergate_payload_decision_duration_seconds",
			Help:    "Time to parse a request body and apply the policy.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2, 16), // 5µs … 160ms
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_payload_config_reloads_total",
			Help: "Configuration file reloads by result (ok, error: the previous configuration stays).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.requests, m.masked, m.tokens, m.decision, m.reloads)
	return m
}
