package h2server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/internal/testcert"
)

// The test service: every method takes and answers BytesValue messages.
const (
	methodEcho  = "/test.Service/Echo"  // answers each message with itself; a message "end" ends the call OK
	methodFail  = "/test.Service/Fail"  // ends with the status the message names
	methodLater = "/test.Service/Later" // answers from another goroutine, after the connection has moved on
	methodWait  = "/test.Service/Wait"  // answers nothing; reports its context's deadline
)

// service records how its streams end.
type service struct {
	mu       sync.Mutex
	closed   []error
	deadline chan time.Time
}

func (s *service) Open(st *Stream) (Receiver, error) {
	switch st.Path() {
	case methodEcho, methodFail, methodLater:
		return &receiver{s: s, st: st}, nil
	case methodWait:
		d, _ := st.Context().Deadline()
		s.deadline <- d
		return &receiver{s: s, st: st}, nil
	}
	return nil, status.Errorf(codes.Unimplemented, "unknown method %s", st.Path())
}

func (s *service) closes() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.closed...)
}

type receiver struct {
	s  *service
	st *Stream
}

func (r *receiver) Message(msg []byte) (bool, error) {
	var in wrapperspb.BytesValue
	if err := proto.Unmarshal(msg, &in); err != nil {
		return false, err
	}
	switch r.st.Path() {
	case methodFail:
		return false, status.Error(codes.FailedPrecondition, string(in.Value))
	case methodLater:
		go func() {
			time.Sleep(10 * time.Millisecond)
			_ = r.st.Send(msg)
		}()
		return false, nil
	case methodWait:
		return false, nil
	}
	if string(in.Value) == "end" {
		return true, nil
	}
	return false, r.st.Send(msg)
}

func (r *receiver) Close(err error) {
	r.s.mu.Lock()
	r.s.closed = append(r.s.closed, err)
	r.s.mu.Unlock()
}

// serve starts a server of svc on a loopback port; it stops with the test.
func serve(t *testing.T, svc *service, opts Options) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(svc, opts)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

var bidi = &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}

func open(t *testing.T, ctx context.Context, cc *grpc.ClientConn, method string) grpc.ClientStream {
	t.Helper()
	cs, err := cc.NewStream(ctx, bidi, method)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func bytesOf(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	return b
}

// TestEcho runs calls of small and large messages (past every window, both
// ways) over plain text and TLS, several at once on one connection.
func TestEcho(t *testing.T) {
	ca := testcert.NewCA(t, "h2server-test")
	for _, tc := range []struct {
		name   string
		server *tls.Config
		client credentials.TransportCredentials
	}{
		{"plain", nil, nil},
		{"tls", &tls.Config{Certificates: []tls.Certificate{ca.Server(t)}, NextProtos: []string{"h2"}},
			credentials.NewTLS(&tls.Config{RootCAs: ca.Pool})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &service{}
			_, addr := serve(t, svc, Options{TLS: tc.server})
			cc := dial(t, addr, tc.client)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			sizes := []int{0, 1, 1000, 70_000, 3 << 20}
			var wg sync.WaitGroup
			for call := range 4 {
				wg.Go(func() {
					cs := open(t, ctx, cc, methodEcho)
					for i, n := range sizes {
						want := bytesOf(n, byte(call+i))
						if err := cs.SendMsg(wrapperspb.Bytes(want)); err != nil {
							t.Errorf("call %d send %d: %v", call, n, err)
							return
						}
						var got wrapperspb.BytesValue
						if err := cs.RecvMsg(&got); err != nil {
							t.Errorf("call %d receive %d: %v", call, n, err)
							return
						}
						if !bytes.Equal(got.Value, want) {
							t.Errorf("call %d: %d bytes came back as %d different ones", call, n, len(got.Value))
						}
					}
					if err := cs.CloseSend(); err != nil {
						t.Error(err)
					}
					if err := cs.RecvMsg(&wrapperspb.BytesValue{}); err != io.EOF {
						t.Errorf("call %d ended with %v, want OK", call, err)
					}
				})
			}
			wg.Wait()
			closes := svc.closes()
			if len(closes) != 4 {
				t.Fatalf("%d streams closed, want 4", len(closes))
			}
			for _, err := range closes {
				if err != nil {
					t.Errorf("a stream that ended normally closed with %v", err)
				}
			}
		})
	}
}

