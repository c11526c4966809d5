package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
)

// ZMTP 3 framing (rfc.zeromq.org/spec/23): a 64-byte greeting, then frames
// of a flags byte, a size (1 byte, or 8 big-endian with the LONG flag) and a
// body.
const (
	greetingBytes = 64
	flagMore      = 0x01
	flagLong      = 0x02
	flagCommand   = 0x04
	// maxFrames bounds the frames of one message. Event messages have 3,
	// commands 1; a few more are read, and the message dropped as
	// malformed, rather than the connection closed.
	maxFrames = 8
)

var errMessageTooLarge = fmt.Errorf("%w: ZMTP message", ErrTooLarge)

// frameGuard sits under zmq4's ZMTP reader and closes the stream when a
// message declares more than max bytes or maxFrames frames. zmq4 allocates
// each frame's declared size before reading it (conn.go, Conn.read), up to
// 2^63 bytes, so without this one peer could take the process down; the
// guard sees each header in the Read that delivers it, before zmq4 can act
// on it.
type frameGuard struct {
	net.Conn
	max int64

	greeting int    // greeting bytes still to come
	hdr      []byte // the header read so far
	hdrBuf   [9]byte
	body     int64 // bytes of the current frame still to come
	frames   int   // frames of the current message so far
	bytes    int64 // bytes of the current message so far
	err      error
}

func newFrameGuard(c net.Conn, max int64) *frameGuard {
	g := &frameGuard{Conn: c, max: max, greeting: greetingBytes}
	g.hdr = g.hdrBuf[:0]
	return g
}

func (g *frameGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.Conn.Read(p)
	if serr := g.scan(p[:n]); serr != nil {
		g.err = serr
		return 0, serr
	}
	return n, err
}

// scan follows the framing over b, the next bytes of the stream.
func (g *frameGuard) scan(b []byte) error {
	for len(b) > 0 {
		switch {
		case g.greeting > 0:
			k := min(g.greeting, len(b))
			g.greeting -= k
			b = b[k:]
		case g.body > 0:
			k := min(g.body, int64(len(b)))
			g.body -= k
			b = b[k:]
		default:
			g.hdr = append(g.hdr, b[0])
			b = b[1:]
			flags := g.hdr[0]
			if flags&^(flagMore|flagLong|flagCommand) != 0 {
				return fmt.Errorf("ZMTP frame flags %#x: reserved bits set", flags)
			}
			want := 2
			if flags&flagLong != 0 {
				want = 9
			}
			if len(g.hdr) < want {
				continue
			}
			var size int64
			if want == 2 {
				size = int64(g.hdr[1])
			} else {
				u := binary.BigEndian.Uint64(g.hdr[1:9])
				if u > uint64(g.max) {
					return errMessageTooLarge
				}
				size = int64(u)
			}
			g.hdr = g.hdr[:0]
			g.frames++
			g.bytes += size
			if g.bytes > g.max || g.frames > maxFrames {
				return errMessageTooLarge
			}
			if flags&flagMore == 0 {
				g.frames, g.bytes = 0, 0
			}
			g.body = size
		}
	}
	return nil
}

// isOversized tells whether err came from the guard.
func isOversized(err error) bool { return errors.Is(err, ErrTooLarge) }
