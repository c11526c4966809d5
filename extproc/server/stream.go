package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// MaxChunkBytes bounds each streamed_response chunk. Some Envoy builds cap a
// streamed chunk at 64 KiB; staying below it with margin keeps every build happy.
const MaxChunkBytes = 62000

// errRejected marks a stream that ended with an immediate response.
var errRejected = errors.New("request answered with an immediate response")

// stream is the state of one ext_proc stream (one HTTP request).
type stream struct {
	out     sender
	ex      Exchange
	limits  Limits
	budget  *budget
	answers *answers
	// reserved is what this stream's buffered body holds of the budget.
	reserved int64

	// Negotiated body modes. Envoy announces them in protocol_config; when it
	// does not (older Envoy), the documented inference setup is assumed.
	reqMode, respMode filterv3.ProcessingMode_BodySendMode

	req          Request
	body         []byte
	hasBody      bool
	respMetadata Metadata
	respStatus   int

	// mu serializes message handling with the idle watchdog, which may
	// answer the request from its own goroutine while run waits in Recv.
	// After the decision the watchdog takes no lock: a handler may hold
	// mu for as long as a send waits for a client that never grants
	// window, and the watchdog is what ends that wait.
	mu sync.Mutex
	// timer is the watchdog's: set once, before it can fire, and reset
	// from its own goroutine without mu.
	timer    atomic.Pointer[time.Timer]
	over     atomic.Bool  // closed, for the watchdog, which may not take mu
	last     atomic.Int64 // the last message received, Unix nanoseconds
	decided  atomic.Bool  // the request was answered (or refused)
	timedOut bool         // the watchdog answered 408; under mu
	closed   bool         // the handler is returning: the stream is not to be used; under mu
	// idleEnd is why the watchdog ended the call after the decision; nil
	// while it has not.
	idleEnd atomic.Pointer[error]
	// endCall, set by the transport before the watchdog is armed, ends
	// the call from the watchdog's goroutine: with OK once it has answered
	// 408 (a request answered is let go by the processor, not left open,
	// holding its --max-streams slot, for as long as the client likes), or
	// with err, dropping answers the client has not taken, when the
	// stream idle timeout passes.
	endCall func(err error)
}

// ReasonRequestTimeout is the drop reason of a request that stalled
// before it was decided.
const ReasonRequestTimeout = "request-timeout"

// watch arms the stream's idle limits (Limits.RequestIdleTimeout until
// the request is decided, Limits.StreamIdleTimeout after, and before
// when the former is 0) until close; end is endCall.
func (s *stream) watch(end func(error)) {
	s.endCall = end
	tick := s.tick()
	if tick <= 0 {
		return
	}
	s.last.Store(time.Now().UnixNano())
	// Stored before it is set to fire: the watchdog resets it.
	t := time.AfterFunc(time.Hour, s.onIdle)
	s.timer.Store(t)
	t.Reset(tick)
}

// tick is the longest the watchdog may sleep and still end a stream in
// time, whichever phase it is in: the shorter of the two timeouts set.
func (s *stream) tick() time.Duration {
	r, st := s.limits.RequestIdleTimeout, s.limits.StreamIdleTimeout
	if r <= 0 || (st > 0 && st < r) {
		return st
	}
	return r
}

// close ends the stream's life: the watchdog is disarmed (one already
// running finds closed and does nothing) and the body freed.
func (s *stream) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.over.Store(true)
	if t := s.timer.Load(); t != nil {
		t.Stop()
	}
	s.releaseBody()
}

// onIdle is the watchdog. Before the decision it answers 408 a request
// that has not moved for the request idle timeout, frees its body and
// ends the call. Envoy's filter, given an immediate response, stops
// processing and closes its side (ext_proc.cc Filter::onReceiveMessage,
// kImmediateResponse: processing_complete_, closeStreamMaybeGraceful),
// and a close from the server after that is ignored
// (Filter::onGrpcCloseWithStatus returns when processing is complete); a
// client that is not Envoy is let go all the same. After the decision it
// ends a stream that has received nothing for the stream idle timeout
// (see endIdle).
func (s *stream) onIdle() {
	if s.over.Load() {
		return // closed while this waited; a Reset may have raced the Stop
	}
	if s.decided.Load() || s.limits.RequestIdleTimeout <= 0 {
		s.checkStream()
		return
	}
	s.checkRequest()
}

