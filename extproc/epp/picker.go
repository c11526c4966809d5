package epp

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/epp/flowcontrol"
	"github.com/infergate/infergate/extproc/epp/scheduling"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference"
	"github.com/infergate/infergate/inference/wire"
)

// Options configure a Picker.
type Options struct {
	// Store is the pool: its endpoints, and the objectives and model
	// rewrites in effect, read afresh for every request.
	Store      *datastore.Store
	Scheduler  *scheduling.Scheduler
	Saturation flowcontrol.UtilizationDetector
	// Queue, when set, holds requests while the pool is full (late
	// binding); without it only sheddable requests give way, with 429.
	Queue *flowcontrol.Queue
	// MetricsStaleness: older endpoint metrics count as unknown to scorers.
	MetricsStaleness time.Duration
	// EmitScores adds each target's score to the envoy.lb metadata.
	EmitScores bool
	// ConformanceTest makes the picker the test picker the upstream
	// InferencePool conformance suite expects: each pick also asks the
	// echo server to report it (wire.EchoSetHeader), and every response
	// carries the endpoint the proxy says served it
	// (wire.ConformanceServedHeader), or why it cannot.
	ConformanceTest bool
	Registerer      prometheus.Registerer
	Logger          logr.Logger
	// Peers, when set, is told every decision, for the picker's other
	// replicas to learn from (package peers).
	Peers Sharer
}

// Sharer passes decisions on to the picker's other replicas. Share must
// not block: a decision never waits on the network.
type Sharer interface {
	Share(d scheduling.Shared)
}

// Picker is the endpoint picker's ext_proc handler.
type Picker struct {
	opts    Options
	metrics *metrics
	picks   []scheduling.PickObserver
	served  []scheduling.ServedObserver
	peers   []scheduling.PeerObserver
	holders []stateHolder
	seq     atomic.Uint64
	// lbCache holds the envoy.lb metadata of recent destination values
	// (value → *server.EncodedMetadata), lbCached how many were stored
	// since it was last cleared.
	lbCache  sync.Map
	lbCached atomic.Int64
}

// maxCachedMetadata bounds lbCache: a pool's single picks and the fallback
// lists it answers most come to far fewer.
const maxCachedMetadata = 4096

// lbMetadata is the dynamic metadata naming value as the destination in
// the envoy.lb namespace. It depends on value alone, so it is built and
// encoded once per value and shared by the answers that carry it. Building
// it was two maps and four messages per request, and encoding it a tenth
// of the picker's CPU.
func (p *Picker) lbMetadata(value string) (*server.EncodedMetadata, error) {
	if md, ok := p.lbCache.Load(value); ok {
		return md.(*server.EncodedMetadata), nil
	}
	md, err := server.EncodeMetadata(lbStruct(map[string]*structpb.Value{wire.DestinationEndpointKey: structpb.NewStringValue(value)}))
	if err != nil {
		return nil, err
	}
	if p.lbCached.Add(1) > maxCachedMetadata {
		p.lbCache.Clear()
		p.lbCached.Store(1)
	}
	p.lbCache.Store(value, md)
	return md, nil
}

// lbStruct puts fields in the envoy.lb namespace.
func lbStruct(fields map[string]*structpb.Value) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{wire.LBNamespace: structpb.NewStructValue(&structpb.Struct{Fields: fields})}}
}

