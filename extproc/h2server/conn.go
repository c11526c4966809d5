package h2server

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/infergate/infergate/internal/grpcwire"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Keepalive enforcement, as grpc-go's server does with the policy the
// ext_proc server gave it (http2_server.go handlePing): a ping sooner
// than pingMinTime after the previous one, with no HEADERS or DATA sent
// between them, is a strike; more than maxPingStrikes and the connection
// is told to go away. Sent means flushed: grpc-go's writer goroutine
// sends answers after the reader has moved on, so pings that arrive with
// the requests they follow count as strikes there too.
const (
	pingMinTime    = 10 * time.Second
	maxPingStrikes = 2
	// maxBatch bounds the frames read before what they answered is
	// written and the other goroutines get a turn.
	maxBatch = 64
	// goAwayLinger is how long an idle connection told to go away waits
	// for the client to close it.
	goAwayLinger = time.Second
)

var errConnClosed = errors.New("h2server: the connection closed")

// conn is one client connection.
//
// Flow control: the client may send each stream streamWindow bytes ahead
// and the connection connWindow; both are granted back as data arrives
// (a message is handed to its Receiver as soon as it is whole), except
// that a stream whose own answers wait for the client's window beyond
// streamWindow gets no more credit until they drain, so an echoing
// stream cannot pile up answers the client does not read. Our DATA
// respects the client's windows; what does not fit waits in the stream.
type conn struct {
	s      *Server
	nc     net.Conn // the accepted connection, for closing
	ctx    context.Context
	cancel context.CancelFunc

	// The read side is the connection goroutine's alone.
	br          *bufio.Reader
	fr          *http2.Framer // reads here; writes under wmu
	recvUnacked uint32        // connection-level bytes not granted back yet
	lastPing    time.Time
	pingStrikes int

	// wmu guards the write side and the stream state senders share.
	wmu        sync.Mutex
	bw         *bufio.Writer
	records    *recordWriter // under TLS; nil in plain text
	streams    map[uint32]*Stream
	maxID      uint32 // the highest stream the client opened
	sendWindow int64  // connection-level window for our DATA
	peerWindow int64  // the client's SETTINGS_INITIAL_WINDOW_SIZE
	peerFrame  int    // the client's SETTINGS_MAX_FRAME_SIZE
	blocked    []*Stream
	// ended are streams ended on the wire from another goroutine (at
	// their grpc-timeout, or by Stream.End) whose Receivers the
	// connection goroutine has yet to close; hasEnded
	// says there are some without taking wmu.
	ended       []endedStream
	hasEnded    atomic.Bool
	dispatching bool // the connection goroutine is handling frames and flushes after
	goingAway   bool
	answered    bool // HEADERS or DATA buffered since the last flush
	wrote       bool // HEADERS or DATA flushed since the last ping
	// clientClosed holds the last streams the client itself ended
	// (END_STREAM or RST_STREAM) that are gone here: a frame on one is
	// the client's error (RFC 9113 section 5.1), where a frame on a
	// stream we reset may be in flight and must be ignored. Older closed
	// streams are forgotten and their frames ignored, as grpc-go ignores
	// all DATA on closed streams (http2_server.go handleData).
	clientClosed [16]uint32
	nextClosed   int
	werr         error
}

func newConn(s *Server, nc net.Conn) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	return &conn{
		s: s, nc: nc, ctx: ctx, cancel: cancel,
		streams:    map[uint32]*Stream{},
		sendWindow: 65535,
		peerWindow: 65535,
		peerFrame:  16384,
	}
}

func (c *conn) log() logr.Logger { return c.s.opts.Logger.V(1) }