// checkRequest is the watchdog before the decision.
func (s *stream) checkRequest() {
	if !s.mu.TryLock() {
		// A message is being handled, so the request is moving (or being
		// decided): look again later, without waiting on it.
		s.timer.Load().Reset(s.tick())
		return
	}
	answered, end := s.answerTimeout()
	s.mu.Unlock()
	if answered && end != nil {
		end(nil)
	}
}

// answeredTimeout reports whether the idle watchdog has answered 408.
func (s *stream) answeredTimeout() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.timedOut
}

// answerTimeout answers 408 if the request is still undecided and has not
// moved for the idle timeout; it reports whether it did, and how to end
// the call. Under mu.
func (s *stream) answerTimeout() (answered bool, end func(error)) {
	if s.timedOut || s.closed {
		return false, nil
	}
	if s.decided.Load() {
		s.timer.Load().Reset(s.tick()) // checkStream from now on
		return false, nil
	}
	if wait := s.limits.RequestIdleTimeout - time.Since(time.Unix(0, s.last.Load())); wait > 0 {
		s.timer.Load().Reset(min(wait, s.tick()))
		return false, nil
	}
	s.timedOut = true
	s.releaseBody()
	s.budget.timeouts.Inc()
	s.budget.idleEndings.WithLabelValues("request").Inc()
	_ = s.out.Send(ImmediateResponse(&Rejection{Status: 408, Reason: ReasonRequestTimeout,
		Message: fmt.Sprintf("the request sent nothing for %s before its end", s.limits.RequestIdleTimeout)}))
	return true, s.endCall
}

// checkStream is the watchdog after the decision (and before it, when
// only the stream idle timeout is set). It takes no lock.
func (s *stream) checkStream() {
	d := s.limits.StreamIdleTimeout
	if d <= 0 {
		return // the request idle timeout alone: nothing to watch now
	}
	if wait := d - time.Since(time.Unix(0, s.last.Load())); wait > 0 {
		s.timer.Load().Reset(wait)
		return
	}
	s.endIdle(d)
}

// endIdle ends a stream that has received nothing for the stream idle
// timeout d: its request was decided and the proxy sends no more (it
// waits for a model that thinks for longer than any route allows, or it
// is gone), or the client does not take the answers, which hold memory
// and the stream's slot. The call ends with DEADLINE_EXCEEDED and answers
// the client has not taken are dropped. Envoy then applies the filter's
// failure mode (ext_proc.cc Filter::onGrpcError): failure_mode_allow
// goes on without the processor, otherwise the request fails; an OK
// status would have it go on without the processor whatever the mode
// (Filter::onGrpcCloseWithStatus), skipping a guardrail it requires.
func (s *stream) endIdle(d time.Duration) {
	phase := "response"
	if !s.decided.Load() {
		phase = "request"
	}
	err := status.Errorf(codes.DeadlineExceeded, "the ext_proc stream received nothing for %s (%s phase); the processor ended it", d, phase)
	if !s.idleEnd.CompareAndSwap(nil, &err) {
		return
	}
	s.budget.idleEndings.WithLabelValues(phase).Inc()
	if s.endCall != nil {
		s.endCall(err)
	}
}

// endedIdle is why the watchdog ended the call after the decision, nil
// if it has not.
func (s *stream) endedIdle() error {
	if e := s.idleEnd.Load(); e != nil {
		return *e
	}
	return nil
}

// sender is where a stream's answers go: a grpc-go stream, or an
// h2server one.
type sender interface {
	Send(*extprocv3.ProcessingResponse) error
	// SendMsg also takes a withMetadata.
	SendMsg(any) error
}