// New builds a Picker.
func New(opts Options) (*Picker, error) {
	if opts.Store == nil || opts.Scheduler == nil {
		return nil, errors.New("epp: store and scheduler are required")
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	p := &Picker{opts: opts}
	if q := opts.Queue; q != nil {
		opts.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "infergate_epp_flow_control_queue_size",
			Help: "Requests waiting in flow control for the pool to have room.",
		}, func() float64 { return float64(q.Len()) }))
	}
	p.metrics = newMetrics(opts.Registerer, opts.Store, opts.MetricsStaleness, func() float64 {
		return opts.Saturation.Saturation(time.Now(), opts.Store.Endpoints())
	})
	for _, pl := range opts.Scheduler.Plugins() {
		if o, ok := pl.(scheduling.PickObserver); ok {
			p.picks = append(p.picks, o)
		}
		if o, ok := pl.(scheduling.ServedObserver); ok {
			p.served = append(p.served, o)
		}
		if o, ok := pl.(scheduling.PeerObserver); ok {
			p.peers = append(p.peers, o)
		}
		if h, ok := pl.(scheduling.StateHolder); ok {
			p.holders = append(p.holders, stateHolder{name: pl.Name(), StateHolder: h})
		}
		if l, ok := pl.(scheduling.Logging); ok {
			l.SetLogger(opts.Logger.WithName(pl.Name()))
		}
		// Plugins with state worth watching (the prefix index) export it.
		if c, ok := pl.(prometheus.Collector); ok {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("epp: metrics of plugin %s: %w", pl.Name(), err)
			}
		}
	}
	return p, nil
}

// MayBlock implements server.Blocker: with flow control a request waits
// in the queue until the pool has room.
func (p *Picker) MayBlock() bool { return p.opts.Queue != nil }

// NewExchange implements server.Handler.
func (p *Picker) NewExchange(context.Context) server.Exchange {
	return &exchange{p: p}
}

// exchange is one request's pass through the picker.
type exchange struct {
	p      *Picker
	req    *scheduling.Request
	picked []string
	served string
}

func (x *exchange) HandleRequest(ctx context.Context, r *server.Request) *server.Decision {
	start := time.Now()
	d, outcome := x.decide(ctx, r, start)
	x.p.metrics.decided(outcome).Inc()
	x.p.metrics.latency.Observe(time.Since(start).Seconds())
	x.forgetBody()
	return d
}

// forgetBody lets go of the request's body once it is decided. The
// exchange lives as long as the response streams (minutes), and the
// server lets go of the body once its answers are sent, charging it to
// the request buffer budget until then only: kept here it would stay in
// memory outside the budget; so would the prompt text parsed from it,
// of which only the length is kept (ForgetPrompt). What the observers of
// Served read later is taken already: that length and the prefix match.
// Body stays non-nil, as observers tell a request that had one by it.
func (x *exchange) forgetBody() {
	if x.req != nil && x.req.Body != nil {
		x.req.Body, x.req.Parsed = []byte{}, nil // not nil; a zero-size slice allocates nothing
		x.req.ForgetPrompt()
	}
}

func (x *exchange) decide(ctx context.Context, r *server.Request, now time.Time) (*server.Decision, string) {
	p := x.p
	req := &scheduling.Request{
		ID:      r.Headers.Get("x-request-id"),
		Headers: r.Headers,
		Body:    r.Body,
	}
	if req.ID == "" {
		req.ID = strconv.FormatUint(p.seq.Add(1), 10)
	}
	rewritten, err := p.readBody(req)
	if err != nil {
		return reject(400, ReasonBadRequest, err.Error()), outcomeBadRequest
	}
	objective, priority := p.objective(r.Headers)
	req.Priority = priority
	req.FairnessID = firstHeader(r.Headers, wire.FairnessHeader, wire.LegacyFairnessHeader)
	x.req = req

	all := p.opts.Store.Endpoints()
	if len(all) == 0 {
		return reject(503, ReasonNoEndpoints, "the pool has no ready endpoints"), outcomeNoEndpoints
	}
	candidates, rej := p.candidates(r.Metadata, all, now)
	if rej != nil {
		return rej, outcomeSubsetEmpty
	}
	if p.opts.ConformanceTest && r.Headers.Get(wire.ShedTestHeader) != "" {
		return &server.Decision{Reject: shedRejection(objective)}, outcomeShed
	}
	if q := p.opts.Queue; q != nil {
		if err := q.Admit(ctx, req.Priority, req.FairnessID); err != nil {
			return admissionRejection(err)
		}
		// Waiting may have taken a while: judge freshness from now.
		now = time.Now()
		for i := range candidates {
			candidates[i].Metrics = candidates[i].FreshMetrics(now, p.opts.MetricsStaleness)
		}
	} else if rej := p.shed(now, all, objective, req.Priority); rej != nil {
		return &server.Decision{Reject: rej}, outcomeShed
	}

	res, err := p.opts.Scheduler.Schedule(ctx, req, candidates)
	if err != nil {
		if errors.Is(err, scheduling.ErrNoCandidates) {
			return reject(503, ReasonNoEndpoints, err.Error()), outcomeNoEndpoints
		}
		p.opts.Logger.Error(err, "scheduling failed", "request", req.ID)
		return reject(503, ReasonNoEndpoints, "scheduling failed"), outcomeError
	}
	return x.answer(ctx, r.Headers, res, candidates, rewritten)
}

