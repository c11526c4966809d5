package extprocload

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/infergate/infergate/internal/grpcwire"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Conn is one HTTP/2 connection to an ext_proc processor, over which the
// driver opens a gRPC stream per request. It speaks the few parts of
// HTTP/2 and gRPC a proxy's ext_proc client uses, with one goroutine
// reading the connection and writes batched across streams, so that the
// driver costs much less per request than the processor it measures: a
// grpc-go client cost about as much as the processor, and on two cores the
// driver's CPU is taken from the processor or, pinned to a core of its
// own, saturates it and its queueing shows in the latencies.
//
// A Conn connects on first use and again after the connection fails or
// the server sends GOAWAY; streams open on a failed connection fail.
type Conn struct {
	target string
	tls    *tls.Config // nil: plain text (h2c with prior knowledge)

	dialMu sync.Mutex // serializes (re)connecting
	cur    *h2conn    // guarded by dialMu
}

// Dial makes n connections to an ext_proc processor at target, over TLS
// accepting any certificate (as gateways reach pickers) or in plain text.
// They connect on first use.
func Dial(target string, useTLS bool, n int) ([]*Conn, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("target %q: %w", target, err)
	}
	var cfg *tls.Config
	if useTLS {
		cfg = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}} //nolint:gosec // pickers serve self-signed certificates, as gateways accept
	}
	conns := make([]*Conn, n)
	for i := range conns {
		conns[i] = &Conn{target: target, tls: cfg}
	}
	return conns, nil
}

// Close closes connections Dial made.
func Close(conns []*Conn) {
	for _, c := range conns {
		c.dialMu.Lock()
		if c.cur != nil {
			c.cur.fail(errors.New("connection closed by the driver"))
		}
		c.dialMu.Unlock()
	}
}

// conn is the live connection, connecting if there is none or the last
// one failed.
func (c *Conn) conn(ctx context.Context) (*h2conn, error) {
	c.dialMu.Lock()
	defer c.dialMu.Unlock()
	if c.cur != nil && c.cur.usable() {
		return c.cur, nil
	}
	h, err := dialH2(ctx, c.target, c.tls)
	if err != nil {
		return nil, err
	}
	c.cur = h
	return h, nil
}

// Settings the driver announces: stream windows so large that no answer
// waits for a window update, and a connection window raised to match.
const (
	recvWindow       = 1 << 30
	recvWindowUpdate = 1 << 29 // grant back once this much is consumed
	maxHeaderList    = 1 << 20
)

// h2conn is one live HTTP/2 connection.
type h2conn struct {
	nc net.Conn
	fr *http2.Framer // reads from nc, writes to out

	// mu guards what follows, and every write through fr. Frames are
	// written to out; the flusher alone writes to the connection, taking
	// what out holds, so that a stream never waits on a system call and
	// the frames of many streams go out in one.
	mu       sync.Mutex
	out      *swapWriter
	cond     *sync.Cond // windows grew, or the connection failed
	err      error      // the failure that ended the connection
	goAway   bool       // no new streams
	nextID   uint32
	streams  map[uint32]*h2stream
	sendConn int64  // our send window on the connection
	sendInit int64  // the peer's initial stream window
	maxFrame uint32 // the peer's largest frame
	unacked  int64  // received connection bytes not granted back
	// The request's header fields, encoded for each stream as Envoy's
	// HTTP/2 codec does: into the connection's HPACK dynamic table, but
	// for :path, sent as a literal every time (nghttp2 indexes no :path).
	// After the first stream a header block is then the :path and a few
	// indexes, as the processor sees it behind Envoy.
	fields []hpack.HeaderField
	henc   *hpack.Encoder
	hbuf   bytes.Buffer

	flush chan struct{} // a write waits to be flushed
	done  chan struct{} // closed when the connection ends
}

// h2stream is one request's stream.
type h2stream struct {
	id   uint32
	send int64 // our send window
	buf  []byte
	a    answer // the last message read
	// picked, answered, at (when it was): what One reports; err ends the
	// stream early.
	picked, answered bool
	at               time.Time
	err              error
	done             chan struct{} // closed once answered or failed
	closed           bool          // done is closed
}

func dialH2(ctx context.Context, target string, cfg *tls.Config) (*h2conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", target, err)
	}
	scheme := "http"
	if cfg != nil {
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("TLS handshake with %s: %w", target, err)
		}
		if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
			_ = tc.Close()
			return nil, fmt.Errorf("%s did not negotiate HTTP/2 over TLS (ALPN %q)", target, p)
		}
		nc, scheme = tc, "https"
	}
	h := &h2conn{
		nc: nc, out: &swapWriter{buf: &bytes.Buffer{}}, nextID: 1, streams: map[uint32]*h2stream{},
		sendConn: 65535, sendInit: 65535, maxFrame: 16384,
		flush: make(chan struct{}, 1), done: make(chan struct{}),
	}
	h.cond = sync.NewCond(&h.mu)
	h.fr = http2.NewFramer(h.out, bufio.NewReaderSize(nc, 64<<10))
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	h.fr.MaxHeaderListSize = maxHeaderList

	h.fields = []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: scheme},
		{Name: ":path", Value: "/envoy.service.ext_proc.v3.ExternalProcessor/Process", Sensitive: true},
		{Name: ":authority", Value: target}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}}
	h.henc = hpack.NewEncoder(&h.hbuf)

	h.out.buf.WriteString(http2.ClientPreface)
	if err := h.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: recvWindow},
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList}); err != nil {
		_ = nc.Close()
		return nil, err
	}
	if err := h.fr.WriteWindowUpdate(0, recvWindow-65535); err != nil {
		_ = nc.Close()
		return nil, err
	}
	if _, err := nc.Write(h.out.buf.Bytes()); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("HTTP/2 preface to %s: %w", target, err)
	}
	h.out.buf.Reset()
	go h.read()
	go h.flusher()
	return h, nil
}

