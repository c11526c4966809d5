package extprocfilter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/infergate/infergate/inference/wire"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// closeGrace is how long Close waits for the server to end a finished stream
// after the half-close, so servers see io.EOF rather than a cancellation.
const closeGrace = time.Second

// Exchange is one ext_proc stream serving one HTTP request, as Envoy opens
// one per request per filter. The request path (Request) and the response
// path (Response) share it.
type Exchange struct {
	cfg       FilterConfig
	client    *Client
	conn      *grpc.ClientConn // chosen when the stream starts
	ctx       context.Context  // the HTTP request's
	streamCtx context.Context
	cancel    context.CancelFunc

	startOnce sync.Once
	startErr  error
	openOnce  sync.Once
	openErr   error
	recvDone  chan struct{}

	sendMu  sync.Mutex // grpc allows one sender at a time
	stream  extprocv3.ExternalProcessor_ProcessClient
	sentAny bool

	mu         sync.Mutex
	req, resp  direction
	term       error // nil while live; errSkipped, *LocalReply, ErrClosed or an abort cause after
	failedOpen error
	// bodyReceived: body data of a FULL_DUPLEX_STREAMED direction has
	// reached the filter (Envoy's ProcessorState::bodyReceived, set by
	// Filter::onData whether or not the data could be sent yet); from then
	// on failure_mode_allow no longer applies (ProcessorState::canFailOpen).
	bodyReceived    bool
	awaiting        int // responses owed in directions that have a message timeout
	timer           *time.Timer
	log             []*extprocv3.ProcessingResponse
	metadata        map[string]*structpb.Struct
	clearRouteCache bool
	headerMutated   bool
}

// direction is the state of one path (request or response) of an exchange.
type direction struct {
	response    bool
	headerMode  filterv3.ProcessingMode_HeaderSendMode
	bodyMode    filterv3.ProcessingMode_BodySendMode
	trailerMode filterv3.ProcessingMode_HeaderSendMode
	metadata    map[string]*structpb.Struct

	started bool
	headers Headers // mutated in place as responses arrive
	input   Body    // nil when the message has no body
	out     *pipe   // processed body, when the body goes to the server
	handoff chan Body
	// headersSent is closed once the headers message was handed to the
	// stream (or will not be): body messages follow it. reading is closed
	// as the first read of a FULL_DUPLEX_STREAMED body begins, firstRead
	// once it returned.
	headersSent chan struct{}
	reading     chan struct{}
	firstRead   chan struct{}
	// sentAll: the whole body went to the server; handedOff: the consumer
	// got what follows the processed part (handOff).
	sentAll, handedOff bool

	headersOwed   bool
	headersDone   bool
	answered      chan struct{} // closed with headersDone
	delivered     bool
	outcome       chan outcome
	chunksSent    int
	bodyDone      bool // the server has finished the body
	bufferedOwed  bool
	buffered      []byte
	trailersSent  bool
	trailersOwed  bool
	trailers      Headers
	complete      chan struct{}
	completeClose bool
}

type outcome struct {
	headers Headers
	body    Body
	err     error
}

func newDirection(response bool, h, t filterv3.ProcessingMode_HeaderSendMode, b filterv3.ProcessingMode_BodySendMode) direction {
	return direction{
		response: response, headerMode: h, bodyMode: b, trailerMode: t,
		answered: make(chan struct{}), outcome: make(chan outcome, 1), complete: make(chan struct{}),
	}
}

func (d *direction) name() string {
	if d.response {
		return "response"
	}
	return "request"
}

func (d *direction) duplex() bool { return d.bodyMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED }

func (d *direction) involved() bool {
	return d.headerMode == filterv3.ProcessingMode_SEND || d.bodyMode != filterv3.ProcessingMode_NONE
}

// owed reports whether the server still owes this direction a response.
func (d *direction) owed() bool {
	return d.headersOwed || d.bufferedOwed || d.trailersOwed || (d.duplex() && d.chunksSent > 0 && !d.bodyDone)
}

func (d *direction) finish() {
	if !d.completeClose {
		d.completeClose = true
		close(d.complete)
	}
}