// TestStatus checks the ways a call ends with a status: a Receiver's
// error (its message carried intact), an unknown method, a message over
// the size limit, Message saying done.
func TestStatus(t *testing.T) {
	svc := &service{}
	_, addr := serve(t, svc, Options{MaxRecvMsgSize: 1 << 20})
	cc := dial(t, addr, nil)
	for _, tc := range []struct {
		name, method string
		send         []byte
		code         codes.Code
		message      string
	}{
		{"receiver error", methodFail, []byte("pool 100% busy: é"), codes.FailedPrecondition, "pool 100% busy: é"},
		{"unknown method", "/test.Service/Nope", []byte("x"), codes.Unimplemented, "unknown method /test.Service/Nope"},
		{"message too large", methodEcho, make([]byte, 2<<20), codes.ResourceExhausted, "received message larger than max"},
		{"done", methodEcho, []byte("end"), codes.OK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cs := open(t, ctx, cc, tc.method)
			_ = cs.SendMsg(wrapperspb.Bytes(tc.send)) // may fail once the server has ended the call
			err := cs.RecvMsg(&wrapperspb.BytesValue{})
			if tc.code == codes.OK {
				if err != io.EOF {
					t.Fatalf("ended with %v, want OK", err)
				}
				return
			}
			s := status.Convert(err)
			if s.Code() != tc.code || !strings.Contains(s.Message(), tc.message) {
				t.Fatalf("ended with %v, want %v %q", err, tc.code, tc.message)
			}
		})
	}
}

