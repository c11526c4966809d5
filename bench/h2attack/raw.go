package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// processPath is the ext_proc method every attack stream calls.
const processPath = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"

// observer gathers what the server did to an attack's connections: the
// frames it answered with, the streams it ended and the connections it
// closed. Its mutex also guards every rawConn's flow-control state, so
// that a sender can wait on a rawConn's cond for a window the reader
// grows.
type observer struct {
	mu        sync.Mutex
	dialled   int
	closed    int                     // connections the server closed (EOF or reset while we were still using them)
	goAways   map[http2.ErrCode]int   // GOAWAY frames by error code
	goDebug   string                  // the first GOAWAY's debug data
	resets    map[http2.ErrCode]int   // RST_STREAM frames by error code
	statuses  map[string]int          // grpc-status of the streams the server ended with trailers
	answered  map[connStream]bool     // streams that got DATA (an ext_proc answer)
	ended     map[connStream]bool     // streams the server ended (END_STREAM or RST_STREAM)
	dataBytes int64                   // DATA bytes received
	acks      map[http2.FrameType]int // SETTINGS and PING acknowledgements received
	syncs     int                     // of the PING acknowledgements, those of sync PINGs
}

// connStream names a stream across an attack's connections.
type connStream struct {
	conn int
	id   uint32
}

func newObserver() *observer {
	return &observer{goAways: map[http2.ErrCode]int{}, resets: map[http2.ErrCode]int{}, statuses: map[string]int{},
		answered: map[connStream]bool{}, ended: map[connStream]bool{}, acks: map[http2.FrameType]int{}}
}

// summary is what the server did, in a few words for the table.
func (o *observer) summary() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var parts []string
	if o.closed > 0 {
		parts = append(parts, fmt.Sprintf("closed %d of %d connections", o.closed, o.dialled))
	}
	for _, code := range slices.Sorted(maps.Keys(o.goAways)) {
		parts = append(parts, fmt.Sprintf("GOAWAY %s ×%d", code, o.goAways[code]))
	}
	if o.goDebug != "" {
		parts = append(parts, fmt.Sprintf("(%q)", o.goDebug))
	}
	for _, code := range slices.Sorted(maps.Keys(o.resets)) {
		parts = append(parts, fmt.Sprintf("RST_STREAM %s ×%d", code, o.resets[code]))
	}
	for _, st := range slices.Sorted(maps.Keys(o.statuses)) {
		parts = append(parts, fmt.Sprintf("grpc-status %s ×%d", st, o.statuses[st]))
	}
	if len(o.answered) > 0 {
		parts = append(parts, fmt.Sprintf("%d streams answered (%s)", len(o.answered), mib(o.dataBytes)))
	}
	// Every connection's own SETTINGS are acknowledged, and a sync PING
	// each; only a flood's are news.
	if n := o.acks[http2.FrameSettings] - o.dialled; n > 0 {
		parts = append(parts, fmt.Sprintf("%d SETTINGS ACKs", n))
	}
	if n := o.acks[http2.FramePing] - o.syncs; n > 0 {
		parts = append(parts, fmt.Sprintf("%d PING ACKs", n))
	}
	if len(parts) == 0 {
		return "no reaction"
	}
	return strings.Join(parts, ", ")
}

// endedCount is how many of the attack's streams the server has ended.
func (o *observer) endedCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.ended)
}

// connOptions shape a rawConn.
type connOptions struct {
	// zeroWindow announces a stream window of 0 and grants nothing, so
	// that the server can send no DATA at all; otherwise the windows are
	// as large as HTTP/2 allows, so that the server never waits for us.
	zeroWindow bool
	// read runs a reader; without one the server's frames pile up in the
	// socket once its first SETTINGS has been read.
	read bool
	// writeDeadline bounds every write (zero: the context's deadline), so
	// that a flood into a server that stopped reading ends on time.
	writeDeadline time.Time
	// sync ends each connection's part of an attack with a PING and waits
	// for its acknowledgement (needs read): what the attack wrote into
	// the socket is then handled, and its cost measured, before it ends.
	sync bool
}