// serve runs the connection until it ends; it closes it.
func (c *conn) serve() {
	defer c.close()
	var rw io.ReadWriter = c.nc
	_ = c.nc.SetDeadline(time.Now().Add(handshakeTimeout))
	if cfg := c.s.opts.TLS; cfg != nil {
		c.records = &recordWriter{Conn: c.nc}
		tc := tls.Server(c.records, cfg)
		if err := tc.HandshakeContext(c.ctx); err != nil {
			c.log().Info("TLS handshake failed", "remote", c.nc.RemoteAddr().String(), "err", err.Error())
			return
		}
		// Without ALPN a client may still speak HTTP/2 with prior
		// knowledge; one that agreed on another protocol may not.
		if p := tc.ConnectionState().NegotiatedProtocol; p != "" && p != "h2" {
			c.log().Info("client negotiated a protocol other than h2", "remote", c.nc.RemoteAddr().String(), "protocol", p)
			return
		}
		c.records.gather()
		rw = recordsReader{tc}
	}
	c.br = bufio.NewReaderSize(rw, 2*maxReadFrameSize) // holds any frame whole: see frameBuffered
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.br, preface); err != nil || string(preface) != http2.ClientPreface {
		c.log().Info("no HTTP/2 client preface", "remote", c.nc.RemoteAddr().String())
		return
	}
	_ = c.nc.SetDeadline(time.Time{})
	c.wmu.Lock() // goAway looks at fr to see whether the handshake is over
	c.bw = bufio.NewWriterSize(rw, 32<<10)
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.SetReuseFrames() // onData is done with a frame before the next is read
	c.fr.MaxHeaderListSize = maxHeaderListSize
	c.fr.SetMaxReadFrameSize(maxReadFrameSize)
	c.writeSettings()
	err := c.flush()
	c.wmu.Unlock()
	if err != nil {
		return
	}

	batch := 0 // frames handled since the last flush
	for {
		if batch >= maxBatch || (batch > 0 && !c.frameBuffered()) {
			// All that had arrived is handled and the next read may wait,
			// or the batch is long enough: write what it answered.
			c.wmu.Lock()
			c.dispatching, batch = false, 0
			err := c.flush()
			drained := c.goingAway && len(c.streams) == 0
			c.wmu.Unlock()
			if err != nil || drained {
				return
			}
			// A connection that always has frames waiting never blocks in
			// a read, and would keep its processor for the scheduler's
			// whole time slice (10 ms) while the other connections, and
			// the processor's own goroutines, wait: take turns instead.
			runtime.Gosched()
		}
		f, err := c.fr.ReadFrame()
		if c.hasEnded.Load() {
			c.closeEnded()
		}
		if err == nil && batch == 0 {
			c.wmu.Lock()
			c.dispatching = true
			c.wmu.Unlock()
		}
		batch++
		if err == nil {
			err = c.handle(f)
		}
		if err == nil {
			continue
		}
		var se http2.StreamError
		if errors.As(err, &se) {
			c.streamError(se.StreamID, se.Code, err)
			continue
		}
		var ce http2.ConnectionError
		switch {
		case errors.As(err, &ce):
			c.fatal(http2.ErrCode(ce), err)
		case errors.Is(err, http2.ErrFrameTooLarge):
			c.fatal(http2.ErrCodeFrameSize, err)
		case errors.Is(err, errHeaderListTooLarge):
			c.fatal(http2.ErrCodeEnhanceYourCalm, err)
		case !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, errTooManyPings):
			c.log().Info("connection ended", "remote", c.nc.RemoteAddr().String(), "err", err.Error())
		}
		return
	}
}

// writeSettings writes the server's SETTINGS and opens the connection's
// window; under wmu.
func (c *conn) writeSettings() {
	settings := []http2.Setting{
		{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderListSize},
	}
	if n := c.s.opts.MaxConcurrentStreams; n > 0 {
		settings = append(settings, http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: n})
	}
	_ = c.fr.WriteSettings(settings...)
	_ = c.fr.WriteWindowUpdate(0, connWindow-65535)
}

// frameBuffered says whether a whole frame is read already, so that
// reading it will not wait for the network.
func (c *conn) frameBuffered() bool {
	n := c.br.Buffered()
	if n < 9 {
		return false
	}
	h, _ := c.br.Peek(9)
	return n >= 9+(int(h[0])<<16|int(h[1])<<8|int(h[2]))
}

// flush writes what is buffered; under wmu.
func (c *conn) flush() error {
	if c.werr == nil {
		c.werr = c.bw.Flush()
	}
	if c.werr == nil && c.records != nil {
		c.werr = c.records.flush()
	}
	if c.werr == nil && c.answered {
		c.wrote, c.answered = true, false
	}
	return c.werr
}

// flushUnlessDispatching flushes for a sender outside the connection
// goroutine; that goroutine flushes after the frames it is handling.
// Under wmu.
func (c *conn) flushUnlessDispatching() {
	if !c.dispatching {
		_ = c.flush()
	}
}

// close ends every stream still open and the connection.
func (c *conn) close() {
	c.cancel()
	c.wmu.Lock()
	open := make([]*Stream, 0, len(c.streams))
	for _, st := range c.streams {
		open = append(open, st)
	}
	if c.bw != nil {
		_ = c.flush()
	}
	c.wmu.Unlock()
	for _, st := range open {
		c.abort(st, errConnClosed)
	}
	c.closeEnded()
	_ = c.nc.Close()
}

// fatal tells the client why the connection ends.
func (c *conn) fatal(code http2.ErrCode, err error) {
	c.log().Info("connection error", "remote", c.nc.RemoteAddr().String(), "code", code.String(), "err", err.Error())
	c.wmu.Lock()
	_ = c.fr.WriteGoAway(c.maxID, code, []byte(err.Error()))
	_ = c.flush()
	c.wmu.Unlock()
}