func newExchange(ctx context.Context, c *Client) *Exchange {
	streamCtx, cancel := context.WithCancel(ctx)
	m := c.cfg.ProcessingMode
	e := &Exchange{
		cfg: c.cfg, client: c, ctx: ctx, streamCtx: streamCtx, cancel: cancel,
		recvDone: make(chan struct{}),
		req:      newDirection(false, m.RequestHeaderMode, m.RequestTrailerMode, m.RequestBodyMode),
		resp:     newDirection(true, m.ResponseHeaderMode, m.ResponseTrailerMode, m.ResponseBodyMode),
		metadata: map[string]*structpb.Struct{},
	}
	return e
}

// Request runs the request path: it sends the request headers (with
// end_of_stream when body is nil), streams body to the server, and returns
// when the filter lets the headers continue. The returned body yields the
// processed chunks; it fails with a *LocalReply if the filter ends the
// request later. A *LocalReply error means the request ends with that reply.
func (e *Exchange) Request(hdrs Headers, body Body) (Headers, Body, error) {
	return e.process(&e.req, hdrs, body, e.cfg.ForwardMetadata)
}

// RequestWithMetadata is Request with the metadata_context given by the
// caller (the stream's forwarded namespaces) instead of ForwardMetadata.
func (e *Exchange) RequestWithMetadata(hdrs Headers, body Body, md map[string]*structpb.Struct) (Headers, Body, error) {
	return e.process(&e.req, hdrs, body, md)
}

// ResponseWithMetadata is Response with the metadata_context given by the
// caller; the served endpoint is reported only if md carries it, as with
// Envoy, where it reaches the server only through a forwarded namespace.
func (e *Exchange) ResponseWithMetadata(hdrs Headers, body Body, md map[string]*structpb.Struct) (Headers, Body, error) {
	return e.process(&e.resp, hdrs, body, md)
}

// Response runs the response path on the same stream, reporting served (the
// ip:port that answered, if any) in envoy.lb metadata as the EPP protocol
// requires. hdrs must carry ":status".
func (e *Exchange) Response(hdrs Headers, body Body, served string) (Headers, Body, error) {
	md := make(map[string]*structpb.Struct, len(e.cfg.ForwardMetadata)+1)
	for ns, s := range e.cfg.ForwardMetadata {
		md[ns] = s
	}
	if served != "" {
		lb := &structpb.Struct{Fields: map[string]*structpb.Value{}}
		if s := md[wire.LBNamespace]; s != nil {
			lb = proto.Clone(s).(*structpb.Struct)
		}
		lb.Fields[wire.ServedEndpointKey] = structpb.NewStringValue(served)
		md[wire.LBNamespace] = lb
	}
	return e.process(&e.resp, hdrs, body, md)
}

func (e *Exchange) process(d *direction, hdrs Headers, body Body, md map[string]*structpb.Struct) (Headers, Body, error) {
	if d.involved() {
		// Envoy starts the stream when the filter first has a message to
		// send; a start that fails at once (no cluster, no healthy host)
		// fails before anything of the request reached the filter.
		if err := e.startStream(); err != nil {
			e.fail(err)
		}
	}
	e.mu.Lock()
	if d.started {
		e.mu.Unlock()
		return nil, nil, fmt.Errorf("ext_proc filter %q: %s path already started", e.cfg.Name, d.name())
	}
	d.started, d.headers, d.input, d.metadata = true, hdrs.Clone(), body, md
	if e.term != nil || !d.involved() {
		term := e.term
		d.finish()
		e.mu.Unlock()
		if term == nil || errors.Is(term, errSkipped) {
			return hdrs, body, nil
		}
		return nil, nil, term
	}
	sendBody := body != nil && d.bodyMode != filterv3.ProcessingMode_NONE
	d.headersSent = make(chan struct{})
	if sendBody {
		d.out, d.handoff = newPipe(), make(chan Body, 1)
		d.reading, d.firstRead = make(chan struct{}), make(chan struct{})
	}
	var msg *extprocv3.ProcessingRequest
	if d.headerMode == filterv3.ProcessingMode_SEND {
		d.headersOwed = true
		e.owe(d, 1)
		msg = e.headersMessage(d)
	} else {
		e.headersAnswered(d)
	}
	e.mu.Unlock()

	// The body is read as it arrives, from once the headers are on the
	// stream: in Envoy the data that came with the headers reaches the
	// filter in the same dispatch, before a connection failure can be known
	// (a later turn of the event loop, source/common/network/
	// connection_impl.cc).
	if sendBody {
		go e.sendBody(d)
	}
	var err error
	if msg != nil {
		err = e.send(msg)
	}
	close(d.headersSent)
	if err != nil {
		e.failAfterSend(err)
	}
	select {
	case o := <-d.outcome:
		return o.headers, o.body, o.err
	case <-e.ctx.Done():
		e.abort(e.ctx.Err())
		return nil, nil, e.ctx.Err()
	}
}