// TestSendFromAnotherGoroutine: answers sent after the connection has gone
// back to reading still reach the client (the sender flushes them).
func TestSendFromAnotherGoroutine(t *testing.T) {
	_, addr := serve(t, &service{}, Options{})
	cc := dial(t, addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := open(t, ctx, cc, methodLater)
	for i := range 3 {
		want := bytesOf(100, byte(i))
		if err := cs.SendMsg(wrapperspb.Bytes(want)); err != nil {
			t.Fatal(err)
		}
		var got wrapperspb.BytesValue
		if err := cs.RecvMsg(&got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Value, want) {
			t.Fatal("a later answer came back different")
		}
	}
}

// TestClientCancelClosesTheStream: a call the client cancels closes its
// Receiver with an error, and the stream's context ends.
func TestClientCancelClosesTheStream(t *testing.T) {
	svc := &service{}
	_, addr := serve(t, svc, Options{})
	cc := dial(t, addr, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cs := open(t, ctx, cc, methodEcho)
	if err := cs.SendMsg(wrapperspb.Bytes([]byte("a"))); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(&wrapperspb.BytesValue{}); err != nil {
		t.Fatal(err)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for len(svc.closes()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	closes := svc.closes()
	if len(closes) != 1 || status.Code(closes[0]) != codes.Canceled {
		t.Fatalf("closes %v, want one Canceled", closes)
	}
}

// TestGRPCTimeoutIsTheContextDeadline: the client's deadline reaches the
// stream's context.
func TestGRPCTimeoutIsTheContextDeadline(t *testing.T) {
	svc := &service{deadline: make(chan time.Time, 1)}
	_, addr := serve(t, svc, Options{})
	cc := dial(t, addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	want, _ := ctx.Deadline()
	_ = open(t, ctx, cc, methodWait)
	select {
	case got := <-svc.deadline:
		if d := got.Sub(want); d < -time.Second || d > time.Second {
			t.Fatalf("stream deadline %v, client's %v", got, want)
		}
	case <-ctx.Done():
		t.Fatal("the stream never opened")
	}
}

// TestShutdownDrains: after Shutdown begins, a call in progress runs to
// its end and new connections are refused; Shutdown returns once it has.
// A drain that outlasts its context cuts the call.
func TestShutdownDrains(t *testing.T) {
	svc := &service{}
	s, addr := serve(t, svc, Options{})
	cc := dial(t, addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := open(t, ctx, cc, methodEcho)
	roundTrip := func() error {
		if err := cs.SendMsg(wrapperspb.Bytes([]byte("a"))); err != nil {
			return err
		}
		return cs.RecvMsg(&wrapperspb.BytesValue{})
	}
	if err := roundTrip(); err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	time.Sleep(50 * time.Millisecond)
	if err := roundTrip(); err != nil {
		t.Fatalf("the open call failed during the drain: %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = c.Close()
		t.Fatal("a new connection was accepted during the drain")
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a call open", err)
	default:
	}
	_ = cs.CloseSend()
	if err := cs.RecvMsg(&wrapperspb.BytesValue{}); err != io.EOF {
		t.Fatalf("the call ended with %v during the drain", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}

	svc2 := &service{}
	s2, addr2 := serve(t, svc2, Options{})
	cs2 := open(t, ctx, dial(t, addr2, nil), methodEcho)
	if err := cs2.SendMsg(wrapperspb.Bytes([]byte("a"))); err != nil {
		t.Fatal(err)
	}
	if err := cs2.RecvMsg(&wrapperspb.BytesValue{}); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	if err := s2.Shutdown(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown past its deadline returned %v", err)
	}
	if closes := svc2.closes(); len(closes) != 1 || closes[0] == nil {
		t.Fatalf("the cut call closed with %v, want an error", closes)
	}
}

// TestTooManyPings: a client that pings without pause is told to go away,
// as grpc-go's enforcement does.
func TestTooManyPings(t *testing.T) {
	_, addr := serve(t, &service{}, Options{})
	_, fr := rawClient(t, addr)
	for i := range 5 {
		if err := fr.WritePing(false, [8]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	acks, g := acksUntilGoAway(fr)
	if g == nil || g.ErrCode != http2.ErrCodeEnhanceYourCalm || string(g.DebugData()) != "too_many_pings" {
		t.Fatalf("after %d ping acks: GOAWAY %v, want ENHANCE_YOUR_CALM too_many_pings", acks, g)
	}
	// Every ping is answered, the one too many too, as grpc-go does.
	if acks != maxPingStrikes+2 {
		t.Fatalf("%d pings answered before the GOAWAY, want %d", acks, maxPingStrikes+2)
	}
}

// acksUntilGoAway reads frames until a GOAWAY (nil if the connection ends
// or goes quiet first) and counts the ping acks before it.
func acksUntilGoAway(fr *http2.Framer) (acks int, goAway *http2.GoAwayFrame) {
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return acks, nil
		}
		switch f := f.(type) {
		case *http2.PingFrame:
			acks++
		case *http2.GoAwayFrame:
			return acks, f
		}
	}
}

func TestParseTimeout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1S", time.Second, true},
		{"250m", 250 * time.Millisecond, true},
		{"99999999n", 99999999, true},
		{"2H", 2 * time.Hour, true},
		{"S", 0, false},
		{"123456789S", 0, false},
		{"10x", 0, false},
		{"1.5S", 0, false},
	} {
		got, err := parseTimeout(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseTimeout(%q) = %v, %v", tc.in, got, err)
		}
	}
}

// TestMessageSplitEverywhere: a message whose prefix and body are split
// across frames at every byte arrives whole, and a prefix split across
// frames that announces more than the limit is refused without the
// buffer for it.
func TestMessageSplitEverywhere(t *testing.T) {
	svc := &service{}
	s := New(svc, Options{MaxRecvMsgSize: 1 << 10})
	for _, tc := range []struct {
		name string
		msg  []byte
		ok   bool
	}{
		{"whole", append([]byte{0, 0, 0, 0, 3}, "abc"...), true},
		{"over the limit", []byte{0, 0xff, 0xff, 0xff, 0xff}, false},
	} {
		for cut := 1; cut < len(tc.msg); cut++ {
			c := &conn{s: s}
			var got [][]byte
			st := &Stream{c: c, recv: receiverFunc(func(m []byte) { got = append(got, append([]byte(nil), m...)) }), cancel: func() {}}
			st.ended = true // nothing to write
			c.deliver(st, tc.msg[:cut])
			c.deliver(st, tc.msg[cut:])
			if tc.ok && (len(got) != 1 || string(got[0]) != "abc" || st.finished) {
				t.Fatalf("%s cut at %d: got %q, finished %t", tc.name, cut, got, st.finished)
			}
			if !tc.ok && (!st.finished || cap(st.buf) > 1<<10) {
				t.Fatalf("%s cut at %d: finished %t, buffer of %d", tc.name, cut, st.finished, cap(st.buf))
			}
		}
	}
}

// receiverFunc takes messages and never ends its stream.
type receiverFunc func([]byte)

func (f receiverFunc) Message(m []byte) (bool, error) { f(m); return false, nil }
func (f receiverFunc) Close(error)                    {}

// flakyListener fails its first Accept with a temporary error, as one out
// of file descriptors does.
type flakyListener struct {
	net.Listener
	failed bool
}

type temporaryError struct{}

func (temporaryError) Error() string   { return "too many open files" }
func (temporaryError) Temporary() bool { return true }

func (l *flakyListener) Accept() (net.Conn, error) {
	if !l.failed {
		l.failed = true
		return nil, temporaryError{}
	}
	return l.Listener.Accept()
}

// TestServeOutlastsATemporaryAcceptError: a temporary Accept error is
// waited out, not the end of serving.
func TestServeOutlastsATemporaryAcceptError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(&service{}, Options{})
	done := make(chan error, 1)
	go func() { done <- s.Serve(&flakyListener{Listener: ln}) }()
	defer func() {
		s.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := open(t, ctx, dial(t, ln.Addr().String(), nil), methodEcho)
	if err := cs.SendMsg(wrapperspb.Bytes([]byte("a"))); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(&wrapperspb.BytesValue{}); err != nil {
		t.Fatalf("no answer after a temporary Accept error: %v", err)
	}
}

// TestAnswersAClientDoesNotReadAreBounded: a client that sends to an
// echoing stream and never reads the answers is stopped by flow control:
// the answers waiting in the server stay near two stream windows, not
// the 10 MB it tried to send.
func TestAnswersAClientDoesNotReadAreBounded(t *testing.T) {
	s, addr := serve(t, &service{}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := open(t, ctx, dial(t, addr, nil), methodEcho)
	sent := make(chan int, 1)
	go func() {
		n := 0
		for ; n < 100; n++ {
			if cs.SendMsg(wrapperspb.Bytes(make([]byte, 100_000))) != nil {
				break
			}
		}
		sent <- n
	}()
	time.Sleep(time.Second)
	select {
	case n := <-sent:
		t.Fatalf("all %d messages were sent with no answer read", n)
	default:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	held := 0
	for c := range s.conns {
		c.wmu.Lock()
		for _, st := range c.streams {
			held += len(st.pending)
		}
		c.wmu.Unlock()
	}
	if held == 0 || held > 2*streamWindow+2*100_100 {
		t.Fatalf("%d bytes of answers wait in the server, want some and at most about two windows", held)
	}
	t.Logf("%d bytes of answers held", held)
}

// TestReceiveWindowEnforced: a client that sends DATA past the receive
// window the server gave it has its stream reset with FLOW_CONTROL_ERROR
// (RFC 9113 section 6.9), as grpc-go resets it, instead of the server
// buffering whatever comes. The client reads no answers (its own window is
// 0), so the echoed answers wait and the server stops granting window.
func TestReceiveWindowEnforced(t *testing.T) {
	_, addr := serve(t, &service{}, Options{})
	_, fr := rawClient(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	callRaw(t, fr, 1, methodEcho)
	reset := make(chan http2.ErrCode, 1)
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				close(reset)
				return
			}
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
				reset <- f.ErrCode
				return
			case *http2.GoAwayFrame:
				reset <- f.ErrCode
				return
			}
		}
	}()
	msg := grpcMessage(t, 100_000)
	// Four windows' worth, past the one the server can have granted while
	// its answers wait (at most streamWindow beyond what it received).
	sent := 0
	for sent < 4*streamWindow {
		if err := writeMessage(fr, 1, msg); err != nil {
			t.Fatalf("writing DATA after %d bytes: %v", sent, err)
		}
		sent += len(msg)
		select {
		case code, ok := <-reset:
			if !ok || code != http2.ErrCodeFlowControl {
				t.Fatalf("after %d bytes: reset %v (read ok %v), want FLOW_CONTROL_ERROR", sent, code, ok)
			}
			if sent <= streamWindow {
				t.Fatalf("reset after %d bytes, within the window", sent)
			}
			return
		default:
		}
	}
	select {
	case code, ok := <-reset:
		if ok && code == http2.ErrCodeFlowControl {
			return
		}
		t.Fatalf("reset %v (read ok %v), want FLOW_CONTROL_ERROR", code, ok)
	case <-time.After(5 * time.Second):
		t.Fatalf("%d bytes sent past a %d-byte window and the stream was not reset", sent, streamWindow)
	}
}

// TestShutdownDeadlineWithAClientThatDoesNotRead: a client that stops
// reading leaves the server blocked in a socket write; Shutdown still ends
// at its deadline, closing the connection (grpc-go's GracefulStop bounded
// by Stop does the same), instead of waiting on the blocked write for ever.
func TestShutdownDeadlineWithAClientThatDoesNotRead(t *testing.T) {
	s, addr := serve(t, &service{}, Options{})
	// A window as large as HTTP/2 allows, so answers go out until the
	// socket buffers are full.
	nc, fr := rawClient(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1})
	if err := fr.WriteWindowUpdate(0, 1<<31-1-65535); err != nil {
		t.Fatal(err)
	}
	callRaw(t, fr, 1, methodEcho)
	msg := grpcMessage(t, 100_000)
	// 64 MB of echoed answers, far more than the socket buffers hold; the
	// client reads none of them. Within the stream's window (the server
	// grants it back as the answers go out).
	_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
	for range 640 {
		if writeMessage(fr, 1, msg) != nil {
			break // the server stopped reading: it is blocked writing
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- s.Shutdown(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Shutdown: %v, want its deadline exceeded", err)
		}
		t.Logf("Shutdown returned after %v", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown with a 500 ms deadline still running after 10 s")
	}
}

// TestGRPCTimeoutEndsTheStream: at the client's grpc-timeout the server
// ends the call on the wire with DEADLINE_EXCEEDED, as grpc-go does, even
// when neither side sends anything more; the Receiver is closed with that
// status once the connection next reads.
func TestGRPCTimeoutEndsTheStream(t *testing.T) {
	svc := &service{deadline: make(chan time.Time, 1)}
	_, addr := serve(t, svc, Options{})
	_, fr := rawClient(t, addr)
	start := time.Now()
	callRaw(t, fr, 1, methodWait, [2]string{"grpc-timeout", "300m"})
	<-svc.deadline
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no status %v after the 300 ms grpc-timeout: %v", time.Since(start), err)
		}
		mh, ok := f.(*http2.MetaHeadersFrame)
		if !ok || mh.StreamID != 1 || !mh.StreamEnded() {
			continue
		}
		var st string
		for _, hf := range mh.RegularFields() {
			if hf.Name == "grpc-status" {
				st = hf.Value
			}
		}
		if st != fmt.Sprint(int(codes.DeadlineExceeded)) {
			t.Fatalf("stream ended with grpc-status %q, want %d", st, codes.DeadlineExceeded)
		}
		if d := time.Since(start); d < 250*time.Millisecond || d > 2*time.Second {
			t.Fatalf("status after %v, want about 300 ms", d)
		}
		break
	}
	// The next frame the connection reads closes the Receiver.
	if err := fr.WritePing(false, [8]byte{1}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if closes := svc.closes(); len(closes) == 1 {
			if status.Code(closes[0]) != codes.DeadlineExceeded {
				t.Fatalf("the Receiver closed with %v", closes[0])
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the Receiver was not closed: %v", svc.closes())
}

// rawClient is a connection to addr spoken frame by frame, for what a
// grpc-go client never does: the preface and SETTINGS are sent; it closes
// with the test.
func rawClient(t *testing.T, addr string, settings ...http2.Setting) (net.Conn, *http2.Framer) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(nc, nc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	return nc, fr
}

// callRaw opens a gRPC call to method on stream id, with extra header
// fields after the usual ones.
func callRaw(t *testing.T, fr *http2.Framer, id uint32, method string, extra ...[2]string) {
	t.Helper()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	fields := append([][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "test"},
		{"content-type", "application/grpc"}, {"te", "trailers"}}, extra...)
	for _, kv := range fields {
		_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
}

// grpcMessage is a gRPC message (uncompressed, length-prefixed) holding a
// BytesValue of n bytes, what the test service echoes.
func grpcMessage(t *testing.T, n int) []byte {
	t.Helper()
	body, err := proto.Marshal(wrapperspb.Bytes(make([]byte, n)))
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{0, byte(len(body) >> 24), byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
}

// writeMessage sends msg on stream id in DATA frames of HTTP/2's default
// size, whatever the windows.
func writeMessage(fr *http2.Framer, id uint32, msg []byte) error {
	for off := 0; off < len(msg); off += 16384 {
		if err := fr.WriteData(id, false, msg[off:min(off+16384, len(msg))]); err != nil {
			return err
		}
	}
	return nil
}

// A ping that arrives with the calls before it, in one read, is a strike
// although those calls were answered: the answers were not sent yet, as
// in grpc-go, whose writer goroutine sends after its reader moved on.
// Counting them would let a client reset its strikes with a call per
// ping and ping without end.
func TestPingsPipelinedWithCallsStrike(t *testing.T) {
	_, addr := serve(t, &service{}, Options{})
	nc, fr := rawClient(t, addr)
	var burst bytes.Buffer
	pipelined := http2.NewFramer(&burst, nil)
	const pings = 5
	for i := range pings {
		id := uint32(2*i + 1)
		callRaw(t, pipelined, id, "/test.Service/Unknown")
		_ = pipelined.WriteData(id, true, nil)
		_ = pipelined.WritePing(false, [8]byte{byte(i)})
	}
	if _, err := nc.Write(burst.Bytes()); err != nil {
		t.Fatal(err)
	}
	// Without strikes every ping is answered and the connection stays.
	_ = nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	if acks, g := acksUntilGoAway(fr); g == nil || g.ErrCode != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("%d of %d pings answered, then GOAWAY %v, want ENHANCE_YOUR_CALM", acks, pings, g)
	}
}

// waitForPingAck sends a ping and reads until its ack: the server has
// then handled every frame sent before it.
func waitForPingAck(t *testing.T, fr *http2.Framer) {
	t.Helper()
	data := [8]byte{'s', 'y', 'n', 'c'}
	if err := fr.WritePing(false, data); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("waiting for the ping ack: %v", err)
		}
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() && p.Data == data {
			return
		}
	}
}

// TestAnnouncedSizeIsNotAllocated: messages that announce 4 MiB and send
// 40 bytes cost about what was sent, not what was announced. Before, each
// stream took a buffer of the announced size at once (the outside test:
// 250 such streams, a Go heap of 1,651 MiB).
func TestAnnouncedSizeIsNotAllocated(t *testing.T) {
	_, addr := serve(t, &service{}, Options{})
	_, fr := rawClient(t, addr)
	const streams = 50
	announced := make([]byte, 45)
	binary.BigEndian.PutUint32(announced[1:5], defaultMaxRecvMsgSize)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range streams {
		id := uint32(2*i + 1)
		callRaw(t, fr, id, methodEcho)
		if err := fr.WriteData(id, false, announced); err != nil {
			t.Fatal(err)
		}
	}
	waitForPingAck(t, fr)
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d streams each announcing %d bytes and sending %d: heap %+d KiB", streams, defaultMaxRecvMsgSize, len(announced), grown>>10)
	if limit := int64(streams * 64 << 10); grown > limit {
		t.Fatalf("the heap grew %d KiB for %d streams of %d bytes sent, over %d KiB", grown>>10, streams, len(announced), limit>>10)
	}
}

// countingBudget is a Budget of a fixed size that counts what is taken.
type countingBudget struct {
	mu          sync.Mutex
	limit, used int64
	refused     int
	held        int64 // answers waiting for window
}

func (b *countingBudget) Hold(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held += n
}

func (b *countingBudget) Unhold(n int64) { b.Hold(-n) }

func (b *countingBudget) holding() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

func (b *countingBudget) Reserve(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit {
		b.refused++
		return false
	}
	b.used += n
	return true
}

func (b *countingBudget) Release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
}

func (b *countingBudget) state() (used int64, refused int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.refused
}

// TestMessageBuffersChargeTheBudget: a message that spans frames is
// assembled in a buffer charged to the budget, given back when the stream
// ends; one the budget cannot take ends its stream RESOURCE_EXHAUSTED.
func TestMessageBuffersChargeTheBudget(t *testing.T) {
	budget := &countingBudget{limit: 1 << 20}
	_, addr := serve(t, &service{}, Options{Budget: budget})
	cc := dial(t, addr, insecure.NewCredentials())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	fits := open(t, ctx, cc, methodEcho)
	in := wrapperspb.Bytes(bytesOf(256<<10, 1))
	if err := fits.SendMsg(in); err != nil {
		t.Fatal(err)
	}
	out := new(wrapperspb.BytesValue)
	if err := fits.RecvMsg(out); err != nil || !bytes.Equal(out.Value, in.Value) {
		t.Fatalf("a 256 KiB message within a 1 MiB budget: %v", err)
	}
	_ = fits.CloseSend()
	if err := fits.RecvMsg(out); err != io.EOF {
		t.Fatalf("end of the call: %v", err)
	}

	tooLarge := open(t, ctx, cc, methodEcho)
	if err := tooLarge.SendMsg(wrapperspb.Bytes(bytesOf(2<<20, 2))); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	err := tooLarge.RecvMsg(out)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 2 MiB message over a 1 MiB budget: %v, want RESOURCE_EXHAUSTED", err)
	}
	// The server lets go of what it took when it ends a stream; the last
	// stream's end may still be on its way.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		used, refused := budget.state()
		if used == 0 && refused == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("budget used %d bytes and refused %d times after both calls ended, want 0 and 1", used, refused)
		}
	}
}

// TestHeaderListOverTheLimitEndsTheConnection: a header block that
// decodes past the header-list limit (an HPACK bomb: a 4 KB field indexed
// once and referenced from one byte each) ends the connection, so each
// such block costs the client a connection.
func TestHeaderListOverTheLimitEndsTheConnection(t *testing.T) {
	_, addr := serve(t, &service{}, Options{})
	_, fr := rawClient(t, addr)
	big := [2]string{"x-big", strings.Repeat("a", 4000)}
	var bomb [][2]string
	for range maxHeaderListSize/4000 + 1 {
		bomb = append(bomb, big)
	}
	callRaw(t, fr, 1, methodEcho, bomb...)
	if _, g := acksUntilGoAway(fr); g == nil || g.ErrCode != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("GOAWAY %v, want ENHANCE_YOUR_CALM", g)
	}
	if _, err := fr.ReadFrame(); err == nil {
		t.Fatal("the connection goes on after the GOAWAY")
	}
}