// goAway starts a graceful close: streams the client opened so far run to
// their end, later ones are refused, and the connection closes when none
// is left.
func (c *conn) goAway() {
	c.wmu.Lock()
	if c.goingAway || c.fr == nil {
		c.wmu.Unlock()
		if c.fr == nil {
			// Still in its handshake: nothing to drain.
			_ = c.nc.Close()
		}
		return
	}
	c.goingAway = true
	_ = c.fr.WriteGoAway(c.maxID, http2.ErrCodeNo, nil)
	_ = c.flush()
	idle := len(c.streams) == 0
	c.wmu.Unlock()
	if idle {
		// The connection goroutine may be waiting for a frame that will
		// never come: give the client a moment to close, then stop reading.
		_ = c.nc.SetReadDeadline(time.Now().Add(goAwayLinger))
	}
}

var (
	errTooManyPings       = errors.New("h2server: too many pings")
	errHeaderListTooLarge = errors.New("h2server: header list too large")
)

func (c *conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.onHeaders(f)
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.RSTStreamFrame:
		if f.StreamID > c.maxID {
			return http2.ConnectionError(http2.ErrCodeProtocol) // RFC 9113 section 6.4: not on an idle stream
		}
		c.wmu.Lock()
		st := c.streams[f.StreamID]
		c.wmu.Unlock()
		if st != nil {
			c.halfClose(st, true)
			c.abort(st, status.Errorf(codes.Canceled, "the client reset the stream (%v)", f.ErrCode))
		}
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeProtocol, Cause: errors.New("a stream depends on itself")}
		}
	case *http2.SettingsFrame:
		return c.onSettings(f)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.PingFrame:
		return c.onPing(f)
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	// GOAWAY from the client (it will close), PRIORITY and unknown frames
	// need nothing.
	return nil
}

func (c *conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerWindow
			c.peerWindow = int64(s.Val)
			for _, st := range c.streams {
				st.sendWindow += delta
			}
		case http2.SettingMaxFrameSize:
			c.peerFrame = int(s.Val)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := c.fr.WriteSettingsAck(); err != nil {
		return err
	}
	c.drainBlocked()
	return nil
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	const maxWindow = 1<<31 - 1
	switch st := c.streams[f.StreamID]; {
	case f.StreamID == 0:
		c.sendWindow += int64(f.Increment)
		if c.sendWindow > maxWindow {
			return http2.ConnectionError(http2.ErrCodeFlowControl)
		}
	case f.StreamID > c.maxID:
		return http2.ConnectionError(http2.ErrCodeProtocol) // RFC 9113 section 5.1: not on an idle stream
	case st != nil:
		if st.sendWindow += int64(f.Increment); st.sendWindow > maxWindow {
			return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeFlowControl, Cause: errors.New("the stream's window grew past 2^31-1")}
		}
	}
	c.drainBlocked()
	return nil
}

func (c *conn) onPing(f *http2.PingFrame) error {
	if f.IsAck() {
		return nil
	}
	now := time.Now()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.lastPing.IsZero() && now.Sub(c.lastPing) < pingMinTime && !c.wrote {
		c.pingStrikes++
	} else if c.wrote {
		c.pingStrikes = 0
	}
	c.lastPing, c.wrote = now, false
	// The ping is answered even when it is the one too many, as grpc-go
	// queues the ack before the GOAWAY (http2_server.go handlePing).
	if err := c.fr.WritePing(true, f.Data); err != nil || c.pingStrikes <= maxPingStrikes {
		return err
	}
	_ = c.fr.WriteGoAway(c.maxID, http2.ErrCodeEnhanceYourCalm, []byte("too_many_pings"))
	_ = c.flush()
	return errTooManyPings
}