func (e *Exchange) metadataContext(d *direction) *corev3.Metadata {
	if len(d.metadata) == 0 {
		return nil
	}
	return &corev3.Metadata{FilterMetadata: d.metadata}
}

func (e *Exchange) headersMessage(d *direction) *extprocv3.ProcessingRequest {
	hh := &extprocv3.HttpHeaders{Headers: d.headers.toProto(), EndOfStream: d.input == nil}
	m := &extprocv3.ProcessingRequest{MetadataContext: e.metadataContext(d)}
	if d.response {
		m.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: hh}
	} else {
		m.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: hh}
	}
	return m
}

func (e *Exchange) bodyMessage(d *direction, data []byte, eos bool) *extprocv3.ProcessingRequest {
	hb := &extprocv3.HttpBody{Body: data, EndOfStream: eos}
	m := &extprocv3.ProcessingRequest{MetadataContext: e.metadataContext(d)}
	if d.response {
		m.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: hb}
	} else {
		m.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: hb}
	}
	return m
}

func (e *Exchange) trailersMessage(d *direction, t Headers) *extprocv3.ProcessingRequest {
	ht := &extprocv3.HttpTrailers{Trailers: t.toProto()}
	m := &extprocv3.ProcessingRequest{MetadataContext: e.metadataContext(d)}
	if d.response {
		m.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: ht}
	} else {
		m.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: ht}
	}
	return m
}

// sendBody feeds d's body to the server: in FULL_DUPLEX_STREAMED each chunk
// as it arrives without waiting for any response (the first one counts as
// received by the filter as soon as it is read, whether or not the stream
// connected); in BUFFERED the whole body in one message once the headers
// response has arrived.
func (e *Exchange) sendBody(d *direction) {
	buffered := d.bodyMode == filterv3.ProcessingMode_BUFFERED
	if buffered {
		close(d.reading)
		close(d.firstRead)
		select {
		case <-d.answered:
		case <-e.streamCtx.Done():
		}
	}
	var held []Chunk
	first := !buffered
	if first {
		// The body is read once the headers message is on the stream, or
		// the stream failed to connect: a connection failure waits for this
		// first read (failLater), as Envoy hands the data that came with
		// the headers to the filter before a failed connection is known.
		select {
		case <-d.headersSent:
		case <-e.streamCtx.Done():
		}
	}
	for {
		if term := e.terminated(); term != nil {
			if first {
				close(d.reading)
				close(d.firstRead)
			}
			e.stopSending(d, term, held)
			return
		}
		if first {
			close(d.reading)
		}
		c, err := d.input.Next(e.ctx)
		if first {
			first = false
			e.mu.Lock()
			if err == nil && e.term == nil {
				e.bodyReceived = true
			}
			e.mu.Unlock()
			close(d.firstRead)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			e.abort(fmt.Errorf("reading %s body: %w", d.name(), err))
			return
		}
		held = append(held, c)
		if buffered && !c.EndOfStream {
			continue
		}
		select {
		case <-d.headersSent:
		case <-e.streamCtx.Done():
		}

		e.mu.Lock()
		if e.term != nil {
			term := e.term
			e.mu.Unlock()
			e.stopSending(d, term, held)
			return
		}
		msgs := e.bodyMessages(d, held, buffered)
		e.mu.Unlock()

		if err := e.send(msgs...); err != nil {
			e.mu.Lock()
			if errors.Is(e.term, errSkipped) {
				// Skipped while this send was under way (the stream was
				// cancelled under it): what was sent is the server's.
				if c.EndOfStream {
					d.sentAll = true
					e.skippedAfterSending(d)
				} else {
					e.handOff(d, &prefixBody{rest: d.input})
				}
				e.mu.Unlock()
				return
			}
			e.mu.Unlock()
			e.failAfterSend(err)
			return
		}
		if c.EndOfStream {
			e.mu.Lock()
			d.sentAll = true
			if errors.Is(e.term, errSkipped) {
				e.skippedAfterSending(d)
			}
			e.mu.Unlock()
			return
		}
		held = nil
	}
}