// rawConn is an HTTP/2 connection an attack writes frame by frame. One
// goroutine (the attack's) writes; the reader, if any, only reads, so that
// a writer blocked by a server that stopped reading cannot block the
// reader too.
type rawConn struct {
	nc   net.Conn
	n    int // the connection's number within the attack
	obs  *observer
	cond *sync.Cond // on obs.mu: a window grew, a stream ended, or the connection failed

	// The write side, the attack goroutine's alone.
	out    bytes.Buffer
	fr     *http2.Framer // writes to out
	nextID uint32
	// block is the request header block of a gRPC call to Process,
	// encoded without touching the HPACK dynamic table, so that the same
	// bytes open every stream.
	block []byte

	// Under obs.mu.
	peerInit   int64            // the server's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame   int              // the server's SETTINGS_MAX_FRAME_SIZE
	maxStreams int64            // the server's SETTINGS_MAX_CONCURRENT_STREAMS, -1 if it announced none
	sendConn   int64            // our connection send window
	credit     map[uint32]int64 // per stream: window granted minus DATA sent, over peerInit
	goneAway   bool
	synced     bool  // the server acknowledged our sync PING
	err        error // why the connection ended; nil while it lives
}

// dial connects, exchanges the prefaces and reads the server's SETTINGS.
// The connection closes when ctx ends.
func dial(ctx context.Context, addr string, obs *observer, opts connOptions) (*rawConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	obs.mu.Lock()
	obs.dialled++
	n := obs.dialled
	obs.mu.Unlock()
	c := &rawConn{nc: nc, n: n, obs: obs, cond: sync.NewCond(&obs.mu), nextID: 1,
		peerInit: 65535, maxFrame: 16384, maxStreams: -1, sendConn: 65535, credit: map[uint32]int64{}}
	c.fr = http2.NewFramer(&c.out, nil)
	c.block = requestBlock(addr)
	stop := context.AfterFunc(ctx, func() { c.close() })
	ok := false
	defer func() {
		if !ok {
			stop()
			_ = nc.Close()
		}
	}()
	deadline := opts.writeDeadline
	if dl, has := ctx.Deadline(); deadline.IsZero() && has {
		deadline = dl
	}
	if err := nc.SetWriteDeadline(deadline); err != nil {
		return nil, err
	}

	window := uint32(1<<31 - 1)
	if opts.zeroWindow {
		window = 0
	}
	c.out.WriteString(http2.ClientPreface)
	_ = c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: window})
	if !opts.zeroWindow {
		_ = c.fr.WriteWindowUpdate(0, window-65535)
	}
	if err := c.flush(); err != nil {
		return nil, err
	}
	// The server's SETTINGS come first; the windows and limits attacks
	// size themselves by are in it.
	br := bufio.NewReaderSize(nc, 64<<10)
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := reader{c: c, br: br}
	for {
		h, payload, err := r.next()
		if err != nil {
			return nil, fmt.Errorf("reading the server's SETTINGS: %w", err)
		}
		c.obs.mu.Lock()
		r.handle(h, payload)
		c.obs.mu.Unlock()
		if h.typ == http2.FrameSettings && h.flags&http2.FlagSettingsAck == 0 {
			break
		}
	}
	_ = nc.SetReadDeadline(time.Time{})
	if err := c.fr.WriteSettingsAck(); err != nil {
		return nil, err
	}
	if err := c.flush(); err != nil {
		return nil, err
	}
	if opts.read {
		go r.run()
	}
	ok = true
	return c, nil
}

// requestBlock is the header block of a gRPC call to Process, every field
// a never-indexed literal or a static-table index.
func requestBlock(authority string) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: processPath}, {Name: ":authority", Value: authority},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}} {
		f.Sensitive = true
		_ = enc.WriteField(f) // a bytes.Buffer takes every write
	}
	return b.Bytes()
}