func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	c.wmu.Lock()
	st, known := c.streams[id], id <= c.maxID
	goingAway := c.goingAway
	full := c.s.opts.MaxConcurrentStreams > 0 && len(c.streams) >= int(c.s.opts.MaxConcurrentStreams)
	if !known && id%2 == 1 {
		c.maxID = id
	}
	c.wmu.Unlock()
	if known {
		return c.onTrailers(st, f)
	}
	if id%2 == 0 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	if goingAway || full {
		// Refused, not reset otherwise: the client knows that nothing of
		// the request was processed and may send it again (RFC 9113
		// sections 5.1.2 and 8.7). A stream counts against the limit
		// until it is closed on both sides: one whose last answers wait
		// for the client's window is still open to the client.
		c.wmu.Lock()
		_ = c.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
		c.wmu.Unlock()
		if full && !goingAway && c.s.opts.Refused != nil {
			c.s.opts.Refused()
		}
		return nil
	}
	if f.Truncated {
		// No gRPC client sends such headers (Envoy's are a few hundred
		// bytes: the message carries the HTTP request), and an HPACK bomb
		// decodes to them from a few bytes: its whole block is decoded
		// before it is known, so ending the connection is what bounds
		// the cost to one block per connection made.
		return fmt.Errorf("%w: the request's header list is over %d bytes", errHeaderListTooLarge, maxHeaderListSize)
	}
	if err := malformed(f); err != nil {
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol, Cause: err}
	}
	st = &Stream{c: c, id: id, path: f.PseudoValue("path"), halfClosed: f.StreamEnded(), clientEnded: f.StreamEnded(), contentLength: -1, recv: refused{}}
	// Requests that are HTTP/2 but not gRPC are answered, not reset, with
	// the HTTP and gRPC statuses grpc-go gives them (operateHeaders,
	// writeEarlyAbort).
	rf, err := readRequestFields(f)
	if err != nil {
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol, Cause: err}
	}
	st.contentLength = rf.contentLength
	switch method := f.PseudoValue("method"); {
	case method != "POST":
		c.earlyAbort(st, 405, status.Newf(codes.Internal, "a gRPC request is a POST, not %q", method))
		return nil
	case !rf.hasType || !isGRPC(rf.contentType):
		c.earlyAbort(st, 415, status.Newf(codes.InvalidArgument, "invalid gRPC request content-type %q", rf.contentType))
		return nil
	}
	reject := rf.reject
	if timeout := rf.timeout; timeout > 0 {
		st.ctx, st.cancel = context.WithTimeout(c.ctx, timeout)
		st.expiry = time.AfterFunc(timeout, func() { c.expire(st) })
	} else {
		st.ctx, st.cancel = context.WithCancel(c.ctx)
	}
	c.wmu.Lock()
	st.sendWindow = c.peerWindow
	c.streams[id] = st
	c.wmu.Unlock()
	if reject != nil {
		c.finish(st, reject)
		return nil
	}
	recv, err := c.s.h.Open(st)
	if err != nil {
		c.finish(st, err)
		return nil
	}
	st.recv = recv
	if st.halfClosed {
		c.endOfStream(st)
	}
	return nil
}

// onTrailers takes a HEADERS frame on a stream the connection knows: the
// client's trailers, which end its side.
func (c *conn) onTrailers(st *Stream, f *http2.MetaHeadersFrame) error {
	switch {
	case st == nil:
		// A new stream's id exceeds every earlier one (RFC 9113 section
		// 5.1.1), and a gRPC client sends no trailers, so this is a broken
		// client, as grpc-go judges it too (http2_server.go
		// operateHeaders: "received an illegal stream id").
		return http2.ConnectionError(http2.ErrCodeProtocol)
	case st.finished:
		return nil // we reset it; this was in flight
	case !f.StreamEnded():
		return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeProtocol, Cause: errors.New("HEADERS after the request headers without END_STREAM")}
	}
	c.halfClose(st, true)
	c.endOfStream(st)
	return nil
}

// requestFields are the regular header fields of a request the transport
// reads.
type requestFields struct {
	contentType   string
	hasType       bool
	contentLength int64 // -1 when not given
	timeout       time.Duration
	// reject, when set, is the gRPC status to end the call with (a
	// malformed grpc-timeout), once the stream is set up.
	reject error
}

// readRequestFields reads f's regular fields; a bad content-length is an
// error (a stream error: the request is malformed).
func readRequestFields(f *http2.MetaHeadersFrame) (requestFields, error) {
	rf := requestFields{contentLength: -1}
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "content-type":
			rf.contentType, rf.hasType = hf.Value, true
		case "content-length":
			n, err := strconv.ParseInt(hf.Value, 10, 64)
			if err != nil || n < 0 {
				return rf, fmt.Errorf("content-length %q", hf.Value)
			}
			rf.contentLength = n
		case "grpc-timeout":
			d, err := parseTimeout(hf.Value)
			if err != nil && rf.reject == nil {
				rf.reject = status.Errorf(codes.Internal, "malformed grpc-timeout %q: %v", hf.Value, err)
			}
			rf.timeout = d
		}
	}
	return rf, nil
}

// malformed says why a request's header list is malformed (RFC 9113
// section 8.3.1: :method, :scheme and a non-empty :path, once each;
// section 8.2.2: no connection-specific fields, te only "trailers"),
// which makes it a stream error; nil if it is well formed.
func malformed(f *http2.MetaHeadersFrame) error {
	if f.HasPriority() && f.Priority.StreamDep == f.StreamID {
		return errors.New("a stream depends on itself")
	}
	for _, p := range [...]string{"method", "scheme", "path"} {
		if f.PseudoValue(p) == "" {
			return fmt.Errorf("no :%s", p)
		}
	}
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			return fmt.Errorf("the connection-specific field %q", hf.Name)
		case "te":
			if hf.Value != "trailers" {
				return fmt.Errorf("te %q", hf.Value)
			}
		}
	}
	return nil
}