// bodyMessages turns held chunks into messages and records what is now owed.
// Trailers are only sent where FULL_DUPLEX_STREAMED makes them part of the body.
func (e *Exchange) bodyMessages(d *direction, held []Chunk, buffered bool) []*extprocv3.ProcessingRequest {
	last := held[len(held)-1]
	withTrailers := last.EndOfStream && last.Trailers != nil && d.duplex() && d.trailerMode == filterv3.ProcessingMode_SEND
	var msgs []*extprocv3.ProcessingRequest
	switch {
	case buffered:
		var all []byte
		for _, c := range held {
			all = append(all, c.Data...)
		}
		d.buffered, d.bufferedOwed = all, true
		d.chunksSent++
		e.owe(d, 1)
		msgs = append(msgs, e.bodyMessage(d, all, true))
	case withTrailers && len(last.Data) == 0:
		// The body ended with trailers and no data: Envoy sends only the trailers.
	default:
		d.chunksSent++
		msgs = append(msgs, e.bodyMessage(d, last.Data, last.EndOfStream && !withTrailers))
	}
	if withTrailers {
		d.trailers, d.trailersSent, d.trailersOwed = last.Trailers.Clone(), true, true
		msgs = append(msgs, e.trailersMessage(d, last.Trailers))
	}
	return msgs
}

// stopSending ends the sender once the exchange is over. When the filter was
// skipped, the chunks read but never sent go to the consumer ahead of the
// rest of the body.
func (e *Exchange) stopSending(d *direction, term error, held []Chunk) {
	if errors.Is(term, errSkipped) {
		e.mu.Lock()
		e.handOff(d, &prefixBody{held: held, rest: d.input})
		e.mu.Unlock()
		return
	}
	_ = d.input.Close()
}

// handOff gives the consumer of a skipped filter's output the body that
// follows what the server processed, once. Callers hold e.mu.
func (e *Exchange) handOff(d *direction, b Body) {
	if d.handoff != nil && !d.handedOff {
		d.handedOff = true
		d.handoff <- b
	}
}

func (e *Exchange) terminated() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.term
}

// startStream chooses the stream's channel once (Client.start): Envoy's
// synchronous start of the gRPC stream.
func (e *Exchange) startStream() error {
	e.startOnce.Do(func() {
		conn, err := e.client.start()
		if err != nil {
			e.startErr = fmt.Errorf("%w: starting the stream to %s: %w", ErrStream, e.cfg.Target, err)
			return
		}
		e.conn = conn
	})
	return e.startErr
}

// open connects the stream, which is where a server that cannot be reached
// shows: a failure of the connection, not of the stream's start.
func (e *Exchange) open() error {
	e.openOnce.Do(func() {
		if e.conn == nil {
			e.openErr = e.startErr
			close(e.recvDone)
			return
		}
		stream, err := extprocv3.NewExternalProcessorClient(e.conn).Process(e.streamCtx)
		if err != nil {
			e.openErr = fmt.Errorf("%w: opening stream to %s: %w", ErrStream, e.cfg.Target, err)
			close(e.recvDone)
			return
		}
		e.stream = stream
		go e.receive()
	})
	return e.openErr
}

func (e *Exchange) send(msgs ...*extprocv3.ProcessingRequest) error {
	if err := e.open(); err != nil {
		return err
	}
	e.sendMu.Lock()
	defer e.sendMu.Unlock()
	for _, m := range msgs {
		if !e.sentAny {
			// Envoy tells the server the negotiated body modes on the first message only.
			e.sentAny = true
			m.ProtocolConfig = &extprocv3.ProtocolConfiguration{
				RequestBodyMode:  e.req.bodyMode,
				ResponseBodyMode: e.resp.bodyMode,
			}
		}
		if err := e.stream.Send(m); err != nil {
			return fmt.Errorf("%w: send: %w", ErrStream, err)
		}
	}
	return nil
}