// close closes the connection; the reader then ends.
func (c *rawConn) close() {
	c.obs.mu.Lock()
	if c.err == nil {
		c.err = errClosedByUs
	}
	c.cond.Broadcast()
	c.obs.mu.Unlock()
	_ = c.nc.Close()
}

var errClosedByUs = errors.New("closed by the attack")

// id is a new stream's id.
func (c *rawConn) id() uint32 {
	id := c.nextID
	c.nextID += 2
	return id
}

// flush writes what the framer has buffered.
func (c *rawConn) flush() error {
	if c.out.Len() == 0 {
		return nil
	}
	_, err := c.nc.Write(c.out.Bytes())
	c.out.Reset()
	if err != nil {
		c.writeFailed(err)
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// flushFull flushes once a batch's worth is buffered.
func (c *rawConn) flushFull() error {
	if c.out.Len() < 64<<10 {
		return nil
	}
	return c.flush()
}

// writeFailed records that the server closed the connection under a
// write, unless we closed it or our deadline passed.
func (c *rawConn) writeFailed(err error) {
	c.obs.mu.Lock()
	defer c.obs.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		c.obs.closed++
	}
	c.cond.Broadcast()
}

// alive says whether the connection may still take new streams: not
// ended and not told to go away.
func (c *rawConn) alive() bool {
	c.obs.mu.Lock()
	defer c.obs.mu.Unlock()
	return c.err == nil && !c.goneAway
}

// streamEnded says whether the server ended stream id.
func (c *rawConn) streamEnded(id uint32) bool {
	c.obs.mu.Lock()
	defer c.obs.mu.Unlock()
	return c.obs.ended[connStream{c.n, id}]
}

// window is what stream id may still send within the server's windows
// (the smaller of the connection's and the stream's); under obs.mu.
func (c *rawConn) windowLocked(id uint32) int64 {
	return min(c.sendConn, c.peerInit+c.credit[id])
}

// take waits until stream id may send and takes up to want bytes of
// window (at most a frame); it gives up after stall without window
// (0: wait as long as ctx), returning 0 and no error.
func (c *rawConn) take(ctx context.Context, id uint32, want int, stall time.Duration) (int, error) {
	c.obs.mu.Lock()
	if c.windowLocked(id) <= 0 && c.err == nil {
		// The server grants window for what it has read: let it read
		// what is buffered.
		c.obs.mu.Unlock()
		if err := c.flush(); err != nil {
			return 0, err
		}
		c.obs.mu.Lock()
	}
	var timer *time.Timer
	expired := false
	if stall > 0 {
		timer = time.AfterFunc(stall, func() {
			c.obs.mu.Lock()
			expired = true
			c.cond.Broadcast()
			c.obs.mu.Unlock()
		})
		defer timer.Stop()
	}
	stopWake := context.AfterFunc(ctx, func() {
		c.obs.mu.Lock()
		c.cond.Broadcast()
		c.obs.mu.Unlock()
	})
	defer stopWake()
	defer c.obs.mu.Unlock()
	for {
		switch {
		case c.err != nil:
			return 0, c.err
		case ctx.Err() != nil:
			return 0, ctx.Err()
		case c.obs.ended[connStream{c.n, id}]:
			return 0, errStreamEnded
		}
		if w := c.windowLocked(id); w > 0 {
			n := int(min(int64(want), w, int64(c.maxFrame)))
			c.sendConn -= int64(n)
			c.credit[id] -= int64(n)
			return n, nil
		}
		if expired {
			return 0, nil
		}
		c.cond.Wait()
	}
}

var errStreamEnded = errors.New("the server ended the stream")

// syncData marks the PING whose acknowledgement says the server has
// handled every frame written before it (a server handles a connection's
// frames in order).
const syncData = "h2a-sync"

// sync waits until the server has handled everything written so far, so
// that an attack's time and the processor's CPU include the work it
// queued in the socket; false if the connection ended first.
func (c *rawConn) sync(ctx context.Context) bool {
	var data [8]byte
	copy(data[:], syncData)
	_ = c.fr.WritePing(false, data)
	if c.flush() != nil {
		return false
	}
	stop := context.AfterFunc(ctx, func() {
		c.obs.mu.Lock()
		c.cond.Broadcast()
		c.obs.mu.Unlock()
	})
	defer stop()
	c.obs.mu.Lock()
	defer c.obs.mu.Unlock()
	for !c.synced && c.err == nil && ctx.Err() == nil {
		c.cond.Wait()
	}
	return c.synced
}

// send writes b on stream id as DATA within the server's windows, waiting
// for them; it buffers, the caller flushes.
func (c *rawConn) send(ctx context.Context, id uint32, b []byte) error {
	for len(b) > 0 {
		n, err := c.take(ctx, id, len(b), 0)
		if err != nil {
			return err
		}
		if err := c.fr.WriteData(id, false, b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// announcedMaxStreams is the server's SETTINGS_MAX_CONCURRENT_STREAMS, -1
// if it announced none.
func (c *rawConn) announcedMaxStreams() int64 {
	c.obs.mu.Lock()
	defer c.obs.mu.Unlock()
	return c.maxStreams
}

// frameHeader is an HTTP/2 frame's 9-byte header.
type frameHeader struct {
	length uint32
	typ    http2.FrameType
	flags  http2.Flags
	stream uint32
}

// reader reads what the server sends. It parses frame headers itself and
// reads payloads only where it needs them, so that it keeps up with a
// server answering a flood even in a race-instrumented test binary.
type reader struct {
	c       *rawConn
	br      *bufio.Reader
	hdr     [9]byte
	payload []byte
	dec     *hpack.Decoder
	status  string // grpc-status of the header block being decoded
}

func (r *reader) next() (frameHeader, []byte, error) {
	if _, err := io.ReadFull(r.br, r.hdr[:]); err != nil {
		return frameHeader{}, nil, err
	}
	h := frameHeader{length: uint32(r.hdr[0])<<16 | uint32(r.hdr[1])<<8 | uint32(r.hdr[2]),
		typ: http2.FrameType(r.hdr[3]), flags: http2.Flags(r.hdr[4]), stream: binary.BigEndian.Uint32(r.hdr[5:]) & (1<<31 - 1)}
	if h.typ == http2.FrameData || (h.typ == http2.FramePing && h.flags&http2.FlagPingAck == 0) {
		// Only their size and flags matter here.
		_, err := r.br.Discard(int(h.length))
		return h, nil, err
	}
	if cap(r.payload) < int(h.length) {
		r.payload = make([]byte, h.length)
	}
	r.payload = r.payload[:h.length]
	_, err := io.ReadFull(r.br, r.payload)
	return h, r.payload, err
}

// run reads until the connection ends.
func (r *reader) run() {
	for {
		h, payload, err := r.next()
		c := r.c
		c.obs.mu.Lock()
		if err != nil {
			if c.err == nil {
				c.err = err
				c.obs.closed++ // the server closed it: we had not
			}
			c.cond.Broadcast()
			c.obs.mu.Unlock()
			return
		}
		r.handle(h, payload)
		c.obs.mu.Unlock()
	}
}

// handle takes one frame; under obs.mu.
func (r *reader) handle(h frameHeader, payload []byte) {
	c, o := r.c, r.c.obs
	cs := connStream{c.n, h.stream}
	switch h.typ {
	case http2.FrameData:
		o.dataBytes += int64(h.length)
		if h.length > 0 {
			o.answered[cs] = true
		}
		if h.flags&http2.FlagDataEndStream != 0 {
			o.ended[cs] = true
			c.cond.Broadcast()
		}
	case http2.FramePing:
		if h.flags&http2.FlagPingAck != 0 {
			o.acks[http2.FramePing]++
			if string(payload) == syncData {
				o.syncs++
				c.synced = true
				c.cond.Broadcast()
			}
		}
	case http2.FrameSettings:
		if h.flags&http2.FlagSettingsAck != 0 {
			o.acks[http2.FrameSettings]++
			return
		}
		for p := payload; len(p) >= 6; p = p[6:] {
			v := binary.BigEndian.Uint32(p[2:6])
			switch http2.SettingID(binary.BigEndian.Uint16(p[:2])) {
			case http2.SettingInitialWindowSize:
				c.peerInit = int64(v)
			case http2.SettingMaxFrameSize:
				c.maxFrame = int(v)
			case http2.SettingMaxConcurrentStreams:
				c.maxStreams = int64(v)
			}
		}
		c.cond.Broadcast()
	case http2.FrameWindowUpdate:
		if len(payload) < 4 {
			return
		}
		inc := int64(binary.BigEndian.Uint32(payload) & (1<<31 - 1))
		if h.stream == 0 {
			c.sendConn += inc
		} else {
			c.credit[h.stream] += inc
		}
		c.cond.Broadcast()
	case http2.FrameRSTStream:
		if len(payload) >= 4 {
			o.resets[http2.ErrCode(binary.BigEndian.Uint32(payload))]++
		}
		o.ended[cs] = true
		c.cond.Broadcast()
	case http2.FrameGoAway:
		if len(payload) >= 8 {
			o.goAways[http2.ErrCode(binary.BigEndian.Uint32(payload[4:8]))]++
			if o.goDebug == "" && len(payload) > 8 {
				o.goDebug = string(payload[8:min(len(payload), 8+60)])
			}
		}
		c.goneAway = true
		c.cond.Broadcast()
	case http2.FrameHeaders, http2.FrameContinuation:
		r.headers(h, payload)
	}
}

// headers decodes a header block fragment, for the grpc-status of the
// trailers that end a stream. Every block is decoded, in order, to keep
// the HPACK dynamic table the server encodes against.
func (r *reader) headers(h frameHeader, p []byte) {
	if r.dec == nil {
		r.dec = hpack.NewDecoder(4096, func(f hpack.HeaderField) {
			if f.Name == "grpc-status" {
				r.status = f.Value
			}
		})
	}
	if h.typ == http2.FrameHeaders {
		r.status = ""
		if h.flags&http2.FlagHeadersPadded != 0 && len(p) > 0 {
			pad := int(p[0])
			p = p[1:]
			if pad > len(p) {
				return
			}
			p = p[:len(p)-pad]
		}
		if h.flags&http2.FlagHeadersPriority != 0 && len(p) >= 5 {
			p = p[5:]
		}
		if h.flags&http2.FlagHeadersEndStream != 0 {
			r.c.obs.ended[connStream{r.c.n, h.stream}] = true
			r.c.cond.Broadcast()
		}
	}
	_, _ = r.dec.Write(p)
	if h.flags&http2.FlagHeadersEndHeaders != 0 { // the same bit as CONTINUATION's
		_ = r.dec.Close()
		if r.status != "" {
			r.c.obs.statuses[r.status]++
		}
	}
}

// mib formats bytes as MiB.
func mib(b int64) string {
	switch {
	case b >= 10<<20 || b <= -10<<20:
		return fmt.Sprintf("%d MiB", b>>20)
	default:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
}

// serverEnded says whether the server ended the connection: closed it,
// reset it or told it to go away (not our deadline, not our close).
func (c *rawConn) serverEnded() bool {
	c.obs.mu.Lock()
	defer c.obs.mu.Unlock()
	return c.goneAway || (c.err != nil && !errors.Is(c.err, errClosedByUs) && !errors.Is(c.err, os.ErrDeadlineExceeded))
}