// earlyAbort answers a request that is not a gRPC call with an HTTP status
// and a gRPC one, ending the stream at once.
func (c *conn) earlyAbort(st *Stream, httpStatus int, s *status.Status) {
	block := headerBlock([2]string{":status", strconv.Itoa(httpStatus)}, [2]string{"content-type", "application/grpc"},
		[2]string{"grpc-status", strconv.Itoa(int(s.Code()))}, [2]string{"grpc-message", encodeMessage(s.Message())})
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: block, EndHeaders: true, EndStream: true})
	c.answered = true
	if !st.halfClosed {
		_ = c.fr.WriteRSTStream(st.id, http2.ErrCodeNo) // the client may still be sending; it need not
	} else {
		c.rememberClosed(st.id)
	}
}

// halfClose notes that the client sends no more on the stream: it said so
// (END_STREAM, RST_STREAM), or the stream was reset here. Written under
// wmu, which endElsewhere reads it under; the connection goroutine, the
// only writer, reads it without.
func (c *conn) halfClose(st *Stream, byClient bool) {
	c.wmu.Lock()
	st.halfClosed = true
	st.clientEnded = st.clientEnded || byClient
	c.wmu.Unlock()
}

// rememberClosed notes a stream the client ended that is now gone; under
// wmu.
func (c *conn) rememberClosed(id uint32) {
	c.clientClosed[c.nextClosed] = id
	c.nextClosed = (c.nextClosed + 1) % len(c.clientClosed)
}

// closedByClient says whether id is one of the last streams the client
// ended that are gone; under wmu.
func (c *conn) closedByClient(id uint32) bool {
	for _, x := range c.clientClosed {
		if x == id {
			return true
		}
	}
	return false
}

func isGRPC(contentType string) bool {
	rest, ok := strings.CutPrefix(contentType, "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

func (c *conn) onData(f *http2.DataFrame) error {
	n := f.Length // padding counts against the windows too
	// The client may not send past the windows it was given (RFC 9113
	// section 6.9.1): the connection's is connWindow less what is not
	// granted back yet; a stream's, streamWindow less its unacked bytes,
	// which grow without grants while its answers wait for the client.
	if uint64(c.recvUnacked)+uint64(n) > connWindow {
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	c.recvUnacked += n
	c.wmu.Lock()
	if c.recvUnacked >= connWindow/4 {
		_ = c.fr.WriteWindowUpdate(0, c.recvUnacked)
		c.recvUnacked = 0
	}
	st, known := c.streams[f.StreamID], f.StreamID <= c.maxID
	over := st != nil && st.unacked+int64(n) > streamWindow
	afterEnd := st == nil && c.closedByClient(f.StreamID)
	c.wmu.Unlock()
	switch {
	case !known:
		return http2.ConnectionError(http2.ErrCodeProtocol) // DATA on a stream never opened
	case afterEnd:
		return http2.ConnectionError(http2.ErrCodeStreamClosed) // RFC 9113 section 5.1, closed
	case st == nil || st.finished:
		return nil // the stream ended on our side; the client has been told
	case st.halfClosed:
		return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeStreamClosed, Cause: errors.New("DATA after END_STREAM")}
	case over:
		return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeFlowControl, Cause: errors.New("DATA past the stream's receive window")}
	}
	if st.contentLength >= 0 {
		// RFC 9113 section 8.1.1: DATA must add up to the content-length.
		if st.received += int64(len(f.Data())); st.received > st.contentLength || (f.StreamEnded() && st.received != st.contentLength) {
			return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeProtocol, Cause: fmt.Errorf("DATA does not add up to content-length %d", st.contentLength)}
		}
	}
	c.deliver(st, f.Data())
	if f.StreamEnded() && !st.finished {
		c.halfClose(st, true)
		c.endOfStream(st)
	}
	if !st.finished {
		c.wmu.Lock()
		st.unacked += int64(n)
		c.grant(st)
		c.wmu.Unlock()
	}
	return nil
}

// deliver hands the whole messages in data (and what the stream held of a
// message before) to the stream's Receiver, keeping the rest.
func (c *conn) deliver(st *Stream, data []byte) {
	if len(st.buf) == 0 {
		// Most frames hold whole messages: read them where they are.
		data = c.messages(st, data)
		if st.finished || len(data) == 0 {
			return
		}
	}
	if len(st.buf)+len(data) > cap(st.buf) && !c.grow(st, data) {
		return
	}
	st.buf = append(st.buf, data...)
	rest := c.messages(st, st.buf)
	switch {
	case st.finished:
	case len(rest) == 0 && cap(st.buf) <= keptBuffer:
		st.buf = st.buf[:0] // for the stream's next message
	case len(rest) == 0:
		c.dropBuffer(st)
	default:
		st.buf = append(st.buf[:0], rest...)
	}
}