// failAfterSend reports a send error. A failed Send only says the stream is
// gone; the receive loop learns why, so its verdict is preferred. It counts
// once the body that came with the headers has reached the filter.
func (e *Exchange) failAfterSend(err error) {
	select {
	case <-e.recvDone:
	case <-time.After(closeGrace):
	}
	e.failLater(err)
}

// failLater applies a failure of the stream's connection once the body
// that came with the headers has reached the filter. In Envoy that data is
// handed to the filter in the same dispatch as the headers (ext_proc.cc
// Filter::decodeHeaders then Filter::decodeData, which sets bodyReceived),
// while a connection failure, whether the connect is refused or an open
// connection is reset, is reported by a later turn of the event loop
// (source/common/network/connection_impl.cc ConnectionImpl::onFileEvent;
// ClientConnectionImpl::connect defers even a connect refused at once to a
// write event). Here the body is read by another
// goroutine: failLater waits for its first read to begin, however busy the
// machine, then for that read to return (bounded by sameDispatch). A client
// that holds its body back longer sees the failure first, as in Envoy.
func (e *Exchange) failLater(err error) {
	e.mu.Lock()
	var reads [][2]chan struct{}
	for _, d := range []*direction{&e.req, &e.resp} {
		if d.reading != nil {
			reads = append(reads, [2]chan struct{}{d.reading, d.firstRead})
		}
	}
	e.mu.Unlock()
	for _, r := range reads {
		select {
		case <-r[0]:
		case <-e.ctx.Done():
		}
		select {
		case <-r[1]:
		case <-time.After(sameDispatch):
		}
	}
	e.fail(err)
}

// sameDispatch bounds how long a connection failure waits, once the first
// read of a FULL_DUPLEX_STREAMED body has begun, for it to return: data
// that came with the headers is already buffered and returns at once.
const sameDispatch = 100 * time.Millisecond

func (e *Exchange) receive() {
	defer close(e.recvDone)
	for {
		resp, err := e.stream.Recv()
		if err != nil {
			e.streamEnded(err)
			return
		}
		if !e.handle(resp) {
			return
		}
	}
}

func (e *Exchange) streamEnded(err error) {
	e.mu.Lock()
	if e.term != nil {
		e.mu.Unlock()
		return
	}
	if errors.Is(err, io.EOF) {
		// The server ended the stream (grpc-status OK). Envoy then leaves
		// it out for the rest of the request, whatever was still owed and
		// whatever failure_mode_allow says (ext_proc.cc
		// Filter::onGrpcCloseWithStatus, clearAsyncState); body data the
		// server held is lost.
		e.terminate(errSkipped)
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	e.failLater(fmt.Errorf("%w: %w", ErrStream, err))
}

// handle applies one server message; false stops the receive loop.
func (e *Exchange) handle(resp *extprocv3.ProcessingResponse) bool {
	e.mu.Lock()
	if e.term != nil {
		e.mu.Unlock()
		return false
	}
	e.log = append(e.log, resp)
	var (
		err   error
		chunk *Chunk
		dir   *direction
	)
	switch r := resp.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		err = e.onHeaders(&e.req, r.RequestHeaders.GetResponse())
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		err = e.onHeaders(&e.resp, r.ResponseHeaders.GetResponse())
	case *extprocv3.ProcessingResponse_RequestBody:
		dir = &e.req
		chunk, err = e.onBody(dir, r.RequestBody.GetResponse())
	case *extprocv3.ProcessingResponse_ResponseBody:
		dir = &e.resp
		chunk, err = e.onBody(dir, r.ResponseBody.GetResponse())
	case *extprocv3.ProcessingResponse_RequestTrailers:
		dir = &e.req
		chunk, err = e.onTrailers(dir, r.RequestTrailers.GetHeaderMutation())
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		dir = &e.resp
		chunk, err = e.onTrailers(dir, r.ResponseTrailers.GetHeaderMutation())
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		if e.cfg.DisableImmediateResponse {
			err = fmt.Errorf("%w: unhandled immediate response due to config disabled it", ErrSpurious)
			break
		}
		e.mergeMetadata(resp.GetDynamicMetadata())
		e.terminate(immediateReply(r.ImmediateResponse))
		e.mu.Unlock()
		return false
	default:
		err = fmt.Errorf("%w: unexpected response type %T", ErrSpurious, r)
	}
	if err == nil {
		e.mergeMetadata(resp.GetDynamicMetadata())
	}
	e.mu.Unlock()
	if err != nil {
		e.fail(err)
		return false
	}
	if chunk != nil {
		// Outside the lock: this blocks until the consumer takes the chunk.
		// A consumer that stopped reading no longer needs it.
		if err := dir.out.write(*chunk); err != nil && !errors.Is(err, errConsumerGone) {
			return false
		}
	}
	return true
}