// TestMaxConcurrentStreams: the limit is announced in SETTINGS, a stream
// opened past it is refused with REFUSED_STREAM (RFC 9113 section
// 5.1.2) and counted, and a stream that ends makes room for another.
func TestMaxConcurrentStreams(t *testing.T) {
	const limit = 2
	var mu sync.Mutex
	refused := 0
	_, addr := serve(t, &service{}, Options{MaxConcurrentStreams: limit, Refused: func() { mu.Lock(); refused++; mu.Unlock() }})
	_, fr := rawClient(t, addr)
	var announced uint32
	for announced == 0 {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			announced, _ = sf.Value(http2.SettingMaxConcurrentStreams)
		}
	}
	if announced != limit {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", announced, limit)
	}
	for id := uint32(1); id <= 5; id += 2 {
		callRaw(t, fr, id, methodEcho)
	}
	if err := writeMessage(fr, 1, endMessage(t)); err != nil { // stream 1 ends
		t.Fatal(err)
	}
	callRaw(t, fr, 7, methodEcho) // in the room stream 1 left
	var resets []*http2.RSTStreamFrame
	ended := false
	for !ended || len(resets) < 1 {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			if f.StreamID != 1 {
				resets = append(resets, f)
			}
		case *http2.MetaHeadersFrame:
			ended = ended || (f.StreamID == 1 && f.StreamEnded())
		}
	}
	waitForPingAck(t, fr) // stream 7's fate is known by now
	if len(resets) != 1 || resets[0].StreamID != 5 || resets[0].ErrCode != http2.ErrCodeRefusedStream {
		t.Fatalf("resets %v, want stream 5 alone refused", resets)
	}
	mu.Lock()
	defer mu.Unlock()
	if refused != 1 {
		t.Fatalf("%d refusals counted, want 1", refused)
	}
}