// readBody sets req's model from its body, rewritten when a model rewrite
// in effect says so: rewritten is the new body then. One validating pass
// reads the model now and the prompt later, if the profile reads it. An
// error is a body the picker cannot read.
func (p *Picker) readBody(req *scheduling.Request) (rewritten []byte, err error) {
	if req.Body == nil {
		return nil, nil
	}
	parsed, err := inference.Parse(req.Body)
	if err != nil {
		return nil, err
	}
	model, err := parsed.Model()
	if err != nil {
		return nil, err
	}
	req.Model, req.Parsed = model, parsed
	rule, ok := p.opts.Store.ModelRewrite(model)
	if !ok {
		return nil, nil
	}
	to, ok := rule.Pick(rand.IntN)
	if !ok || to == model {
		return nil, nil
	}
	if rewritten, err = rewriteModel(req.Body, to); err != nil {
		return nil, err
	}
	req.Model, req.Body, req.Parsed = to, rewritten, nil
	return rewritten, nil
}

// candidates are the endpoints of the pool the proxy's subset hint in md
// allows (all of them without one), with their metrics as fresh at now.
// When the hint allows none, the request is refused with the decision.
func (p *Picker) candidates(md server.Metadata, all []*datastore.Endpoint, now time.Time) ([]scheduling.Endpoint, *server.Decision) {
	candidates := make([]scheduling.Endpoint, 0, len(all))
	hint := readSubsetHint(md)
	for _, e := range all {
		if hint != nil && !hint.Allows(e) {
			continue
		}
		candidates = append(candidates, scheduling.Endpoint{Endpoint: e, Metrics: e.FreshMetrics(now, p.opts.MetricsStaleness)})
	}
	if hint != nil && len(candidates) == 0 {
		msg := "the proxy's endpoint subset matches no endpoint of the pool"
		if hint.Empty() {
			msg = "the proxy sent an empty endpoint subset"
		}
		return nil, reject(503, ReasonNoEndpoints, msg)
	}
	return candidates, nil
}

// answer sends the request to the scheduler's pick, with the body
// rewritten if it was, and tells the plugins that learn from picks.
func (x *exchange) answer(ctx context.Context, h server.Headers, res *scheduling.Result, candidates []scheduling.Endpoint, rewritten []byte) (*server.Decision, string) {
	p, req := x.p, x.req
	targets := res.Targets()
	x.picked = make([]string, len(targets))
	for i, t := range targets {
		x.picked[i] = t.Address
	}
	if p.opts.ConformanceTest && h.Get(wire.FallbackTestHeader) != "" {
		x.picked = inSelectionOrder(h.Get(wire.EndpointSelectionHeader), candidates)
	}
	for _, o := range p.picks {
		o.Picked(ctx, req, res)
	}
	addPending(targets[0].Endpoint.Endpoint, req.PromptLen())
	if p.opts.Peers != nil {
		p.opts.Peers.Share(scheduling.SharedOf(req, targets[0].Address))
	}
	value := strings.Join(x.picked, ",")
	d := &server.Decision{Body: rewritten, ClearRouteCache: true}
	if p.opts.EmitScores {
		d.DynamicMetadata = scoresMetadata(value, res)
	} else {
		var err error
		if d.EncodedMetadata, err = p.lbMetadata(value); err != nil {
			p.opts.Logger.Error(err, "destination metadata", "request", req.ID)
			return reject(503, ReasonNoEndpoints, "scheduling failed"), outcomeError
		}
	}
	if log := p.opts.Logger.V(1); log.Enabled() {
		log.Info("picked", "request", req.ID, "model", req.Model, "targets", value, "profile", res.Primary, "score", targets[0].Score)
	}
	// Overwrite: a client-supplied destination header must never survive.
	d.SetHeaders = []server.Header{{Name: wire.DestinationEndpointKey, Value: value}}
	if p.opts.ConformanceTest {
		d.SetHeaders = append(d.SetHeaders, server.Header{Name: wire.EchoSetHeader, Value: wire.ConformanceServedHeader + ":" + x.picked[0]})
	}
	return d, outcomePicked
}