func (e *Exchange) onHeaders(d *direction, cr *extprocv3.CommonResponse) error {
	if !d.headersOwed {
		return fmt.Errorf("%w: %s headers response not expected", ErrSpurious, d.name())
	}
	d.headersOwed = false
	e.owe(d, -1)
	if cr.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE {
		return fmt.Errorf("%w: CONTINUE_AND_REPLACE is not reproduced by the stand-in", ErrInvalidMutation)
	}
	if err := applyHeaderMutation(&d.headers, cr.GetHeaderMutation(), d.response); err != nil {
		return err
	}
	// Envoy looks at the route cache only on the request path, and only
	// for an answer that carries a header mutation, empty or not
	// (processor_state.cc DecodingProcessorState::clearRouteCache).
	if !d.response && cr.GetHeaderMutation() != nil {
		e.headerMutated = true
		if cr.GetClearRouteCache() {
			e.clearRouteCache = true
		}
	}
	e.headersAnswered(d)
	return nil
}

// headersAnswered lets the headers continue, unless a BUFFERED body is still
// to be processed: Envoy holds the headers so the body response can still
// mutate them.
func (e *Exchange) headersAnswered(d *direction) {
	d.headersDone = true
	close(d.answered)
	switch {
	case d.input == nil || d.bodyMode == filterv3.ProcessingMode_NONE:
		e.deliver(d, outcome{headers: d.headers.Clone(), body: d.input})
	case d.duplex():
		// The server may change the body's length, so Envoy drops
		// content-length (allow_content_length_header is off by default).
		d.headers.Del("content-length")
		e.deliver(d, outcome{headers: d.headers.Clone(), body: &outBody{p: d.out, handoff: d.handoff}})
	}
	e.checkComplete(d)
}

func (e *Exchange) onBody(d *direction, cr *extprocv3.CommonResponse) (*Chunk, error) {
	switch d.bodyMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if !d.headersDone {
			return nil, fmt.Errorf("%w: %s body response before the headers response", ErrSpurious, d.name())
		}
		if d.chunksSent == 0 || d.bodyDone {
			return nil, fmt.Errorf("%w: %s body response not expected", ErrSpurious, d.name())
		}
		sr := cr.GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			// Envoy's wording, which server authors search for.
			return nil, fmt.Errorf("%w: Normal body mutation response is received while body_mode_ is FULL_DUPLEX_STREAMED", ErrSpurious)
		}
		if sr.GetEndOfStream() {
			d.bodyDone = true
			e.checkComplete(d)
		}
		return &Chunk{Data: sr.GetBody(), EndOfStream: sr.GetEndOfStream()}, nil
	case filterv3.ProcessingMode_BUFFERED:
		if !d.bufferedOwed {
			return nil, fmt.Errorf("%w: %s body response not expected", ErrSpurious, d.name())
		}
		d.bufferedOwed, d.bodyDone = false, true
		e.owe(d, -1)
		if err := applyHeaderMutation(&d.headers, cr.GetHeaderMutation(), d.response); err != nil {
			return nil, err
		}
		body := d.buffered
		switch m := cr.GetBodyMutation().GetMutation().(type) {
		case *extprocv3.BodyMutation_Body:
			body = m.Body
		case *extprocv3.BodyMutation_ClearBody:
			if m.ClearBody {
				body = nil
			}
		}
		if cl := d.headers.Get("content-length"); cl != "" && cl != strconv.Itoa(len(body)) {
			return nil, fmt.Errorf("%w: content-length %s does not match the %d-byte body", ErrInvalidMutation, cl, len(body))
		}
		e.deliver(d, outcome{headers: d.headers.Clone(), body: BodyFromChunks(body)})
		e.checkComplete(d)
		return nil, nil
	}
	return nil, fmt.Errorf("%w: %s body response while body mode is %s", ErrSpurious, d.name(), d.bodyMode)
}