func (h *h2conn) usable() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err == nil && !h.goAway && h.nextID < 1<<31-1
}

// fail ends the connection with err: every open stream fails with it.
func (h *h2conn) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failLocked(err)
}

func (h *h2conn) failLocked(err error) {
	if h.err != nil {
		return
	}
	h.err = err
	for id, st := range h.streams {
		st.finish(err)
		delete(h.streams, id)
	}
	_ = h.nc.Close()
	close(h.done)
	h.cond.Broadcast()
}

// wrote asks the flusher to flush what was just written; called with mu
// held. Writes from other streams that come before it runs go out in
// the same system call.
func (h *h2conn) wrote() {
	select {
	case h.flush <- struct{}{}:
	default:
	}
}

func (h *h2conn) flusher() {
	spare := &bytes.Buffer{}
	for {
		select {
		case <-h.done:
			return
		case <-h.flush:
		}
		h.mu.Lock()
		pending := h.out.buf
		h.out.buf = spare
		h.mu.Unlock()
		if pending.Len() > 0 {
			if _, err := h.nc.Write(pending.Bytes()); err != nil {
				h.fail(fmt.Errorf("write: %w", err))
				return
			}
		}
		pending.Reset()
		spare = pending
	}
}

// swapWriter is where the framer writes: a buffer the flusher swaps for
// an empty one when it takes what was written.
type swapWriter struct{ buf *bytes.Buffer }

func (w *swapWriter) Write(p []byte) (int, error) { return w.buf.Write(p) }

// open starts a stream: its headers, then msgs as gRPC messages, the
// first right away and the rest once sent reports the time (the request's
// latency starts when the body is sent). The stream stays open for its
// answers.
func (h *h2conn) open(msgs [][]byte, sent *time.Time) (*h2stream, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return nil, h.err
	}
	if h.goAway {
		return nil, errors.New("the server is going away")
	}
	st := &h2stream{id: h.nextID, send: h.sendInit, done: make(chan struct{})}
	h.nextID += 2
	h.streams[st.id] = st
	h.hbuf.Reset()
	for _, f := range h.fields {
		_ = h.henc.WriteField(f) // a bytes.Buffer takes every write
	}
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: h.hbuf.Bytes(), EndHeaders: true}); err != nil {
		h.failLocked(err)
		return nil, err
	}
	for i, m := range msgs {
		if i == 1 {
			*sent = time.Now()
		}
		if err := h.writeMessage(st, m); err != nil {
			return nil, err
		}
	}
	if len(msgs) < 2 {
		*sent = time.Now()
	}
	h.wrote()
	return st, nil
}

// writeMessage writes m as DATA frames no larger than the peer takes,
// waiting for window when it runs out; called with mu held.
func (h *h2conn) writeMessage(st *h2stream, m []byte) error {
	for rest := m; len(rest) > 0; {
		for min(st.send, h.sendConn) <= 0 {
			// What is written must reach the server for it to grant
			// more window.
			h.wrote()
			if st.err != nil {
				return st.err
			}
			if h.err != nil {
				return h.err
			}
			h.cond.Wait()
		}
		if st.err != nil {
			return st.err
		}
		n := min(int64(len(rest)), st.send, h.sendConn, int64(h.maxFrame))
		if err := h.writeData(st, rest[:n]); err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}

func (h *h2conn) writeData(st *h2stream, b []byte) error {
	if err := h.fr.WriteData(st.id, false, b); err != nil {
		h.failLocked(fmt.Errorf("write: %w", err))
		return h.err
	}
	st.send -= int64(len(b))
	h.sendConn -= int64(len(b))
	return nil
}

// end half-closes the stream (as a proxy does once its request is done)
// or, when cancel, resets it; the server's end of it is read and dropped.
func (h *h2conn) end(st *h2stream, cancel bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return
	}
	if _, open := h.streams[st.id]; !open {
		return // the server already ended it
	}
	var err error
	if cancel {
		err = h.fr.WriteRSTStream(st.id, http2.ErrCodeCancel)
		delete(h.streams, st.id)
	} else {
		err = h.fr.WriteData(st.id, true, nil)
	}
	if err != nil {
		h.failLocked(fmt.Errorf("write: %w", err))
		return
	}
	h.wrote()
}