// grow makes room in the stream's buffer for data, charged to the
// server's Budget. A client gets memory for bytes it has sent, not for
// the size a message's prefix announces (up to MaxRecvMsgSize): the
// buffer at most doubles at a time, up to that size, so assembling a
// message costs at most twice what arrived. False ends the stream
// (RESOURCE_EXHAUSTED) when the budget is spent.
func (c *conn) grow(st *Stream, data []byte) bool {
	want := len(st.buf) + len(data)
	size := want
	if need := messageSize(st.buf, data); need > want {
		size = max(want, min(2*cap(st.buf), need))
	}
	if b := c.s.opts.Budget; b != nil && !b.Reserve(int64(size-cap(st.buf))) {
		c.finish(st, status.Error(codes.ResourceExhausted, "the processor's buffer budget is spent; retry shortly"))
		return false
	}
	grown := make([]byte, len(st.buf), size) // charged: cap(st.buf), always
	copy(grown, st.buf)
	st.buf = grown
	return true
}

// dropBuffer lets go of the stream's buffer and its charge.
func (c *conn) dropBuffer(st *Stream) {
	c.releaseBuffer(st)
	st.buf = nil
}

// releaseBuffer gives the budget back what the stream's buffer took.
func (c *conn) releaseBuffer(st *Stream) {
	if b := c.s.opts.Budget; b != nil && cap(st.buf) > 0 {
		b.Release(int64(cap(st.buf)))
	}
}

// keptBuffer bounds the message buffer a stream keeps between messages:
// a stream may stay open for minutes after its last large message.
const keptBuffer = 64 << 10

// messageSize is the size of the message that held followed by data
// begins, prefix included, once the prefix is in; 0 before.
func messageSize(held, data []byte) int {
	var prefix [grpcwire.PrefixLen]byte
	if n := copy(prefix[:], held); n < len(prefix) && copy(prefix[n:], data) < len(prefix)-n {
		return 0
	}
	n, _ := grpcwire.Length(prefix[:]) // a compressed message fails when it is whole
	return grpcwire.PrefixLen + int(n)
}

// messages delivers the whole messages at the start of b and returns what
// follows them.
func (c *conn) messages(st *Stream, b []byte) []byte {
	for len(b) >= grpcwire.PrefixLen {
		n, err := grpcwire.Length(b)
		if err != nil {
			c.finish(st, status.Error(codes.Internal, err.Error()))
			return nil
		}
		if int64(n) > int64(c.s.opts.MaxRecvMsgSize) {
			c.finish(st, status.Errorf(codes.ResourceExhausted, "received message larger than max (%d vs. %d)", n, c.s.opts.MaxRecvMsgSize))
			return nil
		}
		msg, rest, ok, _ := grpcwire.Split(b)
		if !ok {
			break
		}
		done, err := st.recv.Message(msg)
		b = rest
		if done || err != nil {
			c.finish(st, err)
			return nil
		}
	}
	return b
}

// endOfStream ends a stream the client has half-closed.
func (c *conn) endOfStream(st *Stream) {
	if len(st.buf) > 0 {
		c.finish(st, status.Error(codes.Internal, "the stream ended inside a message"))
		return
	}
	c.finish(st, nil)
}

// grant gives the client back a stream's receive window once enough of it
// is used, unless the stream's answers wait for the client; under wmu.
func (c *conn) grant(st *Stream) {
	if st.ended || len(st.pending) > streamWindow || st.unacked < streamWindow/4 {
		return
	}
	_ = c.fr.WriteWindowUpdate(st.id, uint32(st.unacked))
	st.unacked = 0
}