func (e *Exchange) onTrailers(d *direction, m *extprocv3.HeaderMutation) (*Chunk, error) {
	if !d.trailersOwed {
		return nil, fmt.Errorf("%w: %s trailers response not expected", ErrSpurious, d.name())
	}
	if !d.headersDone {
		return nil, fmt.Errorf("%w: %s trailers response before the headers response", ErrSpurious, d.name())
	}
	d.trailersOwed = false
	if err := applyHeaderMutation(&d.trailers, m, d.response); err != nil {
		return nil, err
	}
	var c *Chunk
	if !d.bodyDone {
		d.bodyDone = true
		c = &Chunk{EndOfStream: true, Trailers: d.trailers.Clone()}
	}
	e.checkComplete(d)
	return c, nil
}

func (e *Exchange) checkComplete(d *direction) {
	bodyPending := d.input != nil && d.bodyMode != filterv3.ProcessingMode_NONE && !d.bodyDone
	if d.headersDone && !bodyPending && !d.owed() {
		d.finish()
	}
}

func (e *Exchange) deliver(d *direction, o outcome) {
	if !d.delivered {
		d.delivered = true
		d.outcome <- o
	}
}

// owe counts responses that Envoy's message timer waits for.
func (e *Exchange) owe(d *direction, n int) {
	if d.duplex() {
		return
	}
	e.awaiting += n
	switch {
	case n > 0 && e.timer == nil:
		e.timer = time.AfterFunc(e.cfg.MessageTimeout, e.onTimeout)
	case n > 0:
		e.timer.Reset(e.cfg.MessageTimeout)
	case e.awaiting == 0 && e.timer != nil:
		e.timer.Stop()
	}
}

func (e *Exchange) onTimeout() {
	e.mu.Lock()
	late := e.awaiting == 0
	e.mu.Unlock()
	if !late {
		e.fail(fmt.Errorf("%w (%s)", ErrMessageTimeout, e.cfg.MessageTimeout))
	}
}

func (e *Exchange) mergeMetadata(dm *structpb.Struct) {
	for ns, v := range dm.GetFields() {
		s := v.GetStructValue()
		if s == nil {
			continue
		}
		if mo := e.cfg.MetadataOptions; mo != nil && !slices.Contains(mo.Receiving, ns) {
			// metadata_options.receiving_namespaces: Envoy drops the rest.
			continue
		}
		cur := e.metadata[ns]
		if cur == nil {
			cur = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			e.metadata[ns] = cur
		}
		for k, fv := range s.GetFields() {
			cur.Fields[k] = proto.Clone(fv).(*structpb.Value)
		}
	}
}

// fail applies failure_mode_allow to a stream failure. In
// FULL_DUPLEX_STREAMED failing open is only possible until body data has
// reached the filter (ext_proc.cc Filter::failureModeAllow,
// processor_state.cc ProcessorState::canFailOpen; Envoy PR #41276): the
// filter passes on no data of its own, so after that the request cannot
// continue. A BUFFERED body stays in the filter and fails open any time.
func (e *Exchange) fail(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.term != nil {
		return
	}
	status := http.StatusInternalServerError
	if e.cfg.StatusOnError != 0 {
		status = e.cfg.StatusOnError
	}
	switch {
	case errors.Is(err, ErrInvalidMutation):
		// Filter::handleErrorResponse: status_on_error, never failing open.
		e.terminate(e.errorReply(status, err))
	case e.cfg.FailureModeAllow && !e.bodyReceived:
		e.failedOpen = err
		e.terminate(errSkipped)
	case errors.Is(err, ErrMessageTimeout):
		// Filter::onMessageTimeout: always 504, status_on_error aside.
		e.terminate(e.errorReply(http.StatusGatewayTimeout, err))
	default:
		e.terminate(e.errorReply(status, err))
	}
}

// abort ends the exchange without a reply, e.g. when the client went away.
func (e *Exchange) abort(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.term == nil {
		e.terminate(err)
	}
}

