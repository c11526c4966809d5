package wasmtest

import (
	"context"
	"errors"
	"fmt"

	"github.com/tetratelabs/wazero/api"
)

var (
	// ErrStreamEnded is returned for a callback on a stream the plugin already ended with a local
	// response or proxy_close_stream: Envoy would not call the plugin again for it.
	ErrStreamEnded = errors.New("wasmtest: stream already ended by the plugin")
	// ErrStreamDone is returned for any call on a stream after Done.
	ErrStreamDone = errors.New("wasmtest: stream is done")
)

// LocalResponse is a reply the plugin sent with proxy_send_local_response instead of letting the
// request reach upstream. Headers are what the plugin passed, lowercased; Envoy adds its own
// (content-length, content-type for a non-empty body) on top.
type LocalResponse struct {
	Status     uint32
	Details    string
	Headers    [][2]string
	Body       []byte
	GRPCStatus int32 // -1 when the plugin sent none
}

// half is one direction of a stream: what the plugin sees now and what has gone on.
type half struct {
	headers     headerMap
	hasHeaders  bool
	trailers    headerMap
	hasTrailers bool
	body        []byte // the body buffer the plugin sees in the current callback
	hasBody     bool
	buffering   bool // the last body callback returned Pause, so Envoy keeps the data and appends
	endOfStream bool // the last frame has been delivered
	lastAction  Action

	headersSent  bool
	sentHeaders  headerMap
	sentTrailers headerMap
	forwarded    []byte
}

// forward is what Envoy's filter manager does when a callback returns Continue: headers go on if
// they have not yet, and any buffered body follows.
func (d *half) forward() {
	if !d.headersSent {
		d.headersSent = true
		d.sentHeaders = d.headers.clone()
	}
	if d.hasBody {
		d.forwarded = append(d.forwarded, d.body...)
		d.body, d.hasBody = nil, false
	}
	d.buffering = false
	if d.hasTrailers {
		d.sentTrailers = d.trailers.clone()
	}
}

// complete reports whether everything in this direction has gone on.
func (d *half) complete() bool { return d.endOfStream && d.lastAction == ActionContinue }

// visibleHeaders are the headers as forwarded, or the live map if the plugin still holds them.
func (d *half) visibleHeaders() [][2]string {
	if d.headersSent {
		return d.sentHeaders.clone()
	}
	return d.headers.clone()
}

// Stream is one HTTP stream (one proxy-wasm HTTP context). Its methods deliver one event each, in
// the order Envoy would; they use the context passed to NewStream.
type Stream struct {
	h   *Host
	ctx context.Context
	id  uint32

	req, resp         half
	local             *LocalResponse
	reset             bool
	done              bool
	routeCacheCleared int
}

// NewStream creates an HTTP context: proxy_on_context_create(id, root).
func (h *Host) NewStream(ctx context.Context) (*Stream, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &Stream{h: h, ctx: ctx, id: h.nextID}
	h.nextID++
	h.streams[s.id] = s
	if _, err := h.call(ctx, h.fn.contextCreate, "proxy_on_context_create", s.id, uint64(s.id), rootContextID); err != nil {
		delete(h.streams, s.id)
		return nil, err
	}
	return s, nil
}

// ID is the stream's context id.
func (s *Stream) ID() uint32 { return s.id }

func (s *Stream) RequestHeaders(headers [][2]string, endOfStream bool) (Action, error) {
	return s.onHeaders(&s.req, s.h.fn.requestHeaders, "proxy_on_request_headers", headers, endOfStream)
}

// RequestBody delivers one body chunk; see the package doc for how buffering changes what the
// plugin sees.
func (s *Stream) RequestBody(chunk []byte, endOfStream bool) (Action, error) {
	return s.onBody(&s.req, s.h.fn.requestBody, "proxy_on_request_body", chunk, endOfStream)
}

// RequestTrailers delivers trailers, which end the request; Continue forwards any buffered body.
func (s *Stream) RequestTrailers(trailers [][2]string) (Action, error) {
	return s.onTrailers(&s.req, s.h.fn.requestTrailers, "proxy_on_request_trailers", trailers)
}

func (s *Stream) ResponseHeaders(headers [][2]string, endOfStream bool) (Action, error) {
	return s.onHeaders(&s.resp, s.h.fn.responseHeaders, "proxy_on_response_headers", headers, endOfStream)
}

func (s *Stream) ResponseBody(chunk []byte, endOfStream bool) (Action, error) {
	return s.onBody(&s.resp, s.h.fn.responseBody, "proxy_on_response_body", chunk, endOfStream)
}

func (s *Stream) onHeaders(d *half, fn api.Function, name string, headers [][2]string, eos bool) (Action, error) {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	if err := s.usable(name); err != nil {
		return ActionContinue, err
	}
	if d.hasHeaders {
		return ActionContinue, fmt.Errorf("wasmtest: %s: headers already delivered", name)
	}
	d.headers, d.hasHeaders, d.endOfStream = newHeaderMap(headers), true, eos
	return s.deliver(d, fn, name, uint64(len(d.headers)), boolParam(eos))
}

