package h2server

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/infergate/infergate/internal/grpcwire"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/status"
)

// ErrStreamEnded is what Send returns once its stream has ended.
var ErrStreamEnded = errors.New("h2server: the stream has ended")

// Stream is one gRPC call.
type Stream struct {
	c      *conn
	id     uint32
	path   string
	ctx    context.Context
	cancel context.CancelFunc

	// The connection goroutine's alone.
	recv       Receiver
	buf        []byte // the start of a message not yet whole
	halfClosed bool   // the client has sent all it will, or may send no more; written under c.wmu
	// clientEnded: the client ended its side itself (END_STREAM or
	// RST_STREAM), so any frame after is its error.
	clientEnded   bool
	contentLength int64 // the request's content-length; -1 without one
	received      int64 // DATA payload received, against contentLength
	finished      bool  // the Receiver is closed

	// Under c.wmu.
	headersSent bool
	ended       bool        // Send fails: the status is written or waits, or the stream is gone
	pending     []byte      // DATA waiting for the client's window, charged to the Budget (setPending)
	trailers    []byte      // the status, written when pending has drained
	rstAfter    bool        // reset after the status: the client has not half-closed
	expiry      *time.Timer // ends the call at the client's grpc-timeout
	unsent      *time.Timer // drops the last answers of an ended stream at UnsentTimeout
	sendWindow  int64
	unacked     int64 // bytes received and not yet granted back
}

// Path is the method called, "/package.Service/Method".
func (st *Stream) Path() string { return st.path }

// Context ends when the stream does, or at the client's grpc-timeout.
func (st *Stream) Context() context.Context { return st.ctx }

// Send sends one message. It may be called from any goroutine and does
// not wait for the client's window: what does not fit is sent as the
// client grants more, before the stream's status.
func (st *Stream) Send(msg []byte) error {
	c := st.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if st.ended {
		return ErrStreamEnded
	}
	if c.werr != nil {
		return c.werr
	}
	if !st.headersSent {
		st.headersSent = true
		_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: c.s.blocks.headers, EndHeaders: true})
		c.wrote = true
	}
	prefix := grpcwire.Prefix(len(msg))
	n := 0 // written now: nothing while earlier answers wait, to keep the order
	if len(st.pending) == 0 {
		n = c.writeData(st, prefix[:], msg)
	}
	if n < len(prefix)+len(msg) {
		if len(st.pending) == 0 {
			c.blocked = append(c.blocked, st)
		}
		c.setPending(st, append(append(st.pending, prefix[min(n, len(prefix)):]...), msg[max(n-len(prefix), 0):]...))
	}
	c.flushUnlessDispatching()
	return c.werr
}

// End ends the call with err's status (nil: OK) once the answers already
// sent are out, from any goroutine: a Receiver that hands a message's work
// to a goroutine of its own ends the call from there. The Receiver's Close
// follows on the connection goroutine, with err, when it next reads a
// frame or closes; the Receiver should let go of its own state at End
// rather than wait for it. Nothing is sent once the stream has ended.
func (st *Stream) End(err error) {
	c := st.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if st.ended || c.werr != nil {
		return
	}
	c.endElsewhere(st, err, false)
}

// Cut ends the call at once, from any goroutine: answers still waiting
// for the client's window are dropped (and their bytes given back to the
// Budget), the status err gives (nil: OK) goes out, and a reset follows,
// as at the client's grpc-timeout. A processor ends so a stream whose
// client has stopped taking its answers; End would wait for them. The
// Receiver's Close follows as after End.
func (st *Stream) Cut(err error) {
	c := st.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if st.ended || c.werr != nil {
		return
	}
	c.setPending(st, nil)
	c.endElsewhere(st, err, true)
}

// headerBlocks are the header blocks a server writes, encoded once.
// They use no HPACK dynamic table, so any block is valid on any
// connection at any time.
type headerBlocks struct {
	headers []byte // :status 200, content-type
	ok      []byte // grpc-status 0, after headers
	okOnly  []byte // a trailers-only OK
}

func newHeaderBlocks() headerBlocks {
	status200 := [2]string{":status", "200"}
	ct := [2]string{"content-type", "application/grpc"}
	ok := [2]string{"grpc-status", "0"}
	return headerBlocks{
		headers: headerBlock(status200, ct),
		ok:      headerBlock(ok),
		okOnly:  headerBlock(status200, ct, ok),
	}
}

// status is the block that ends a stream with err's status; only says
// whether no headers went out before it.
func (b headerBlocks) status(err error, only bool) []byte {
	if err == nil {
		if only {
			return b.okOnly
		}
		return b.ok
	}
	s := status.Convert(err)
	var fields [][2]string
	if only {
		fields = append(fields, [2]string{":status", "200"}, [2]string{"content-type", "application/grpc"})
	}
	fields = append(fields, [2]string{"grpc-status", strconv.Itoa(int(s.Code()))})
	if m := s.Message(); m != "" {
		fields = append(fields, [2]string{"grpc-message", encodeMessage(m)})
	}
	return headerBlock(fields...)
}

// maxMessageBytes bounds a grpc-message, so that a status always fits one
// frame.
const maxMessageBytes = 4 << 10

// encodeMessage percent-encodes a status message as gRPC requires: bytes
// outside printable ASCII, and '%'.
func encodeMessage(m string) string {
	if len(m) > maxMessageBytes {
		m = m[:maxMessageBytes]
	}
	const hex = "0123456789ABCDEF"
	var b []byte
	for i := 0; i < len(m); i++ {
		ch := m[i]
		if ch >= 0x20 && ch <= 0x7e && ch != '%' {
			b = append(b, ch)
			continue
		}
		b = append(b, '%', hex[ch>>4], hex[ch&0xf])
	}
	return string(b)
}

// headerBlock encodes fields (name, value) with HPACK and no dynamic
// table, so that the block reads the same on any connection at any time
// and can be encoded once.
func headerBlock(fields ...[2]string) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	enc.SetMaxDynamicTableSizeLimit(0)
	for _, f := range fields {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}) // a bytes.Buffer takes every write
	}
	return b.Bytes()
}