// finish ends the wait for st with err (nil: answered); called with the
// connection's mu held.
func (st *h2stream) finish(err error) {
	if st.closed {
		return
	}
	if err != nil && !st.answered {
		st.err = err
	}
	st.closed = true
	close(st.done)
}

// read reads the connection until it fails.
func (h *h2conn) read() {
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			h.fail(fmt.Errorf("read: %w", err))
			return
		}
		h.mu.Lock()
		err = h.handle(f)
		if err == nil && h.out.buf.Len() > 0 {
			h.wrote()
		}
		if err != nil {
			h.failLocked(err)
		}
		h.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// handle is one frame from the server; called with mu held.
func (h *h2conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if err := f.ForeachSetting(func(s http2.Setting) error {
			switch s.ID {
			case http2.SettingInitialWindowSize:
				delta := int64(s.Val) - h.sendInit
				h.sendInit = int64(s.Val)
				for _, st := range h.streams {
					st.send += delta
				}
			case http2.SettingMaxFrameSize:
				h.maxFrame = s.Val
			case http2.SettingHeaderTableSize:
				h.henc.SetMaxDynamicTableSizeLimit(s.Val)
			}
			return nil
		}); err != nil {
			return err
		}
		h.cond.Broadcast()
		return h.fr.WriteSettingsAck()
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			h.sendConn += int64(f.Increment)
		} else if st := h.streams[f.StreamID]; st != nil {
			st.send += int64(f.Increment)
		}
		h.cond.Broadcast()
	case *http2.PingFrame:
		if !f.IsAck() {
			return h.fr.WritePing(true, f.Data)
		}
	case *http2.GoAwayFrame:
		h.goAway = true
		for id, st := range h.streams {
			if id > f.LastStreamID {
				st.finish(fmt.Errorf("the server went away (%s) before the stream started", f.ErrCode))
				delete(h.streams, id)
			}
		}
	case *http2.RSTStreamFrame:
		if st := h.streams[f.StreamID]; st != nil {
			st.finish(fmt.Errorf("the server reset the stream: %s", f.ErrCode))
			delete(h.streams, f.StreamID)
			h.cond.Broadcast()
		}
	case *http2.MetaHeadersFrame:
		st := h.streams[f.StreamID]
		if st == nil {
			return nil
		}
		if err := st.headers(f); err != nil {
			st.finish(err)
		}
		if f.StreamEnded() {
			st.finish(errors.New("the stream ended before the body came back"))
			delete(h.streams, f.StreamID)
		}
	case *http2.DataFrame:
		h.unacked += int64(f.Length)
		if h.unacked >= recvWindowUpdate {
			if err := h.fr.WriteWindowUpdate(0, uint32(h.unacked)); err != nil {
				return err
			}
			h.unacked = 0
		}
		st := h.streams[f.StreamID]
		if st == nil {
			return nil
		}
		if err := st.data(f.Data()); err != nil {
			st.finish(err)
		}
		if f.StreamEnded() {
			st.finish(errors.New("the stream ended without trailers"))
			delete(h.streams, f.StreamID)
		}
	}
	return nil
}

// headers reads the response headers or trailers of st: anything but
// :status 200 and, in trailers, grpc-status 0 is the stream's error.
func (st *h2stream) headers(f *http2.MetaHeadersFrame) error {
	var grpcStatus, grpcMessage string
	for _, hf := range f.Fields {
		switch hf.Name {
		case ":status":
			if hf.Value != "200" {
				return fmt.Errorf("HTTP status %s", hf.Value)
			}
		case "grpc-status":
			grpcStatus = hf.Value
		case "grpc-message":
			grpcMessage = hf.Value
		}
	}
	if grpcStatus != "" && grpcStatus != "0" {
		code, _ := strconv.Atoi(grpcStatus)
		return fmt.Errorf("gRPC status %d: %s", code, grpcMessage)
	}
	return nil
}

// data reads gRPC messages from a DATA frame of st.
func (st *h2stream) data(b []byte) error {
	if len(st.buf) == 0 {
		// Usually the frame holds whole messages: read them in place.
		rest, err := st.messages(b)
		if err != nil || len(rest) == 0 {
			return err
		}
		st.buf = append(st.buf, rest...)
		return nil
	}
	st.buf = append(st.buf, b...)
	rest, err := st.messages(st.buf)
	st.buf = append(st.buf[:0], rest...)
	return err
}

// messages reads the whole gRPC messages at the start of b, returning
// what is left of an incomplete one.
func (st *h2stream) messages(b []byte) ([]byte, error) {
	for {
		m, rest, ok, err := grpcwire.Split(b)
		if err != nil || !ok {
			return rest, err
		}
		if err := st.a.read(m); err != nil {
			return nil, err
		}
		b = rest
		if st.answered {
			continue // after the answer, nothing more is read
		}
		switch {
		case st.a.immediate:
			return nil, fmt.Errorf("immediate response %d", st.a.status)
		case st.a.headers:
			st.picked = st.a.setHeaders > 0
		case st.a.streamedEnd:
			st.answered, st.at = true, time.Now()
			st.finish(nil)
		}
	}
}