func newStream(out sender, ex Exchange, limits Limits, b *budget, answers *answers) *stream {
	return &stream{
		out:          out,
		ex:           ex,
		limits:       limits,
		budget:       b,
		answers:      answers,
		reqMode:      filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		respMode:     filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		req:          Request{Metadata: Metadata{}},
		respMetadata: Metadata{},
	}
}

// run receives and handles messages until the proxy closes the stream. It
// returns nil on a natural end or after an immediate response. The
// server's codec decodes each message into an inbound.
func (s *stream) run(ctx context.Context, in interface{ RecvMsg(any) error }) error {
	var msg inbound
	for {
		err := in.RecvMsg(&msg)
		if errors.Is(err, io.EOF) || err != nil && s.answeredTimeout() {
			return nil // the proxy's end; or the call ended after a 408
		}
		if idle := s.endedIdle(); err != nil && idle != nil {
			return idle
		}
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		if done, err := s.receive(ctx, &msg); done {
			if idle := s.endedIdle(); err != nil && idle != nil {
				return idle // a send the watchdog's end cut short
			}
			return err
		}
	}
}

// receive handles one message; done says the stream has no more to do:
// it was answered with an immediate response (err nil) or failed.
func (s *stream) receive(ctx context.Context, msg *inbound) (done bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timedOut || s.closed || s.idleEnd.Load() != nil {
		return true, nil
	}
	s.last.Store(time.Now().UnixNano())
	if pc := msg.protocol; pc != nil {
		s.reqMode, s.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	}
	err = s.handle(ctx, msg)
	if errors.Is(err, errRejected) {
		return true, nil
	}
	return err != nil, err
}

// decidesOver says whether msg makes the request's decision, over a body
// of at least n bytes: the work that grows with the body (parsing it,
// guardrails, prefix hashing) runs where the body is whole.
func (s *stream) decidesOver(msg *inbound, n int) bool {
	if msg.kind != kindRequestBody && msg.kind != kindRequestTrailers {
		return false // headers and the response path: no lock taken
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch msg.kind {
	case kindRequestBody:
		return (msg.endOfStream || s.reqMode == filterv3.ProcessingMode_BUFFERED) && len(s.body)+len(msg.body) >= n
	case kindRequestTrailers:
		return s.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && len(s.body) >= n
	}
	return false
}

func (s *stream) handle(ctx context.Context, msg *inbound) error {
	switch msg.kind {
	case kindRequestHeaders:
		mergeMetadata(s.req.Metadata, msg.metadata)
		s.req.Headers = msg.headers
		return s.onRequestHeaders(ctx, msg.endOfStream)
	case kindRequestBody:
		mergeMetadata(s.req.Metadata, msg.metadata)
		return s.onRequestBody(ctx, msg.body, msg.endOfStream)
	case kindRequestTrailers:
		mergeMetadata(s.req.Metadata, msg.metadata)
		s.req.HasTrailers = true
		return s.onRequestTrailers(ctx)
	case kindResponseHeaders:
		mergeMetadata(s.respMetadata, msg.metadata)
		return s.onResponseHeaders(ctx, msg.headers, msg.endOfStream)
	case kindResponseBody:
		mergeMetadata(s.respMetadata, msg.metadata)
		return s.onResponseBody(ctx, msg.body, msg.endOfStream)
	case kindResponseTrailers:
		mergeMetadata(s.respMetadata, msg.metadata)
		return s.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{},
		}})
	default:
		return status.Errorf(codes.InvalidArgument, "unsupported ext_proc message: no request, headers, body or trailers in it")
	}
}

