package server

import (
	"context"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/extproc/h2server"
)

// Transports the ext_proc listener can serve with (Options.Transport).
const (
	// TransportAuto is what the processors serve by default: TransportGRPC.
	// TransportH2 matches grpc-go on h2spec, a grpc-js client and an
	// HTTP/2 attack suite (docs/transport.md), but has not served a real
	// gateway (Envoy's nghttp2/oghttp2, agentgateway's hyper); until it
	// has, it is opt-in.
	TransportAuto = "auto"
	// TransportGRPC is grpc-go.
	TransportGRPC = "grpc"
	// TransportH2 is extproc/h2server, opt-in: each connection's streams
	// are served on its one goroutine, for less CPU per request than
	// grpc-go and a shorter tail (README "Against the reference
	// implementations"). A handler that may block (Blocker) cannot use it.
	TransportH2 = "h2"
)

// Blocker is an optional Handler extension: a handler whose exchanges may
// wait inside a call (a queue holding requests until the pool has room)
// says so, and is served by grpc-go, which gives every stream a goroutine.
type Blocker interface {
	MayBlock() bool
}

// Method paths served on the ext_proc listener.
const (
	methodProcess     = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
	methodHealthCheck = "/grpc.health.v1.Health/Check"
)

// h2Handler opens the streams of the h2 transport: ext_proc, and the
// health service's Check, which gateways probe on the same port.
type h2Handler struct {
	s     *Server
	codec *codec
}

func (h h2Handler) Open(st *h2server.Stream) (h2server.Receiver, error) {
	switch st.Path() {
	case methodProcess:
		out := h2Sender{st: st, codec: h.codec}
		ps := h.s.openStream(st.Context(), out)
		if ps == nil {
			r := &h2Refused{out: out}
			if d := h.s.refusedWait(); d > 0 {
				r.timer = time.AfterFunc(d, func() { st.End(nil) })
			}
			return r, nil
		}
		p := &h2Process{s: h.s, ctx: st.Context(), st: ps, h2: st}
		ps.watch(p.endByWatchdog)
		return p, nil
	case methodHealthCheck:
		return &h2Health{s: h.s, ctx: st.Context(), out: h2Sender{st: st, codec: h.codec}}, nil
	}
	// The health service's Watch is not served here (gateways and the
	// kubelet call Check); the health listener serves all of it.
	return nil, status.Errorf(codes.Unimplemented, "unknown method %s", st.Path())
}

// h2Process is one ext_proc stream.
//
// Its messages are handled on the connection's goroutine, which serves
// all the connection's streams, and Envoy puts a whole worker's requests
// on one connection: a decision over a large body (parsing it, guardrails,
// prefix hashing) would hold them all. Such a decision runs on a goroutine
// of its own instead, and the connection goes on. What is cheap (headers,
// body chunks that are only kept, decisions over small bodies) stays on
// the connection's goroutine, which is what makes h2 cheaper than grpc-go.
type h2Process struct {
	s   *Server
	ctx context.Context
	st  *stream
	h2  *h2server.Stream
	in  inbound // the message being handled

	// mu guards what a decision on its own goroutine shares with the
	// connection goroutine.
	mu       sync.Mutex
	deciding chan struct{} // closed when the decision running is done; nil when none runs
	ended    bool          // the decision ended the stream
	closed   bool          // closeStream has been called
	closing  bool          // the transport closed the stream while a decision ran
	closeErr error
}

// offConnectionBytes is the body size from which a decision leaves the
// connection goroutine: below it a decision takes microseconds, less
// than handing it over would cost.
const offConnectionBytes = 16 << 10

func (p *h2Process) Message(b []byte) (bool, error) {
	// A client that sends more before a decision is answered waits for
	// it: messages are handled in order. Envoy sends nothing on a stream
	// between the end of a request body and its answer.
	p.mu.Lock()
	deciding, ended := p.deciding, p.ended
	p.mu.Unlock()
	if deciding != nil {
		<-deciding
		p.mu.Lock()
		ended = p.ended
		p.mu.Unlock()
	}
	if ended {
		return true, nil
	}
	if err := p.in.unmarshal(b); err != nil {
		return false, status.Errorf(codes.Internal, "unmarshal a ProcessingRequest: %v", err)
	}
	if !p.st.decidesOver(&p.in, offConnectionBytes) {
		return p.st.receive(p.ctx, &p.in)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.deciding = done
	p.mu.Unlock()
	go p.decide(done)
	return false, nil
}

// decide handles p.in off the connection goroutine, which waits for done
// before it hands p another message.
func (p *h2Process) decide(done chan struct{}) {
	defer close(done)
	end, err := p.st.receive(p.ctx, &p.in)
	if end || err != nil {
		p.h2.End(err)
	}
	p.mu.Lock()
	p.deciding = nil
	p.ended = end || err != nil
	closeNow := (p.ended || p.closing) && !p.closed
	p.closed = p.closed || closeNow
	if p.closing {
		err = p.closeErr
	}
	p.mu.Unlock()
	if closeNow {
		p.s.closeStream(p.ctx, p.st, err)
	}
}

// Close ends the stream's state, unless a decision still runs: that one
// ends it when done. The transport calls it once, also after End.
func (p *h2Process) Close(err error) {
	p.mu.Lock()
	if p.deciding != nil {
		p.closing, p.closeErr = true, err
		p.mu.Unlock()
		return
	}
	closeNow := !p.closed
	p.closed = true
	p.mu.Unlock()
	if closeNow {
		p.s.closeStream(p.ctx, p.st, err)
	}
}

// endByWatchdog ends the call from the idle watchdog's goroutine: with
// OK after its 408 (which goes out first), or at once with err, dropping
// the answers the client has not taken, at the stream idle timeout. It
// lets go of the stream's state (its --max-streams slot, its bytes) at
// once rather than when the connection next reads a frame; the
// transport's Close then finds it closed.
func (p *h2Process) endByWatchdog(err error) {
	if err == nil {
		p.h2.End(nil)
	} else {
		p.h2.Cut(err)
	}
	p.Close(err)
}

// h2Refused answers a stream over the cap, as refuse does on grpc-go,
// and ends it from its timer if no message comes.
type h2Refused struct {
	out   h2Sender
	timer *time.Timer
}

func (r *h2Refused) Message([]byte) (bool, error) { return true, r.out.Send(refusal()) }

func (r *h2Refused) Close(error) {
	if r.timer != nil {
		r.timer.Stop()
	}
}

// h2Health answers a health Check.
type h2Health struct {
	s   *Server
	ctx context.Context
	out h2Sender
}

func (h *h2Health) Message(b []byte) (bool, error) {
	req := &healthpb.HealthCheckRequest{}
	if err := proto.Unmarshal(b, req); err != nil {
		return false, status.Errorf(codes.Internal, "unmarshal a HealthCheckRequest: %v", err)
	}
	resp, err := h.s.health.Check(h.ctx, req)
	if err != nil {
		return true, err
	}
	return true, h.out.SendMsg(resp)
}

func (h *h2Health) Close(error) {}

// h2Sender sends a stream's answers, marshalled into the codec's pool.
type h2Sender struct {
	st    *h2server.Stream
	codec *codec
}

func (o h2Sender) Send(m *extprocv3.ProcessingResponse) error { return o.SendMsg(m) }

func (o h2Sender) SendMsg(v any) error {
	buf, err := o.codec.marshalPooled(v)
	if err != nil {
		return err
	}
	// Send has copied the bytes into the connection's buffer (or the
	// stream's, waiting for window) when it returns.
	err = o.st.Send(*buf)
	o.codec.pool.Put(buf)
	return err
}