func (e *Exchange) errorReply(status int, err error) *LocalReply {
	return &LocalReply{
		Status:  status,
		Details: "ext_proc_error: " + err.Error(),
		Err:     fmt.Errorf("ext_proc filter %q: %w", e.cfg.Name, err),
	}
}

func immediateReply(ir *extprocv3.ImmediateResponse) *LocalReply {
	status := int(ir.GetStatus().GetCode())
	if status < 200 {
		status = http.StatusOK // Envoy's default for a missing or invalid status
	}
	var h Headers
	// Envoy logs and ignores a bad mutation of a local reply's headers.
	_ = applyHeaderMutation(&h, ir.GetHeaders(), true)
	return &LocalReply{Status: status, Headers: h, Body: ir.GetBody(), Details: ir.GetDetails()}
}

// skippedAfterSending hands on what is left of a body the server got whole
// when the filter is skipped: a BUFFERED body is still the filter's and
// goes on as it was; of a FULL_DUPLEX_STREAMED one the server held the
// rest, which is lost, so the body ends there (Envoy's clearAsyncState
// continues with what it still has). Callers hold e.mu.
func (e *Exchange) skippedAfterSending(d *direction) {
	if d.bodyMode == filterv3.ProcessingMode_BUFFERED {
		e.handOff(d, BodyFromChunks(d.buffered))
		return
	}
	e.handOff(d, BodyFromChunks())
}

// terminate ends the exchange with term (errSkipped: continue without the
// filter), resolving everything that waits on it. Callers hold e.mu.
func (e *Exchange) terminate(term error) {
	e.term = term
	if e.timer != nil {
		e.timer.Stop()
	}
	for _, d := range []*direction{&e.req, &e.resp} {
		if !d.started {
			continue
		}
		if errors.Is(term, errSkipped) {
			body := d.input
			if d.out != nil {
				body = &outBody{p: d.out, handoff: d.handoff}
			}
			if d.sentAll {
				e.skippedAfterSending(d)
			}
			e.deliver(d, outcome{headers: d.headers.Clone(), body: body})
		} else {
			e.deliver(d, outcome{err: term})
		}
		if d.out != nil {
			d.out.closeWrite(term)
		}
		d.finish()
	}
	if !errors.Is(term, ErrClosed) {
		e.cancel()
	}
}

// Close ends the exchange. A finished stream is half-closed so the server
// sees a clean end; anything still in flight is cancelled.
func (e *Exchange) Close() error {
	e.openOnce.Do(func() {
		e.openErr = ErrClosed
		close(e.recvDone)
	})
	e.mu.Lock()
	clean := e.term == nil && !e.req.owed() && !e.resp.owed()
	if e.term == nil {
		e.terminate(ErrClosed)
	}
	e.mu.Unlock()
	if clean && e.stream != nil {
		e.sendMu.Lock()
		_ = e.stream.CloseSend()
		e.sendMu.Unlock()
		select {
		case <-e.recvDone:
		case <-time.After(closeGrace):
		}
	}
	e.cancel()
	return nil
}

// DynamicMetadata returns the dynamic metadata the server set, merged by
// namespace as Envoy merges it into the stream's metadata.
func (e *Exchange) DynamicMetadata() map[string]*structpb.Struct {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]*structpb.Struct, len(e.metadata))
	for ns, s := range e.metadata {
		out[ns] = proto.Clone(s).(*structpb.Struct)
	}
	return out
}

// HeaderMutated reports whether a request-path headers response carried a
// header mutation: with route_cache_action CLEAR, Envoy clears the route
// cache then, and only then.
func (e *Exchange) HeaderMutated() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.headerMutated
}

// ClearRouteCache reports whether a request-path headers response asked
// for it along with a header mutation, the only case Envoy honours.
func (e *Exchange) ClearRouteCache() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.clearRouteCache
}

// Responses returns every message received from the server, in order.
func (e *Exchange) Responses() []*extprocv3.ProcessingResponse {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*extprocv3.ProcessingResponse(nil), e.log...)
}

// FailedOpen returns the stream failure that failure_mode_allow tolerated, if any.
func (e *Exchange) FailedOpen() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failedOpen
}