// finish ends a stream from the connection goroutine: the Receiver is
// closed, then the status goes out after the stream's last answers.
func (c *conn) finish(st *Stream, err error) {
	if st.finished {
		return
	}
	st.finished = true
	c.dropBuffer(st)
	st.recv.Close(err)
	st.cancel()
	if st.expiry != nil {
		st.expiry.Stop()
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if st.ended {
		return
	}
	st.ended = true
	st.trailers = c.s.blocks.status(err, !st.headersSent)
	st.rstAfter = !st.halfClosed
	if len(st.pending) == 0 {
		c.writeTrailers(st)
		return
	}
	c.bindUnsent(st)
}

// bindUnsent bounds how long an ended stream's last answers may wait for
// the client's window (Options.UnsentTimeout); under wmu.
func (c *conn) bindUnsent(st *Stream) {
	if d := c.s.opts.UnsentTimeout; d > 0 && st.unsent == nil {
		st.unsent = time.AfterFunc(d, func() { c.dropUnsent(st) })
	}
}

// dropUnsent resets an ended stream whose last answers still wait for the
// client's window, and lets go of them: the client did not take them in
// UnsentTimeout. The status cannot follow answers cut short, so the reset
// (CANCEL, as grpc-go resets a call at its deadline) is all that is sent.
func (c *conn) dropUnsent(st *Stream) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if st.trailers == nil || len(st.pending) == 0 || c.werr != nil {
		return // written meanwhile, or gone with its connection
	}
	c.setPending(st, nil)
	st.trailers = nil
	_ = c.fr.WriteRSTStream(st.id, http2.ErrCodeCancel)
	c.forget(st)
	if i := slices.Index(c.blocked, st); i >= 0 {
		c.blocked = slices.Delete(c.blocked, i, i+1)
	}
	c.flushUnlessDispatching()
}

// setPending replaces the answers a stream keeps waiting for the client's
// window, charging the Budget for their bytes as they change; under wmu.
func (c *conn) setPending(st *Stream, p []byte) {
	if b := c.s.opts.Budget; b != nil {
		switch d := int64(len(p) - len(st.pending)); {
		case d > 0:
			b.Hold(d)
		case d < 0:
			b.Unhold(-d)
		}
	}
	st.pending = p
}

// writeTrailers ends the stream on the wire; under wmu.
func (c *conn) writeTrailers(st *Stream) {
	_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: st.trailers, EndHeaders: true, EndStream: true})
	c.answered = true
	if st.rstAfter {
		// The client may still be sending; it need not.
		_ = c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
	}
	st.trailers = nil
	c.forget(st)
}

// forget removes a stream that is over on both sides; under wmu.
func (c *conn) forget(st *Stream) {
	delete(c.streams, st.id)
	if st.unsent != nil {
		st.unsent.Stop()
	}
	if st.clientEnded {
		c.rememberClosed(st.id)
	}
}

// expire ends a stream at the client's grpc-timeout, from its timer: the
// status DEADLINE_EXCEEDED goes out at once, answers still waiting for
// window are dropped, and a reset follows, as grpc-go ends such a call.
func (c *conn) expire(st *Stream) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if st.ended || c.werr != nil {
		return
	}
	c.setPending(st, nil)
	c.endElsewhere(st, status.Error(codes.DeadlineExceeded, "deadline exceeded"), true)
}

// endedStream is a stream ended by another goroutine, and its error.
type endedStream struct {
	st  *Stream
	err error
}

// endElsewhere ends a stream from a goroutine other than the connection's:
// the status goes out after the answers pending (at once if none), then
// a reset if the client may still be sending, or always with reset. The
// Receiver is closed by the connection goroutine, which alone may touch
// it, when it next reads (closeEnded) or closes. Under wmu.
func (c *conn) endElsewhere(st *Stream, err error, reset bool) {
	st.ended = true
	st.trailers = c.s.blocks.status(err, !st.headersSent)
	st.rstAfter = reset || !st.halfClosed
	if len(st.pending) == 0 {
		c.writeTrailers(st)
	} else {
		c.bindUnsent(st)
	}
	c.ended = append(c.ended, endedStream{st, err})
	c.hasEnded.Store(true)
	c.flushUnlessDispatching()
}

// closeEnded closes the Receivers of the streams ended elsewhere; on the
// connection goroutine.
func (c *conn) closeEnded() {
	c.wmu.Lock()
	ended := c.ended
	c.ended = nil
	c.hasEnded.Store(false)
	c.wmu.Unlock()
	for _, e := range ended {
		if st := e.st; !st.finished {
			st.finished = true
			c.dropBuffer(st)
			st.recv.Close(e.err)
			st.cancel()
			if st.expiry != nil {
				st.expiry.Stop()
			}
		}
	}
}

// abort ends a stream that is gone on the client's side (reset, lost
// connection): nothing more is written for it.
func (c *conn) abort(st *Stream, err error) {
	if !st.finished {
		st.finished = true
		c.dropBuffer(st)
		st.recv.Close(err)
		st.cancel()
	}
	if st.expiry != nil {
		st.expiry.Stop()
	}
	c.wmu.Lock()
	c.setPending(st, nil)
	st.ended, st.trailers = true, nil
	c.forget(st)
	c.wmu.Unlock()
}