func (s *Stream) onBody(d *half, fn api.Function, name string, chunk []byte, eos bool) (Action, error) {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	if err := s.usable(name); err != nil {
		return ActionContinue, err
	}
	if !d.hasHeaders || d.endOfStream {
		return ActionContinue, fmt.Errorf("wasmtest: %s: body outside headers..end of stream", name)
	}
	if d.buffering {
		d.body = append(d.body, chunk...)
	} else {
		d.body = append([]byte{}, chunk...)
	}
	d.hasBody, d.endOfStream = true, eos
	act, err := s.deliver(d, fn, name, uint64(len(d.body)), boolParam(eos))
	if err == nil && act == ActionPause {
		d.buffering = true
	}
	return act, err
}

func (s *Stream) onTrailers(d *half, fn api.Function, name string, trailers [][2]string) (Action, error) {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	if err := s.usable(name); err != nil {
		return ActionContinue, err
	}
	if !d.hasHeaders || d.endOfStream {
		return ActionContinue, fmt.Errorf("wasmtest: %s: trailers outside headers..end of stream", name)
	}
	d.trailers, d.hasTrailers, d.endOfStream = newHeaderMap(trailers), true, true
	return s.deliver(d, fn, name, uint64(len(d.trailers)))
}

// deliver calls the plugin and applies its answer.
func (s *Stream) deliver(d *half, fn api.Function, name string, params ...uint64) (Action, error) {
	r, err := s.h.call(s.ctx, fn, name, s.id, append([]uint64{uint64(s.id)}, params...)...)
	if err != nil {
		return ActionContinue, err
	}
	act := Action(u32(r))
	if act != ActionContinue && act != ActionPause {
		return act, fmt.Errorf("wasmtest: %s returned %v; only Continue and Pause are emulated", name, act)
	}
	d.lastAction = act
	if act == ActionContinue && s.local == nil && !s.reset {
		d.forward()
	}
	return act, nil
}

func (s *Stream) usable(name string) error {
	switch {
	case s.done:
		return fmt.Errorf("%w: %s", ErrStreamDone, name)
	case s.local != nil || s.reset:
		return fmt.Errorf("%w: %s", ErrStreamEnded, name)
	}
	return nil
}

func boolParam(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// Done ends the stream as Envoy does when it is destroyed: proxy_on_done, proxy_on_log (where the Go
// SDK calls OnHttpStreamDone), proxy_on_delete. It runs even if the stream's context is cancelled,
// so that the guest does not keep the HTTP context.
func (s *Stream) Done() error {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	if s.done {
		return ErrStreamDone
	}
	s.done = true
	defer delete(s.h.streams, s.id)
	id := uint64(s.id)
	for _, c := range []struct {
		fn   api.Function
		name string
	}{{s.h.fn.done, "proxy_on_done"}, {s.h.fn.log, "proxy_on_log"}, {s.h.fn.delete, "proxy_on_delete"}} {
		if _, err := s.h.call(context.WithoutCancel(s.ctx), c.fn, c.name, s.id, id); err != nil {
			return err
		}
	}
	return nil
}

// RequestHeaderMap is the request headers as they went upstream, or, while the plugin still holds
// them, the current map with its changes so far.
func (s *Stream) RequestHeaderMap() [][2]string {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.req.visibleHeaders()
}

// ForwardedRequestBody is the request body that went upstream, including any replacement.
func (s *Stream) ForwardedRequestBody() []byte {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return append([]byte(nil), s.req.forwarded...)
}

// ResponseHeaderMap is RequestHeaderMap for the response.
func (s *Stream) ResponseHeaderMap() [][2]string {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.resp.visibleHeaders()
}

// ForwardedResponseBody is the response body that went downstream.
func (s *Stream) ForwardedResponseBody() []byte {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return append([]byte(nil), s.resp.forwarded...)
}

// LocalResponse is the plugin's local reply, or nil.
func (s *Stream) LocalResponse() *LocalResponse {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	if s.local == nil {
		return nil
	}
	l := *s.local
	return &l
}

// RouteCacheCleared counts clear_route_cache calls made for this stream.
func (s *Stream) RouteCacheCleared() int {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.routeCacheCleared
}

// RequestHeadersSent reports whether the request headers have gone upstream.
func (s *Stream) RequestHeadersSent() bool {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.req.headersSent
}

// RequestComplete reports whether the whole request has gone upstream: the last frame was delivered
// and the plugin let it through. False at the end of a request means Envoy would hold it until a
// timeout, since nothing in this host resumes a paused stream.
func (s *Stream) RequestComplete() bool {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.req.complete()
}