// scoresMetadata is the envoy.lb metadata naming value as the destination,
// with every candidate's score, not only the targets', so a reader can see
// what the pick won against.
func scoresMetadata(value string, res *scheduling.Result) *structpb.Struct {
	scores := map[string]*structpb.Value{}
	for _, c := range res.Profiles[res.Primary].Candidates {
		scores[c.Address] = structpb.NewNumberValue(c.Score)
	}
	return lbStruct(map[string]*structpb.Value{
		wire.DestinationEndpointKey: structpb.NewStringValue(value),
		wire.ScoresKey:              structpb.NewStructValue(&structpb.Struct{Fields: scores}),
	})
}

// RejectEarly implements server.HeaderGate: without flow control, whether
// a request is shed depends on its objective header and the pool alone, so
// a saturated pool refuses sheddable requests before their bodies stream
// through the proxy and the picker. A burst of refused requests then costs
// a few headers each. With flow control, admission waits for the whole
// request, which may queue.
func (x *exchange) RejectEarly(_ context.Context, r *server.Request) *server.Rejection {
	p := x.p
	if p.opts.Queue != nil {
		return nil
	}
	all := p.opts.Store.Endpoints()
	if len(all) == 0 { // 503 once the body is in, like any request
		return nil
	}
	objective, priority := p.objective(r.Headers)
	rej := p.shed(time.Now(), all, objective, priority)
	if rej != nil {
		p.metrics.decided(outcomeShed).Inc()
	}
	return rej
}

// shed returns the 429 for a sheddable request while the pool is saturated,
// or nil.
func (p *Picker) shed(now time.Time, all []*datastore.Endpoint, objective string, priority int) *server.Rejection {
	if priority >= 0 || !p.opts.Saturation.Shed(now, all) {
		return nil
	}
	return shedRejection(objective)
}

func shedRejection(objective string) *server.Rejection {
	return &server.Rejection{
		Status: 429, Reason: ReasonSaturated, Message: fmt.Sprintf("pool saturated; objective %q is sheddable", objective),
		Headers: retryAfter(),
	}
}

// Retry-After on a shed request. Clients refused together would otherwise
// come back together: a flood of sheddable work refused in one burst
// returns as the next burst. The pause is spread over
// [RetryAfterMin, RetryAfterMax) so that clients which honour it (the
// OpenAI SDKs read retry-after-ms, and retry-after in whole seconds) return
// spread out; the whole seconds are rounded up.
const (
	RetryAfterMin = 500 * time.Millisecond
	RetryAfterMax = 1500 * time.Millisecond
)

func retryAfter() []server.Header {
	// Whole milliseconds, so both headers state the same pause: 1000.4ms
	// would otherwise read as retry-after-ms 1000 but retry-after 2.
	d := (RetryAfterMin + rand.N(RetryAfterMax-RetryAfterMin)).Truncate(time.Millisecond)
	return []server.Header{
		{Name: "retry-after", Value: strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)},
		{Name: "retry-after-ms", Value: strconv.FormatInt(d.Milliseconds(), 10)},
	}
}

