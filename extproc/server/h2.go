package server

import (
	"context"

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
	// TransportH2 has met only grpc-go clients and the project's own
	// driver, not the HTTP/2 codec of a gateway (Envoy's nghttp2/oghttp2,
	// agentgateway's hyper), nor an HTTP/2 conformance or attack suite;
	// until it has, it is opt-in.
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
			return h2Refused{out: out}, nil
		}
		return &h2Process{s: h.s, ctx: st.Context(), st: ps}, nil
	case methodHealthCheck:
		return &h2Health{s: h.s, ctx: st.Context(), out: h2Sender{st: st, codec: h.codec}}, nil
	}
	// The health service's Watch is not served here (gateways and the
	// kubelet call Check); the health listener serves all of it.
	return nil, status.Errorf(codes.Unimplemented, "unknown method %s", st.Path())
}

// h2Process is one ext_proc stream.
type h2Process struct {
	s   *Server
	ctx context.Context
	st  *stream
	in  inbound // the message being handled
}

func (p *h2Process) Message(b []byte) (bool, error) {
	if err := p.in.unmarshal(b); err != nil {
		return false, status.Errorf(codes.Internal, "unmarshal a ProcessingRequest: %v", err)
	}
	return p.st.receive(p.ctx, &p.in)
}

func (p *h2Process) Close(err error) { p.s.closeStream(p.ctx, p.st, err) }

// h2Refused answers a stream over the cap, as refuse does on grpc-go.
type h2Refused struct{ out h2Sender }

func (r h2Refused) Message([]byte) (bool, error) { return true, r.out.Send(refusal()) }
func (r h2Refused) Close(error)                  {}

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
