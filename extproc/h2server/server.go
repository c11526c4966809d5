// Package h2server serves gRPC streams over an HTTP/2 of its own, for the
// ext_proc server.
//
// grpc-go hands every message from the connection's reader goroutine to
// the stream's goroutine and every answer to a writer goroutine; at tens
// of thousands of one-request streams a second on two cores, those
// hand-offs and the scheduler's queueing between them are most of a
// picker's CPU and its latency tail. Here one goroutine per connection
// reads the frames, calls the stream's Receiver as each message completes
// and writes what was answered in one system call once it has read all
// that had arrived, as an event loop does. A Receiver must therefore not
// block: a handler that waits (a flow-control queue) belongs on grpc-go.
//
// It implements what a gateway's ext_proc client needs of a gRPC server:
// TLS with ALPN (and mutual TLS, by the tls.Config), flow control both
// ways with a bound per stream, a maximum message size, grpc-timeout as
// the stream context's deadline, RST_STREAM, GOAWAY and a graceful drain,
// keepalive pings with grpc-go's enforcement, and status trailers. It does
// not implement compression (it announces none), server push or
// priorities.
package h2server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// ErrServerClosed is what Serve returns after Shutdown or Close.
var ErrServerClosed = errors.New("h2server: server closed")

// Handler opens the streams of a server.
type Handler interface {
	// Open is called, on the connection's goroutine, with each new
	// stream's headers. It returns the stream's Receiver, or an error
	// whose gRPC status (codes.Unknown for a plain error) ends the stream
	// at once (codes.Unimplemented for a method it does not serve).
	Open(st *Stream) (Receiver, error)
}

// Receiver takes one stream's messages. Its methods are called on the
// connection's goroutine, one at a time, and must not block: every other
// stream of the connection waits meanwhile.
type Receiver interface {
	// Message handles one whole message; the bytes are valid only during
	// the call. done ends the stream with status OK; an error ends it
	// with the error's status. Messages after either are dropped.
	Message(msg []byte) (done bool, err error)
	// Close is called once, last: err is nil when the stream ended
	// normally (the client half-closed, or Message said done) and says
	// why otherwise (Message's error, a reset, a lost connection).
	Close(err error)
}

// Options configure a Server.
type Options struct {
	// TLS, when set, serves TLS with it (its NextProtos should offer
	// "h2"); nil serves plain text (HTTP/2 with prior knowledge).
	TLS *tls.Config
	// MaxRecvMsgSize bounds a received message; a larger one ends its
	// stream with RESOURCE_EXHAUSTED. 0 means 4 MiB, grpc-go's default.
	MaxRecvMsgSize int
	// Budget, when set, is charged for the buffers that assemble messages
	// spanning frames, as they grow, and for the answers that wait for the
	// client's window; nil charges nothing.
	Budget Budget
	// MaxConcurrentStreams, when set, is announced to each client as
	// SETTINGS_MAX_CONCURRENT_STREAMS and enforced: a stream opened beyond
	// it is refused with RST_STREAM REFUSED_STREAM (RFC 9113 section
	// 5.1.2), which tells the client that nothing of it was processed. 0
	// announces and enforces nothing.
	MaxConcurrentStreams uint32
	// UnsentTimeout bounds how long a stream that has ended on the
	// server's side (its status is waiting behind its last answers) may
	// wait for the client's window: past it the answers are dropped and
	// the stream reset, so that a client that never reads does not keep
	// them, nor its stream slot, for as long as its connection lasts. 0
	// waits as long as the connection lasts.
	UnsentTimeout time.Duration
	// Refused, when set, is called (on the connection's goroutine) for
	// each stream refused for MaxConcurrentStreams.
	Refused func()
	Logger  logr.Logger
}

// Budget bounds the bytes all streams of a process may hold. Reserve
// takes n bytes, or says no and takes nothing; Release gives n back.
// Hold charges n bytes of answers that wait for the client's window,
// whatever the budget says (they are held already: the answer was
// made), so that what Reserve may take shrinks while they wait; Unhold
// gives them back once they are written or dropped.
type Budget interface {
	Reserve(n int64) bool
	Release(n int64)
	Hold(n int64)
	Unhold(n int64)
}

// Defaults and bounds; see Options and the flow-control notes in conn.go.
const (
	defaultMaxRecvMsgSize = 4 << 20
	// streamWindow is each stream's receive window; the transport holds at
	// most about this much of a stream's data beyond the message it is
	// assembling.
	streamWindow = 1 << 20
	// connWindow is the connection's receive window.
	connWindow = 16 << 20
	// maxReadFrameSize is the largest frame a client may send: HTTP/2's
	// default, as no other is announced.
	maxReadFrameSize = 16 << 10
	// maxHeaderListSize bounds a request's header list.
	maxHeaderListSize = 64 << 10
	// handshakeTimeout bounds the TLS handshake and the client preface.
	handshakeTimeout = 10 * time.Second
)

// Server serves gRPC streams to a Handler.
type Server struct {
	h      Handler
	opts   Options
	blocks headerBlocks

	mu       sync.Mutex
	lns      map[net.Listener]bool
	conns    map[*conn]bool
	draining bool
	wg       sync.WaitGroup
}

// New makes a server of h.
func New(h Handler, opts Options) *Server {
	if opts.MaxRecvMsgSize <= 0 {
		opts.MaxRecvMsgSize = defaultMaxRecvMsgSize
	}
	return &Server{h: h, opts: opts, blocks: newHeaderBlocks(), lns: map[net.Listener]bool{}, conns: map[*conn]bool{}}
}

// Serve accepts connections on ln and serves them until Shutdown or
// Close, and then returns ErrServerClosed.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = true
	s.mu.Unlock()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.draining
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			// Out of file descriptors, an aborted handshake and the like
			// (syscall.Errno says which are temporary): wait and go on,
			// as net/http and grpc-go do.
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		c := newConn(s, nc)
		s.mu.Lock()
		if s.draining {
			s.mu.Unlock()
			_ = nc.Close()
			return ErrServerClosed
		}
		s.conns[c] = true
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.serve()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Shutdown stops accepting, sends every connection a GOAWAY, and waits
// until their open streams have ended and they have closed, or until ctx
// ends; then it closes what is left and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	for ln := range s.lns {
		_ = ln.Close()
	}
	// Each GOAWAY is written on its own goroutine: a connection whose
	// client stopped reading has a write blocked under its lock, and
	// waiting for it here would keep the deadline below from ever being
	// read. Close, at the deadline, closes the socket under that write.
	for c := range s.conns {
		go c.goAway()
	}
	s.mu.Unlock()
	// Connections leave the set as they close; polling keeps the set a
	// plain map for a wait that happens once in a process's life.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			s.wg.Wait()
			return nil
		}
		select {
		case <-ctx.Done():
			s.Close()
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Close stops accepting and closes every connection at once; their open
// streams are closed with an error.
func (s *Server) Close() {
	s.mu.Lock()
	s.draining = true
	for ln := range s.lns {
		_ = ln.Close()
	}
	for c := range s.conns {
		_ = c.nc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}