// streamError resets a stream the client broke the protocol on.
func (c *conn) streamError(id uint32, code http2.ErrCode, err error) {
	c.log().Info("stream error", "stream", id, "code", code.String(), "err", err.Error())
	c.wmu.Lock()
	st := c.streams[id]
	_ = c.fr.WriteRSTStream(id, code)
	c.wmu.Unlock()
	if st != nil {
		c.halfClose(st, false)
		c.abort(st, status.Errorf(codes.Internal, "stream reset: %v", err))
	}
}

// drainBlocked writes what waited for window and the trailers behind it;
// under wmu.
func (c *conn) drainBlocked() {
	kept := c.blocked[:0]
	for _, st := range c.blocked {
		if len(st.pending) > 0 {
			n := c.writeData(st, st.pending, nil)
			if n < len(st.pending) {
				c.setPending(st, st.pending[n:])
				kept = append(kept, st)
				continue
			}
			c.setPending(st, nil)
		}
		if st.trailers != nil {
			c.writeTrailers(st)
		}
		c.grant(st)
	}
	clear(c.blocked[len(kept):])
	c.blocked = kept
}

// writeData writes as much of a then b as both windows allow, in frames
// the client accepts, and returns how much; under wmu.
func (c *conn) writeData(st *Stream, a, b []byte) int {
	avail := int(min(c.sendWindow, st.sendWindow, int64(len(a)+len(b))))
	if avail <= 0 {
		return 0
	}
	c.answered = true
	for written := 0; written < avail; {
		n := min(avail-written, c.peerFrame)
		var hdr [9]byte
		hdr[0], hdr[1], hdr[2] = byte(n>>16), byte(n>>8), byte(n)
		// hdr[3] type DATA (0), hdr[4] no flags
		binary.BigEndian.PutUint32(hdr[5:], st.id)
		_, _ = c.bw.Write(hdr[:])
		for left := n; left > 0; {
			if len(a) == 0 {
				a, b = b, nil
			}
			k := min(left, len(a))
			_, _ = c.bw.Write(a[:k])
			a, left = a[k:], left-k
		}
		written += n
	}
	c.sendWindow -= int64(avail)
	st.sendWindow -= int64(avail)
	return avail
}

// recordsReader reads all the TLS records a connection has received in
// one Read, as a read of a plain socket returns all the bytes received:
// crypto/tls returns one record per Read, and a connection whose client
// writes a record per flush would then answer, and write, once per record
// instead of once per batch of requests.
type recordsReader struct{ *tls.Conn }

func (r recordsReader) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	if err != nil || n == 0 {
		return n, err
	}
	// With a deadline in the past a read returns what the connection has
	// buffered, or a timeout at once, without a system call.
	_ = r.SetReadDeadline(time.Unix(1, 0))
	for n < len(p) {
		m, err := r.Conn.Read(p[n:])
		n += m
		if err != nil {
			// A timeout is nothing more buffered; another error comes
			// back with the next Read (crypto/tls keeps it).
			break
		}
	}
	_ = r.SetReadDeadline(time.Time{})
	return n, nil
}

// recordWriter gathers the TLS records written between two flushes into
// one write: crypto/tls writes each record (16 KiB at most) with a system
// call of its own, six for a 64 KiB body sent back. Records crypto/tls
// writes on its own (a key update's answer) go out with the next flush.
type recordWriter struct {
	net.Conn
	mu        sync.Mutex
	gathering bool
	buf       []byte
}

// gather starts gathering, once the handshake (whose records must go out
// as they are written) is over.
func (w *recordWriter) gather() {
	w.mu.Lock()
	w.gathering = true
	w.mu.Unlock()
}

func (w *recordWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.gathering {
		return w.Conn.Write(p)
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// keptRecords bounds the record buffer a connection keeps between
// flushes.
const keptRecords = 256 << 10

func (w *recordWriter) flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.Conn.Write(w.buf)
	w.buf = w.buf[:0]
	if cap(w.buf) > keptRecords {
		w.buf = nil // a flush this large is rare: do not keep its buffer
	}
	return err
}

// refused is the Receiver of a stream ended before its handler opened it.
type refused struct{}

func (refused) Message([]byte) (bool, error) { return true, nil }
func (refused) Close(error)                  {}

// parseTimeout reads a grpc-timeout value: at most 8 digits and a unit.
func parseTimeout(v string) (time.Duration, error) {
	if len(v) < 2 || len(v) > 9 {
		return 0, fmt.Errorf("want 1 to 8 digits and a unit")
	}
	var n int64
	for _, ch := range v[:len(v)-1] {
		if ch < '0' || ch > '9' {
			return 0, fmt.Errorf("want 1 to 8 digits and a unit")
		}
		n = n*10 + int64(ch-'0')
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, fmt.Errorf("unknown unit %q", v[len(v)-1])
	}
	return time.Duration(n) * unit, nil
}