func admissionRejection(err error) (*server.Decision, string) {
	switch {
	case errors.Is(err, flowcontrol.ErrTTLExpired):
		return reject(429, ReasonTTLExpired, err.Error()), outcomeShed
	case errors.Is(err, flowcontrol.ErrQueueFull):
		return reject(429, ReasonSaturated, err.Error()), outcomeShed
	default: // the client went away while waiting
		return reject(503, ReasonCancelled, err.Error()), outcomeCancelled
	}
}

func reject(status int, reason, msg string) *server.Decision {
	return &server.Decision{Reject: &server.Rejection{Status: status, Reason: reason, Message: msg}}
}

// objective names the request's objective and its priority (0 when the
// objective is unknown or absent).
func (p *Picker) objective(h server.Headers) (string, int) {
	name := firstHeader(h, wire.ObjectiveHeader, wire.LegacyObjectiveHeader)
	o, _ := p.opts.Store.Objective(name)
	return name, o.Priority
}

func firstHeader(h server.Headers, names ...string) string {
	for _, n := range names {
		if v := h.Get(n); v != "" {
			return v
		}
	}
	return ""
}

func (x *exchange) HandleResponseHeaders(ctx context.Context, r *server.Response) *server.Decision {
	x.noteServed(ctx, r.Metadata)
	if !x.p.opts.ConformanceTest {
		return nil
	}
	// The suite compares this with the endpoint it steered to: the value
	// must come from the proxy's report, not from the pick.
	served := "fail: missing envoy lb metadata"
	if lb, ok := r.Metadata[wire.LBNamespace]; ok {
		served = "fail: missing destination endpoint served metadata"
		if v, ok := lb.GetFields()[wire.ServedEndpointKey]; ok {
			served = v.GetStringValue()
		}
	}
	return &server.Decision{SetHeaders: []server.Header{{Name: wire.ConformanceServedHeader, Value: served}}}
}

func (x *exchange) HandleResponseBody(_ context.Context, chunk []byte, _ bool) ([]byte, *structpb.Struct) {
	return chunk, nil
}

func (x *exchange) Close(ctx context.Context, s server.Summary) {
	if x.picked == nil {
		return // rejected or never decided: nothing was routed
	}
	x.noteServed(ctx, s.ResponseMetadata)
	match := servedUnreported
	switch {
	case x.served == "":
	case x.served == x.picked[0]:
		match = servedPrimary
	case slices.Contains(x.picked[1:], x.served):
		match = servedFallback
	default:
		match = servedOther
	}
	x.p.metrics.servedAs(match).Inc()
}

// noteServed records the served endpoint the first time the proxy reports
// it (usually with the response headers) and tells the learning plugins
// at once, so the next requests benefit before this response ends.
func (x *exchange) noteServed(ctx context.Context, md server.Metadata) {
	if x.served != "" || x.picked == nil {
		return
	}
	v := md[wire.LBNamespace].GetFields()[wire.ServedEndpointKey]
	if v == nil {
		return
	}
	x.served = strings.TrimSpace(v.GetStringValue())
	if x.served == "" {
		return
	}
	for _, o := range x.p.served {
		o.Served(ctx, x.req, x.picked, x.served)
	}
	if x.p.opts.Peers != nil && x.served != x.picked[0] {
		d := scheduling.SharedOf(x.req, x.served)
		d.From = x.picked[0]
		x.p.opts.Peers.Share(d)
	}
}

// inSelectionOrder is every candidate a selection list (IPs or ip:port,
// comma-separated) names, in the list's order: the conformance-test
// picker's answer to a request asking for the list as a pick and its
// fallbacks.
func inSelectionOrder(list string, candidates []scheduling.Endpoint) []string {
	var out []string
	for _, entry := range strings.Split(list, ",") {
		one := datastore.NewAddressSet()
		one.Add(strings.TrimSpace(entry))
		for _, c := range candidates {
			if one.Allows(c.Endpoint) && !slices.Contains(out, c.Address) {
				out = append(out, c.Address)
			}
		}
	}
	return out
}