func (s *stream) onRequestHeaders(ctx context.Context, endOfStream bool) error {
	if g, ok := s.ex.(HeaderGate); ok && !endOfStream && s.reqMode != filterv3.ProcessingMode_NONE {
		if rej := g.RejectEarly(ctx, &s.req); rej != nil {
			return s.reject(rej)
		}
	}
	switch {
	case endOfStream || s.reqMode == filterv3.ProcessingMode_NONE:
		// No body will come: decide now.
		return s.answerRequest(ctx, requestPhaseHeaders)
	case s.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		// Hold the headers response until the body is in; Envoy allows it
		// in this mode and it lets the decision see the body.
		return nil
	case s.reqMode == filterv3.ProcessingMode_BUFFERED || s.reqMode == filterv3.ProcessingMode_BUFFERED_PARTIAL:
		// Envoy waits for the headers response before it sends the body.
		a := s.answers.get()
		defer s.answers.put(a)
		return s.send(a.headersResponse(&Decision{}, true))
	default:
		return s.reject(&Rejection{Status: 500, Reason: "unsupported-processing-mode",
			Message: fmt.Sprintf("request body mode %s is not supported; use FULL_DUPLEX_STREAMED, BUFFERED or NONE", s.reqMode)})
	}
}

// presizeSlack bounds how far past the bytes that have arrived a
// request's content-length may size its buffer: a false announcement (a
// 1-byte upload announcing a megabyte, many of them trickling) takes at
// most this of the budget for nothing, and a true one of up to this much
// more is still buffered without a copy.
const presizeSlack = 64 << 10

// announcedBody is the body size the request's content-length announces;
// 0 when it announces none.
func (s *stream) announcedBody() int {
	n, err := strconv.ParseInt(s.req.Headers.Get("content-length"), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return int(min(n, math.MaxInt32))
}

func (s *stream) onRequestBody(ctx context.Context, chunk []byte, endOfStream bool) error {
	s.hasBody = true
	size := int64(len(s.body) + len(chunk))
	if s.limits.MaxRequestBodyBytes > 0 && size > s.limits.MaxRequestBodyBytes {
		return s.reject(&Rejection{Status: 413, Reason: "request-too-large",
			Message: fmt.Sprintf("request body exceeds the limit of %d bytes", s.limits.MaxRequestBodyBytes)})
	}
	if l, ok := s.ex.(BodyLimiter); ok {
		if rej := l.CheckBodySize(size); rej != nil {
			return s.reject(rej)
		}
	}
	if cap(s.body) == 0 && endOfStream {
		// The whole body in one message: keep the message's own bytes,
		// which unmarshalling already copied out of the transport's
		// buffers, rather than copying them once more.
		if !s.budget.reserve(int64(len(chunk))) {
			s.budget.refuseBuffer()
			return s.reject(overloaded("memory budget for request bodies"))
		}
		s.reserved += int64(len(chunk))
		s.body = chunk
	} else if need := len(s.body) + len(chunk); need > cap(s.body) {
		// Grow by doubling (capped at the body limit) and charge the
		// budget for the capacity, not the length: the allocation is what
		// the memory limit sees. A body in one chunk gets exactly its size.
		newCap := max(need, 2*cap(s.body))
		if announced := s.announcedBody(); announced >= need {
			if cap(s.body) == 0 {
				// The first chunk: size for the whole body the request
				// announces, so that it is not copied as it grows, but
				// never more than presizeSlack past what has arrived.
				newCap = min(announced, need+presizeSlack)
			} else {
				newCap = min(newCap, announced) // nor grow past it
			}
		}
		if l := s.limits.MaxRequestBodyBytes; l > 0 {
			newCap = min(newCap, int(l))
		}
		// Under pressure, grow by what the budget has left, at least what
		// this chunk needs: growing by each chunk alone copies the whole
		// body once per chunk, and near a full budget that garbage kept
		// the collector running back to back at the soft limit.
		grow := s.budget.reserveUpTo(int64(need-cap(s.body)), int64(newCap-cap(s.body)))
		if grow == 0 {
			s.releaseBody()
			s.budget.refuseBuffer()
			return s.reject(overloaded("memory budget for request bodies"))
		}
		newCap = cap(s.body) + int(grow)
		s.reserved += grow
		grown := make([]byte, len(s.body), newCap)
		copy(grown, s.body)
		s.body = append(grown, chunk...)
	} else {
		s.body = append(s.body, chunk...)
	}
	if s.reqMode == filterv3.ProcessingMode_BUFFERED {
		// A BUFFERED body comes whole in one message, which ends the
		// stream only when no trailers follow; the proxy sends those after
		// the body's answer (Envoy: processor_state.cc handleBodyResponse;
		// agentgateway's Buffered mode alike), so answer it now.
		return s.answerRequest(ctx, requestPhaseBufferedBody)
	}
	if !endOfStream {
		return nil
	}
	return s.answerRequest(ctx, requestPhaseDuplexEnd)
}

func (s *stream) onRequestTrailers(ctx context.Context) error {
	if s.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return s.answerRequest(ctx, requestPhaseDuplexEnd)
	}
	return s.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{},
	}})
}

