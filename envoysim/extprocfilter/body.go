package extprocfilter

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
)

// readChunkSize bounds one chunk read from a socket. Envoy hands HTTP/1 data
// to filters in slices of about this size, so a large body reaches an ext_proc
// server as several chunks, as it would behind Envoy.
const readChunkSize = 16 << 10

// Chunk is one piece of a body as a filter sees it. The last chunk has
// EndOfStream set; it may be empty.
type Chunk struct {
	Data        []byte
	EndOfStream bool
	// Trailers, when set on the last chunk, end the body instead of an
	// end_of_stream flag on a data chunk.
	Trailers Headers
}

// Body yields the chunks of one body as they arrive. Next returns io.EOF after
// the chunk with EndOfStream. Close releases whatever feeds the body; it may
// be called more than once.
type Body interface {
	Next(ctx context.Context) (Chunk, error)
	Close() error
}

// BodyFromChunks returns a body made of the given chunks, the last one
// carrying end_of_stream. No chunk at all gives one empty final chunk.
func BodyFromChunks(chunks ...[]byte) Body {
	b := &sliceBody{}
	for i, c := range chunks {
		b.chunks = append(b.chunks, Chunk{Data: c, EndOfStream: i == len(chunks)-1})
	}
	if len(b.chunks) == 0 {
		b.chunks = []Chunk{{EndOfStream: true}}
	}
	return b
}

type sliceBody struct{ chunks []Chunk }

func (b *sliceBody) Next(ctx context.Context) (Chunk, error) {
	if err := ctx.Err(); err != nil {
		return Chunk{}, err
	}
	if len(b.chunks) == 0 {
		return Chunk{}, io.EOF
	}
	c := b.chunks[0]
	b.chunks = b.chunks[1:]
	return c, nil
}

func (b *sliceBody) Close() error { return nil }

// BodyFromReader cuts r into chunks the way Envoy's HTTP/1 codec feeds a
// filter: each read is a chunk; with a known length (>= 0) end_of_stream rides
// on the last data chunk, with an unknown one (-1, chunked transfer) it comes
// as an empty chunk once the terminating chunk is seen.
func BodyFromReader(r io.Reader, length int64) Body {
	return &readerBody{r: r, remaining: length}
}

type readerBody struct {
	r         io.Reader
	remaining int64 // -1 when unknown
	eof, done bool
	buf       []byte
}

func (b *readerBody) Next(ctx context.Context) (Chunk, error) {
	for {
		if b.done {
			return Chunk{}, io.EOF
		}
		if err := ctx.Err(); err != nil {
			return Chunk{}, err
		}
		if b.remaining == 0 || b.eof {
			b.done = true
			return Chunk{EndOfStream: true}, nil
		}
		if b.buf == nil {
			b.buf = make([]byte, readChunkSize)
		}
		p := b.buf
		if b.remaining > 0 && b.remaining < int64(len(p)) {
			p = p[:b.remaining]
		}
		n, err := b.r.Read(p)
		if errors.Is(err, io.EOF) {
			if b.remaining > int64(n) {
				return Chunk{}, io.ErrUnexpectedEOF
			}
			b.eof = true
		} else if err != nil {
			return Chunk{}, err
		}
		if n == 0 {
			continue
		}
		c := Chunk{Data: bytes.Clone(p[:n])}
		if b.remaining > 0 {
			b.remaining -= int64(n)
			if b.remaining == 0 {
				c.EndOfStream, b.done = true, true
			}
		}
		return c, nil
	}
}

func (b *readerBody) Close() error {
	if c, ok := b.r.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// ReadAll drains b and returns its bytes and trailers.
func ReadAll(ctx context.Context, b Body) ([]byte, Headers, error) {
	var out []byte
	for {
		c, err := b.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out, nil, nil
		}
		if err != nil {
			return out, nil, err
		}
		out = append(out, c.Data...)
		if c.EndOfStream {
			return out, c.Trailers, nil
		}
	}
}

// NewBodyReader adapts a Body to an io.ReadCloser, e.g. for an upstream
// request. Err reports the first error other than io.EOF that Read met, so a
// caller can tell a local reply from the transport's own error.
func NewBodyReader(ctx context.Context, b Body) *BodyReader {
	return &BodyReader{ctx: ctx, body: b}
}

