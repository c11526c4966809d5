package peers

import "github.com/prometheus/client_golang/prometheus"

// Reasons a decision meant for a peer, or a message from one, was dropped.
const (
	dropQueueFull  = "queue-full"  // decisions came faster than the flushes sent them
	dropPeerBehind = "peer-behind" // a peer's batches backed up (slow or unreachable)
	dropSendFailed = "send-failed" // memberlist could not send to a peer
	dropMalformed  = "malformed"   // a message that did not decode (another version)
)

type metrics struct {
	peers             prometheus.Gauge
	decisionsSent     prometheus.Counter
	decisionsReceived prometheus.Counter
	messages          *prometheus.CounterVec
	bytes             *prometheus.CounterVec
	dropped           *prometheus.CounterVec
	lag               prometheus.Histogram
	stateBytes        *prometheus.CounterVec
	merges            *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		peers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "infergate_epp_peers",
			Help: "Other picker replicas this one sees alive.",
		}),
		decisionsSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infergate_epp_peer_decisions_sent_total",
			Help: "Routing decisions sent to peers (one per peer each).",
		}),
		decisionsReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infergate_epp_peer_decisions_received_total",
			Help: "Routing decisions received from peers and learned.",
		}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_epp_peer_messages_total",
			Help: "Batches of decisions sent to and received from peers, by transport (received: any).",
		}, []string{"direction", "transport"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_epp_peer_bytes_total",
			Help: "Bytes of decision batches sent to and received from peers.",
		}, []string{"direction"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_epp_peer_dropped_total",
			Help: "Decisions not sent to a peer, and peer messages not learned, by reason: queue-full, peer-behind, send-failed, malformed.",
		}, []string{"reason"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "infergate_epp_peer_lag_seconds",
			Help:    "Time from a peer's flush to this replica learning the batch (across hosts, includes their clocks' offset).",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
		}),
		stateBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_epp_peer_state_bytes_total",
			Help: "Learned state given to and taken from peers when a replica joins.",
		}, []string{"direction"}),
		merges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_epp_peer_state_merges_total",
			Help: "Peers' states merged when joining, by result (ok, error).",
		}, []string{"result"}),
	}
	for _, r := range []string{dropQueueFull, dropPeerBehind, dropSendFailed, dropMalformed} {
		m.dropped.WithLabelValues(r)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.peers, m.decisionsSent, m.decisionsReceived, m.messages, m.bytes, m.dropped, m.lag, m.stateBytes, m.merges}
}

// Describe implements prometheus.Collector.
func (n *Node) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range n.m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (n *Node) Collect(ch chan<- prometheus.Metric) {
	for _, c := range n.m.collectors() {
		c.Collect(ch)
	}
}