// requestPhase says which message the request decision answers.
type requestPhase int

const (
	requestPhaseHeaders      requestPhase = iota // no body: answer the headers
	requestPhaseDuplexEnd                        // FULL_DUPLEX_STREAMED: headers, body chunks, maybe trailers
	requestPhaseBufferedBody                     // BUFFERED: the body response carries the mutation
)

func (s *stream) answerRequest(ctx context.Context, phase requestPhase) error {
	s.decided.Store(true)
	if s.hasBody {
		s.req.Body = s.body
	}
	var charge decisionCharge
	if c, ok := s.ex.(DecisionCoster); ok {
		var rej *Rejection
		var err error
		charge, rej, err = s.budget.chargeDecision(ctx, decisionRequest{n: c.DecisionCost(&s.req), body: len(s.req.Body)}, s.decisionWait())
		if err != nil {
			s.releaseBody()
			return fmt.Errorf("wait for room to decide the request: %w", err)
		}
		if rej != nil {
			s.releaseBody()
			return s.reject(rej)
		}
	}
	d := s.ex.HandleRequest(ctx, &s.req)
	// The decision's work is garbage once it returns; what it keeps (a
	// rewritten body) is charged below as answers in flight.
	s.budget.uncharge(charge)
	if d == nil {
		d = &Decision{}
	}
	if d.Reject != nil {
		s.releaseBody()
		return s.reject(d.Reject)
	}
	// The decision is made: the body is not buffered waiting any more,
	// but it, and a body the decision made, are held until the answers
	// that carry them are sent, so they stay charged as answers in flight
	// until then. On grpc-go a send waits while the client grants no
	// window (internal/transport http2_server.go write: s.wq.get), and
	// this goroutine holds both meanwhile; on h2 a send returns at once
	// and the transport charges what waits for window itself.
	held := s.reserved + int64(len(d.Body))
	s.budget.hold(held)
	defer s.budget.unhold(held)
	s.releaseBody()
	body := s.req.Body
	// Nor does the stream keep it once the answers are sent: it may stay
	// open for as long as the response streams.
	s.req.Body = nil
	if d.Body != nil {
		body = d.Body
		if s.req.Headers.Get("content-length") != "" {
			d.SetHeaders = append(d.SetHeaders, Header{Name: "content-length", Value: strconv.Itoa(len(body))})
		}
	}
	a := s.answers.get()
	defer s.answers.put(a)
	switch phase {
	case requestPhaseHeaders:
		return s.sendDecision(a, a.headersResponse(d, true), d)
	case requestPhaseBufferedBody:
		common := a.commonResponse(d)
		if d.Body != nil {
			common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: d.Body}}
		}
		return s.sendDecision(a, a.bodyResponse(common, true), d)
	}
	// FULL_DUPLEX_STREAMED: headers response, then the body re-emitted in
	// bounded chunks, then the trailers response if the request had trailers.
	if err := s.sendDecision(a, a.headersResponse(d, true), d); err != nil {
		return err
	}
	if err := s.sendStreamedBody(a, body, !s.req.HasTrailers, true, nil); err != nil {
		return err
	}
	if s.req.HasTrailers {
		return s.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{},
		}})
	}
	return nil
}

