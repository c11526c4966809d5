package envoysim

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// defaultStreamIdleTimeout is HttpConnectionManager.stream_idle_timeout's
// default (http_connection_manager.proto).
const defaultStreamIdleTimeout = 300 * time.Second

// errStreamIdle ends a request that saw no activity for the stream idle
// timeout.
var errStreamIdle = errors.New("stream idle timeout")

// idleStream is the connection manager's stream idle timer: any read of the
// request body or write of the response restarts it. When it fires the
// request's context ends; what the handler writes after that is dropped,
// and finish answers: a request whose response has not started gets
// Envoy's "stream timeout", 504 if the whole request had been received and
// 408 if not, and one whose response has started is reset
// (source/common/http/conn_manager_impl.cc ActiveStream::onIdleTimeout,
// source/common/http/utility.cc Utility::maybeRequestTimeoutCode).
type idleStream struct {
	http.ResponseWriter
	timeout atomic.Int64 // time.Duration; 0: the timer is off (a route's idle_timeout 0)
	cancel  context.CancelCauseFunc

	mu      sync.Mutex
	timer   *time.Timer
	started bool // response headers written
	decoded bool // the whole request was received (Envoy's remoteDecodeComplete)
	fired   bool
	reset   bool // fired after the response started: the stream is reset
}

// newIdleStream starts the timer over w; d 0 disables it (nil). A request
// without a body is complete once its headers are in.
func newIdleStream(w http.ResponseWriter, r *http.Request, d time.Duration, cancel context.CancelCauseFunc) *idleStream {
	if d <= 0 {
		return nil
	}
	s := &idleStream{ResponseWriter: w, cancel: cancel}
	s.timeout.Store(int64(d))
	s.decoded = r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0
	s.timer = time.AfterFunc(d, s.fire)
	return s
}

func (s *idleStream) fire() {
	s.mu.Lock()
	s.fired, s.reset = true, s.started
	decoded := s.decoded
	s.mu.Unlock()
	if !decoded {
		// A read of the request body waits on the client and no context
		// ends it; the deadline does, so the request can be answered. The
		// connection is not reused after that, as Envoy's HTTP/1 codec
		// cannot reuse one whose request it did not finish reading.
		_ = http.NewResponseController(s.ResponseWriter).SetReadDeadline(time.Now())
	}
	s.cancel(errStreamIdle)
}

// finish ends the timer once the handler is done with the request, and
// answers for it if the timer fired: 504 or 408 before the response
// started, else a reset of the connection (http.ErrAbortHandler).
func (s *idleStream) finish() {
	s.timer.Stop()
	s.mu.Lock()
	fired, reset, decoded := s.fired, s.reset, s.decoded
	s.mu.Unlock()
	switch {
	case reset:
		panic(http.ErrAbortHandler)
	case fired:
		status := http.StatusRequestTimeout
		if decoded {
			status = http.StatusGatewayTimeout
		}
		clear(s.ResponseWriter.Header())
		writeLocalReply(s.ResponseWriter, &extprocfilter.LocalReply{Status: status, Body: []byte("stream timeout")})
	}
}

// routeIdle applies the route's idle_timeout, if it has one, to the
// stream, as Envoy does each time it resolves the route
// (conn_manager_impl.cc ActiveStream::refreshIdleTimeout): it replaces the
// connection manager's stream_idle_timeout, and 0 turns the timer off. A
// stream without a timer (stream_idle_timeout 0) keeps none here.
func routeIdle(w http.ResponseWriter, rt *route) {
	s, ok := w.(*idleStream)
	if !ok || rt == nil || rt.idleTimeout == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fired {
		return
	}
	s.timeout.Store(int64(*rt.idleTimeout))
	if *rt.idleTimeout == 0 {
		s.timer.Stop()
		return
	}
	s.timer.Reset(*rt.idleTimeout)
}

// touch restarts the timer on activity.
func (s *idleStream) touch() {
	if d := time.Duration(s.timeout.Load()); d > 0 {
		s.timer.Reset(d)
	}
}

func (s *idleStream) WriteHeader(code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fired {
		return
	}
	s.started = true
	s.touch()
	s.ResponseWriter.WriteHeader(code)
}

func (s *idleStream) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fired {
		return 0, errStreamIdle
	}
	s.started = true
	s.touch()
	return s.ResponseWriter.Write(b)
}

func (s *idleStream) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.ResponseWriter.(http.Flusher); ok && !s.fired {
		f.Flush()
	}
}

// body wraps the request body so that reading it counts as activity.
func (s *idleStream) body(rc io.ReadCloser) io.ReadCloser { return &idleBody{ReadCloser: rc, s: s} }

type idleBody struct {
	io.ReadCloser
	s *idleStream
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.s.touch()
	}
	if errors.Is(err, io.EOF) {
		b.s.mu.Lock()
		b.s.decoded = true
		b.s.mu.Unlock()
	}
	return n, err
}