// BodyReader is the io.ReadCloser returned by NewBodyReader.
type BodyReader struct {
	ctx  context.Context
	body Body
	cur  []byte
	eos  bool

	mu      sync.Mutex
	err     error
	touched bool
}

func (r *BodyReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	r.touched = true
	r.mu.Unlock()
	for len(r.cur) == 0 {
		if r.eos {
			return 0, io.EOF
		}
		c, err := r.body.Next(r.ctx)
		if errors.Is(err, io.EOF) {
			r.eos = true
			continue
		}
		if err != nil {
			r.mu.Lock()
			if r.err == nil {
				r.err = err
			}
			r.mu.Unlock()
			return 0, err
		}
		r.cur, r.eos = c.Data, c.EndOfStream
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// Touched reports whether anything was read, i.e. whether the body can no
// longer be sent again from its start.
func (r *BodyReader) Touched() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.touched
}

// Close closes the underlying body.
func (r *BodyReader) Close() error { return r.body.Close() }

// Err returns the first read error other than io.EOF.
func (r *BodyReader) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// prefixBody replays chunks that were read but never reached the server,
// then continues with the rest of the original body: what a filter that fails
// open hands on.
type prefixBody struct {
	held []Chunk
	rest Body
	done bool
}

func (b *prefixBody) Next(ctx context.Context) (Chunk, error) {
	if b.done {
		return Chunk{}, io.EOF
	}
	if len(b.held) > 0 {
		c := b.held[0]
		b.held = b.held[1:]
		b.done = c.EndOfStream
		return c, nil
	}
	c, err := b.rest.Next(ctx)
	if err == nil && c.EndOfStream {
		b.done = true
	}
	return c, err
}

func (b *prefixBody) Close() error { return b.rest.Close() }

// errSkipped closes a filter's output when the filter stopped processing
// without having taken any of the body: the consumer then reads the original
// body from the sender's hand-off.
var errSkipped = errors.New("ext_proc filter skipped")

// pipe carries a filter's processed body chunks from the gRPC receive loop to
// whoever consumes the filter's output. It is unbuffered, so a slow consumer
// slows the server down through gRPC flow control, as Envoy's watermarks do.
type pipe struct {
	ch        chan Chunk
	closed    chan struct{} // closed by closeWrite
	gone      chan struct{} // closed when the consumer stops reading
	closeOnce sync.Once
	goneOnce  sync.Once
	err       error // why the writer closed; written before closed is closed
}

func newPipe() *pipe {
	return &pipe{ch: make(chan Chunk), closed: make(chan struct{}), gone: make(chan struct{})}
}

var errConsumerGone = errors.New("body consumer stopped reading")

func (p *pipe) write(c Chunk) error {
	select {
	case p.ch <- c:
		return nil
	case <-p.closed:
		return p.err
	case <-p.gone:
		return errConsumerGone
	}
}

func (p *pipe) closeWrite(err error) {
	p.closeOnce.Do(func() {
		p.err = err
		close(p.closed)
	})
}

func (p *pipe) next(ctx context.Context) (Chunk, error) {
	select {
	case c := <-p.ch:
		return c, nil
	case <-p.closed:
		if p.err == nil {
			return Chunk{}, io.ErrUnexpectedEOF
		}
		return Chunk{}, p.err
	case <-ctx.Done():
		return Chunk{}, ctx.Err()
	}
}

func (p *pipe) stopReading() { p.goneOnce.Do(func() { close(p.gone) }) }

// outBody is a filter's processed body: chunks from the server, or, if the
// filter failed open before any body reached the server, the original body
// handed over by the sender.
type outBody struct {
	p       *pipe
	handoff chan Body
	cur     Body
	done    bool
}

func (b *outBody) Next(ctx context.Context) (Chunk, error) {
	if b.done {
		return Chunk{}, io.EOF
	}
	if b.cur == nil {
		c, err := b.p.next(ctx)
		if !errors.Is(err, errSkipped) {
			if err == nil && c.EndOfStream {
				b.done = true
			}
			return c, err
		}
		select {
		case b.cur = <-b.handoff:
		case <-ctx.Done():
			return Chunk{}, ctx.Err()
		}
	}
	c, err := b.cur.Next(ctx)
	if err == nil && c.EndOfStream {
		b.done = true
	}
	return c, err
}

func (b *outBody) Close() error {
	b.p.stopReading()
	if b.cur != nil {
		return b.cur.Close()
	}
	return nil
}
