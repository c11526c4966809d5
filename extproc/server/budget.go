package server

import (
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// ReasonOverloaded is the drop reason of a request refused because the
// process is at its stream cap or its buffer budget: the request itself
// may be fine, and a retry elsewhere or later may pass.
const ReasonOverloaded = "processor-overloaded"

// budget bounds what all streams of one process hold at once: the streams
// open, and the bytes buffered: request bodies as they arrive, the work of
// deciding them (decision.go), and answers made but not yet taken by the
// client. Without it each stream is bounded but their number is not, and
// a few stalled large uploads, or a client that never grants the window
// to send its answers, take the process past its memory limit, where an
// OOM kill drops every request in flight.
type budget struct {
	maxStreams  int64
	maxBuffered int64

	open, buffered atomic.Int64
	// inflight are answer bytes held until the client takes them: charged
	// whatever the budget says (the answer is made; refusing it would not
	// free it), they leave that much less for request bodies.
	inflight atomic.Int64
	// Decisions (see decision.go): deciding is the work all decisions
	// running are charged (what deciding a body holds beyond it), which
	// leaves that much less for request bodies; large is the part of it
	// that large decisions hold, at most maxBuffered/decisionShare (or
	// one decision's work alone, when that is more). turn
	// is the right to be charged next among large decisions (one slot:
	// whoever holds it may be charged, the others wait their turn in
	// order), and freed wakes its holder when a large decision ends.
	// cores holds a slot for each decision over a heavy body running (nil:
	// no bound); waiting counts the decisions that wait.
	deciding, large, waiting atomic.Int64
	turn, freed, cores       chan struct{}

	refused  *prometheus.CounterVec
	timeouts prometheus.Counter
	// idleEndings counts streams the watchdog ended, by phase: request
	// (408 before the decision) or response (after it: no message for
	// the stream idle timeout, or answers not taken).
	idleEndings *prometheus.CounterVec
	// connRefused counts streams refused for the per-connection limit.
	connRefused prometheus.Counter
}

func newBudget(l Limits, reg prometheus.Registerer) (*budget, error) {
	b := &budget{
		maxStreams:  int64(l.MaxStreams),
		maxBuffered: l.BufferBudgetBytes,
		turn:        make(chan struct{}, 1),
		freed:       make(chan struct{}, 1),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_extproc_overload_refused_total",
			Help: "Requests refused for want of the process's capacity, by the limit they met: streams and buffer (503 processor-overloaded), decision (503 processor-overloaded: no room to decide the body within the wait; 413 request-too-large: deciding it would take more than the buffer budget can hold beside its body).",
		}, []string{"limit"}),
		timeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infergate_extproc_request_idle_timeouts_total",
			Help: "Requests answered 408 request-timeout: no message for the request idle timeout before the request was decided.",
		}),
		idleEndings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_extproc_idle_endings_total",
			Help: "Streams the processor ended for want of progress, by phase: request (answered 408 before the decision) or response (after the decision: nothing received, or answers not taken, for the stream idle timeout).",
		}, []string{"phase"}),
		connRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infergate_extproc_connection_streams_refused_total",
			Help: "Streams refused with RST_STREAM REFUSED_STREAM because their connection had its limit of streams open (h2 transport; grpc-go refuses them without telling).",
		}),
	}
	if n := maxLargeDecisions(l.MaxLargeDecisions); n > 0 {
		b.cores = make(chan struct{}, n)
	}
	if reg == nil {
		return b, nil
	}
	for _, c := range []prometheus.Collector{
		b.refused,
		b.timeouts,
		b.idleEndings,
		b.connRefused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "infergate_extproc_open_streams",
			Help: "ext_proc streams open (requests in flight).",
		}, func() float64 { return float64(b.open.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "infergate_extproc_buffered_request_bytes",
			Help: "Request-body bytes all streams hold while they wait for the end of their body.",
		}, func() float64 { return float64(b.buffered.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "infergate_extproc_decision_bytes",
			Help: "Bytes charged to the request buffer budget for the decisions running: what deciding their bodies may take beyond the bodies (parse, guardrails' copies, rewritten body), as the processor bounds it.",
		}, func() float64 { return float64(b.deciding.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "infergate_extproc_decisions_waiting",
			Help: "Decisions waiting for room in the decisions' share of the request buffer budget, or, over bodies of 1 MiB or more, for a core (all but one by default).",
		}, func() float64 { return float64(b.waiting.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "infergate_extproc_answer_bytes_in_flight",
			Help: "Answer bytes made and not yet taken by the client (waiting for its HTTP/2 window), charged to the request buffer budget.",
		}, func() float64 { return float64(b.inflight.Load()) }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register ext_proc metrics: %w", err)
		}
	}
	return b, nil
}

// openStream counts a new stream; false means the process is at its cap
// and the stream must be refused (it is not counted then).
func (b *budget) openStream() bool {
	if n := b.open.Add(1); b.maxStreams > 0 && n > b.maxStreams {
		b.open.Add(-1)
		b.refused.WithLabelValues("streams").Inc()
		return false
	}
	return true
}

func (b *budget) closeStream() { b.open.Add(-1) }

// reserve takes n buffered bytes from the budget; false means it would be
// exceeded (nothing is taken then; the caller may try for less, or refuse
// the request and call refuseBuffer).
func (b *budget) reserve(n int64) bool {
	if v := b.buffered.Add(n); b.maxBuffered > 0 && v+b.inflight.Load()+b.deciding.Load() > b.maxBuffered {
		b.buffered.Add(-n)
		return false
	}
	return true
}

// reserveUpTo takes as many bytes as the budget has left, at most most,
// and returns them; 0 (nothing taken) when it has not least.
func (b *budget) reserveUpTo(least, most int64) int64 {
	if b.maxBuffered <= 0 {
		b.buffered.Add(most)
		return most
	}
	for {
		n := min(most, b.maxBuffered-b.buffered.Load()-b.inflight.Load()-b.deciding.Load())
		if n < least {
			return 0
		}
		if b.reserve(n) {
			return n
		}
		// Another stream took some meanwhile: look again.
	}
}

// hold charges n bytes of answers not yet taken, whatever the budget says;
// unhold gives them back.
func (b *budget) hold(n int64)   { b.inflight.Add(n) }
func (b *budget) unhold(n int64) { b.inflight.Add(-n) }

// refuseBuffer counts a request refused for want of buffer budget.
func (b *budget) refuseBuffer() { b.refused.WithLabelValues("buffer").Inc() }

func (b *budget) release(n int64) { b.buffered.Add(-n) }

// transportBudget is the budget as the h2 transport takes it: the bytes
// it holds of messages still arriving count with the request bodies, and
// a refusal counts as one for want of buffer.
type transportBudget struct{ b *budget }

func (t transportBudget) Reserve(n int64) bool {
	if !t.b.reserve(n) {
		t.b.refuseBuffer()
		return false
	}
	return true
}

func (t transportBudget) Release(n int64) { t.b.release(n) }
func (t transportBudget) Hold(n int64)    { t.b.hold(n) }
func (t transportBudget) Unhold(n int64)  { t.b.unhold(n) }

func overloaded(what string) *Rejection {
	return &Rejection{Status: 503, Reason: ReasonOverloaded, Message: "the gateway's processor is at its " + what + "; retry shortly"}
}