// endMessage is the gRPC message that ends an echo call.
func endMessage(t *testing.T) []byte {
	t.Helper()
	body, err := proto.Marshal(wrapperspb.Bytes([]byte("end")))
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{0, 0, 0, 0, byte(len(body))}, body...)
}

// TestUnsentAnswersAreCharged: answers waiting for the client's window
// are charged to the budget while they wait; once the stream has ended
// they wait at most UnsentTimeout, then they are dropped, the stream is
// reset (CANCEL) and the charge given back.
func TestUnsentAnswersAreCharged(t *testing.T) {
	budget := &countingBudget{limit: 1 << 30}
	_, addr := serve(t, &service{}, Options{Budget: budget, UnsentTimeout: 100 * time.Millisecond})
	_, fr := rawClient(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	callRaw(t, fr, 1, methodEcho)
	msg := grpcMessage(t, 10_000)
	if err := writeMessage(fr, 1, msg); err != nil {
		t.Fatal(err)
	}
	waitForPingAck(t, fr)
	if held := budget.holding(); held != int64(len(msg)) {
		t.Fatalf("%d bytes charged for an answer of %d waiting for window", held, len(msg))
	}
	if err := writeMessage(fr, 1, endMessage(t)); err != nil { // the call ends; its answer still waits
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if rst, ok := f.(*http2.RSTStreamFrame); ok {
			if rst.ErrCode != http2.ErrCodeCancel {
				t.Fatalf("reset %v, want CANCEL", rst.ErrCode)
			}
			break
		}
	}
	if held := budget.holding(); held != 0 {
		t.Fatalf("%d bytes still charged after the answer was dropped", held)
	}
}