// decisionWait bounds how long a large decision waits for room in the
// budget: the request idle timeout, as it bounds the wait for a decision
// from the client's side (the idle watchdog does not answer 408 while a
// message is being handled), or the stream idle timeout when that is off.
func (s *stream) decisionWait() time.Duration {
	if d := s.limits.RequestIdleTimeout; d > 0 {
		return d
	}
	return s.limits.StreamIdleTimeout
}

func (s *stream) onResponseHeaders(ctx context.Context, headers Headers, endOfStream bool) error {
	s.respStatus, _ = strconv.Atoi(headers.Get(":status"))
	d := s.ex.HandleResponseHeaders(ctx, &Response{Headers: headers, Metadata: s.respMetadata, EndOfStream: endOfStream})
	if d == nil {
		d = &Decision{}
	}
	if d.Reject != nil {
		return s.reject(d.Reject)
	}
	a := s.answers.get()
	defer s.answers.put(a)
	return s.sendDecision(a, a.headersResponse(d, false), d)
}

func (s *stream) onResponseBody(ctx context.Context, body []byte, endOfStream bool) error {
	out, md := s.ex.HandleResponseBody(ctx, body, endOfStream)
	// Held until sent, as the request's answers are (answerRequest).
	held := int64(len(out))
	s.budget.hold(held)
	defer s.budget.unhold(held)
	if s.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		a := s.answers.get()
		defer s.answers.put(a)
		return s.sendStreamedBody(a, out, endOfStream, false, md)
	}
	resp := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}
	if !bytes.Equal(out, body) {
		resp.Response.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}
	}
	return s.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: resp}, DynamicMetadata: md})
}

// sendStreamedBody re-emits body as streamed_response chunks of at most
// MaxChunkBytes; endOfStream is set on the last chunk only, and md (if
// any) rides on it. An empty body still produces one message so the end of
// stream reaches the proxy.
func (s *stream) sendStreamedBody(a *answer, body []byte, endOfStream, request bool, md *structpb.Struct) error {
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), MaxChunkBytes)
		chunk := body[:n]
		body = body[n:]
		resp := a.streamedBody(chunk, endOfStream && len(body) == 0, request)
		if len(body) == 0 {
			resp.DynamicMetadata = md
		}
		if err := s.send(resp); err != nil {
			return err
		}
	}
	return nil
}

// releaseBody frees the buffered body and returns its bytes to the budget.
func (s *stream) releaseBody() {
	s.budget.release(s.reserved)
	s.reserved = 0
	s.body = nil
}

func (s *stream) reject(r *Rejection) error {
	s.decided.Store(true)
	if err := s.send(ImmediateResponse(r)); err != nil {
		return err
	}
	return errRejected
}

func (s *stream) send(resp *extprocv3.ProcessingResponse) error {
	if err := s.out.Send(resp); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// sendDecision sends resp, the answer built in a that carries d, with d's
// dynamic metadata: encoded once and appended as it is, or set on resp.
func (s *stream) sendDecision(a *answer, resp *extprocv3.ProcessingResponse, d *Decision) error {
	if d.EncodedMetadata == nil {
		resp.DynamicMetadata = d.DynamicMetadata
		return s.send(resp)
	}
	a.withMD = withMetadata{resp: resp, md: d.EncodedMetadata}
	if err := s.out.SendMsg(&a.withMD); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

func (s *stream) summary(err error) Summary {
	return Summary{ResponseMetadata: s.respMetadata, ResponseStatus: s.respStatus, Err: err}
}

func mergeMetadata(dst Metadata, md *corev3.Metadata) {
	for ns, st := range md.GetFilterMetadata() {
		if cur, ok := dst[ns]; ok && cur != nil {
			if cur.Fields == nil {
				cur.Fields = map[string]*structpb.Value{}
			}
			for k, v := range st.GetFields() {
				cur.Fields[k] = v
			}
			continue
		}
		dst[ns] = st
	}
}
