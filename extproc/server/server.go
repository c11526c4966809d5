package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/infergate/infergate/extproc/h2server"
	"github.com/infergate/infergate/inference/wire"
)

// Health service names, as the endpoint picker protocol requires.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
	HealthExtProc   = wire.ExtProcHealthService
)

// Limits bound what one request, and all requests together, may cost.
type Limits struct {
	// MaxRequestBodyBytes rejects larger bodies with 413; 0 = unlimited.
	MaxRequestBodyBytes int64
	// MaxStreams bounds the streams open at once (one per request in
	// flight); one more is answered 503 processor-overloaded at its
	// request headers. 0 = unlimited.
	MaxStreams int
	// MaxStreamsPerConnection bounds the streams one connection may have
	// open at once, so that one client cannot take all of MaxStreams. It
	// is announced as SETTINGS_MAX_CONCURRENT_STREAMS, and a stream
	// beyond it is refused with RST_STREAM REFUSED_STREAM (grpc-go:
	// internal/transport http2_server.go operateHeaders; h2server
	// alike). That is safe with Envoy: its HTTP/2 connection pool takes
	// the limit from the processor's SETTINGS and marks a connection that
	// is full busy (source/common/http/conn_pool_base.cc
	// MultiplexedActiveClientBase::onSettings), and a stream with no ready
	// connection makes it open another
	// (source/common/conn_pool/conn_pool_base.cc
	// ConnPoolImplBase::newStreamImpl, tryCreateNewConnections); grpc-go
	// clients wait for stream quota on the connection
	// (internal/transport/http2_client.go NewStream). 0 = unlimited.
	MaxStreamsPerConnection int
	// BufferBudgetBytes bounds the request-body bytes all streams buffer
	// at once, with the work of the decisions running (DecisionCoster)
	// and the answers not yet taken; a chunk that would pass it is
	// answered 503 processor-overloaded and its stream's bytes are freed.
	// 0 = unlimited.
	BufferBudgetBytes int64
	// MaxLargeDecisions bounds the decisions over bodies of 1 MiB or
	// more (see DecisionCoster) that run at once; one more waits its
	// turn. 0 = all cores but one (at least one), negative = no bound.
	MaxLargeDecisions int
	// RequestIdleTimeout bounds the wait for a request's next message
	// until the request is decided; a request that stalls longer is
	// answered 408 request-timeout and its body freed. 0 = no timeout.
	RequestIdleTimeout time.Duration
	// StreamIdleTimeout bounds the wait for a stream's next message once
	// its request is decided (and before, when RequestIdleTimeout is 0):
	// a stream that receives nothing for longer is ended by the processor
	// (DEADLINE_EXCEEDED, answers the client has not taken dropped), which
	// frees its slot and the bytes it holds. It is long, as a model may
	// think for minutes before the first byte of an answer that is not
	// streamed; it also bounds how long an ended stream's last answers may
	// wait for the client's window on h2. 0 = no timeout.
	StreamIdleTimeout time.Duration
}

// Options configure the listeners of a Server. An empty address disables
// that listener (the ext_proc one is required).
type Options struct {
	GRPCAddr    string
	HealthAddr  string
	MetricsAddr string
	TLS         TLSOptions
	Limits      Limits
	// DrainTimeout bounds how long a stop waits for open streams.
	DrainTimeout time.Duration
	// ShutdownDelay is how long a stop keeps serving new streams while
	// health checks already answer NOT_SERVING, before draining: a gateway
	// that checks the processor (every infergate cluster does, every 2 s)
	// takes it out while it still answers, so no request meets a closed
	// connection. 0 drains at once.
	ShutdownDelay time.Duration
	// Transport serves the ext_proc listener with grpc-go (TransportGRPC)
	// or extproc/h2server (TransportH2); TransportAuto, the default when
	// empty, is grpc-go.
	Transport string
	// Gatherer is served on the metrics listener.
	Gatherer prometheus.Gatherer
	// Registerer takes the server's own metrics (open streams, buffered
	// bytes, overload refusals); nil leaves them unregistered.
	Registerer prometheus.Registerer
	// Pprof serves /debug/pprof/ on the metrics listener.
	Pprof  bool
	Logger logr.Logger
}

// Server serves one Handler over ext_proc, with health and metrics listeners.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	opts    Options
	handler Handler
	health  *health.Server
	tls     *tls.Config // nil: plain text
	budget  *budget
	answers answers

	grpcLn, healthLn, metricsLn net.Listener
}

// Start is New then Listen for a processor binary: opts as configured,
// with its registry (served, and taking the server's metrics) and its
// logger.
func Start(handler Handler, opts Options, reg *prometheus.Registry, log logr.Logger) (*Server, error) {
	opts.Gatherer, opts.Registerer, opts.Logger = reg, reg, log
	s, err := New(handler, opts)
	if err != nil {
		return nil, err
	}
	if err := s.Listen(); err != nil {
		return nil, err
	}
	return s, nil
}

// New validates opts and prepares a server; call Listen then Serve.
func New(handler Handler, opts Options) (*Server, error) {
	if opts.GRPCAddr == "" {
		return nil, errors.New("ext_proc listen address is required")
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 30 * time.Second
	}
	if opts.Gatherer == nil {
		opts.Gatherer = prometheus.NewRegistry()
	}
	blocks := false
	if b, ok := handler.(Blocker); ok {
		blocks = b.MayBlock()
	}
	switch opts.Transport {
	case "", TransportAuto:
		opts.Transport = TransportGRPC
	case TransportGRPC:
	case TransportH2:
		if blocks {
			return nil, fmt.Errorf("transport %q serves a connection's streams on one goroutine, and this handler may hold requests (flow control); use %q", TransportH2, TransportGRPC)
		}
	default:
		return nil, fmt.Errorf("transport %q: want %q, %q or %q", opts.Transport, TransportAuto, TransportGRPC, TransportH2)
	}
	// Certificates and CAs are read here, so a bad file stops start-up
	// with its name before any listener opens.
	tlsCfg, err := opts.TLS.config()
	if err != nil {
		return nil, err
	}
	b, err := newBudget(opts.Limits, opts.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, handler: handler, health: health.NewServer(), tls: tlsCfg, budget: b}
	// Liveness is the process being up; readiness waits for SetReady.
	s.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	s.SetReady(false)
	return s, nil
}

// SetReady flips the readiness and ext_proc health services together, as
// the protocol requires them to agree.
func (s *Server) SetReady(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(HealthReadiness, st)
	s.health.SetServingStatus(HealthExtProc, st)
	s.health.SetServingStatus("", st)
}

// Listen binds every configured listener, so that callers (and tests using
// port 0) learn the addresses before serving starts.
func (s *Server) Listen() error {
	var lc net.ListenConfig
	bind := func(name, addr string) (net.Listener, error) {
		if addr == "" {
			return nil, nil
		}
		ln, err := lc.Listen(context.Background(), "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("%s listener on %s: %w", name, addr, err)
		}
		return ln, nil
	}
	var err error
	if s.grpcLn, err = bind("ext_proc", s.opts.GRPCAddr); err != nil {
		return err
	}
	if s.healthLn, err = bind("health", s.opts.HealthAddr); err != nil {
		s.closeListeners()
		return err
	}
	if s.metricsLn, err = bind("metrics", s.opts.MetricsAddr); err != nil {
		s.closeListeners()
		return err
	}
	return nil
}

func (s *Server) closeListeners() {
	for _, ln := range []net.Listener{s.grpcLn, s.healthLn, s.metricsLn} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// Transport is what serves the ext_proc listener: TransportGRPC or
// TransportH2.
func (s *Server) Transport() string { return s.opts.Transport }

// GRPCAddr is the bound ext_proc address (after Listen).
func (s *Server) GRPCAddr() string { return addrOf(s.grpcLn) }

// HealthAddr is the bound health address, "" if disabled.
func (s *Server) HealthAddr() string { return addrOf(s.healthLn) }

// MetricsAddr is the bound metrics address, "" if disabled.
func (s *Server) MetricsAddr() string { return addrOf(s.metricsLn) }

func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// streamWorkers is how many goroutines serve streams, each in turn: enough
// for the concurrency one picker or payload processor sees at saturation
// on a few cores, at a few KiB of stack each.
const streamWorkers = 64

// Serve runs until ctx ends, then stops gracefully: readiness goes false,
// open streams get DrainTimeout to finish, then the rest are cut.
func (s *Server) Serve(ctx context.Context) error {
	if s.grpcLn == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	cdc, err := newCodec()
	if err != nil {
		return err
	}
	ext := s.mainServer(cdc)

	hs := grpc.NewServer()
	healthpb.RegisterHealthServer(hs, s.health)

	var ms *http.Server
	if s.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(s.opts.Gatherer, promhttp.HandlerOpts{}))
		if s.opts.Pprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		ms = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	}

	errc := make(chan error, 3)
	var wg sync.WaitGroup
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, h2server.ErrServerClosed) {
				errc <- fmt.Errorf("%s server: %w", name, err)
			}
		}()
	}
	run("ext_proc", func() error { return ext.serve(s.grpcLn) })
	if s.healthLn != nil {
		run("health", func() error { return hs.Serve(s.healthLn) })
	}
	if ms != nil {
		run("metrics", func() error { return ms.Serve(s.metricsLn) })
	}
	s.opts.Logger.Info("ext_proc server started", "grpc", s.GRPCAddr(), "transport", s.opts.Transport, "health", s.HealthAddr(), "metrics", s.MetricsAddr(), "tls", s.tls != nil, "mtls", s.tls != nil && s.tls.ClientCAs != nil)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	s.SetReady(false)
	s.health.Shutdown()
	if serveErr == nil && s.opts.ShutdownDelay > 0 {
		s.opts.Logger.Info("stopping: NOT_SERVING, serving on until gateways take this server out", "delay", s.opts.ShutdownDelay)
		time.Sleep(s.opts.ShutdownDelay)
	}
	if !ext.drain(s.opts.DrainTimeout) {
		s.opts.Logger.Info("drain timeout reached, closing open streams", "timeout", s.opts.DrainTimeout)
	}
	hs.Stop()
	if ms != nil {
		_ = ms.Close()
	}
	wg.Wait()
	return serveErr
}

// mainServer is what serves the ext_proc listener: ext_proc, and the
// health service, as gateways probe it there.
type mainServer struct {
	serve func(net.Listener) error
	// drain stops gracefully within timeout, then cuts what is left;
	// false when it had to cut.
	drain func(timeout time.Duration) bool
}

func (s *Server) mainServer(cdc *codec) mainServer {
	l := s.opts.Limits
	if s.opts.Transport == TransportH2 {
		hs := h2server.New(h2Handler{s: s, codec: cdc}, h2server.Options{TLS: s.tls, Budget: transportBudget{s.budget},
			MaxConcurrentStreams: uint32(l.MaxStreamsPerConnection), UnsentTimeout: l.StreamIdleTimeout,
			Refused: s.budget.connRefused.Inc, Logger: s.opts.Logger})
		return mainServer{serve: hs.Serve, drain: func(timeout time.Duration) bool {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			return hs.Shutdown(ctx) == nil
		}}
	}
	var gopts []grpc.ServerOption
	if s.tls != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	// Proxies keep ext_proc connections open for long; let them ping.
	gopts = append(gopts, grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}))
	// Every request is a new stream. A stream served by a new goroutine
	// grows its stack while marshalling the first answer (a fifth of the
	// picker's CPU at 32 streams went to copying stacks with GOMAXPROCS
	// workers); workers that are reused keep theirs. Streams beyond the
	// workers still get goroutines of their own.
	gopts = append(gopts, grpc.NumStreamWorkers(streamWorkers))
	gopts = append(gopts, grpc.ForceServerCodecV2(cdc), experimental.BufferPool(cdc.pool))
	if n := l.MaxStreamsPerConnection; n > 0 {
		gopts = append(gopts, grpc.MaxConcurrentStreams(uint32(n)))
	}
	gs := grpc.NewServer(gopts...)
	extprocv3.RegisterExternalProcessorServer(gs, s)
	healthpb.RegisterHealthServer(gs, s.health)
	return mainServer{serve: gs.Serve, drain: func(timeout time.Duration) bool {
		drained := make(chan struct{})
		go func() { gs.GracefulStop(); close(drained) }()
		select {
		case <-drained:
			return true
		case <-time.After(timeout):
			gs.Stop()
			return false
		}
	}}
}

// Process implements the ext_proc service: one stream per HTTP request.
func (s *Server) Process(gs extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := gs.Context()
	// The idle watchdog ends the call from its own goroutine, as a
	// handler's return would: the status is written (trailers, and
	// RST_STREAM if the client has not half-closed) and the stream's
	// context cancelled, which is what wakes RecvMsg here, or a SendMsg
	// waiting for the client's window (grpc-go internal/transport
	// http2_server.go finishStream: "cancel needs to be called to
	// interrupt the potential blocking on other goroutines"; write:
	// s.wq.get returns when the context ends). grpc-go's transport stream,
	// which the context carries, has WriteStatus;
	// TestTimedOutStreamsAreLetGo fails if that changes.
	var end func(error)
	if ts, ok := grpc.ServerTransportStreamFromContext(ctx).(interface{ WriteStatus(*status.Status) error }); ok {
		end = func(err error) { _ = ts.WriteStatus(statusOf(err)) }
	}
	st := s.openStream(ctx, gs)
	if st == nil {
		return s.refuse(gs, end)
	}
	st.watch(end)
	err := st.run(ctx, gs)
	s.closeStream(ctx, st, err)
	return err
}

// statusOf is err's gRPC status, OK for nil.
func statusOf(err error) *status.Status {
	if err == nil {
		return status.New(codes.OK, "")
	}
	return status.Convert(err)
}

// openStream starts a stream's exchange, its answers going to out; nil
// when the process is at its stream cap (answer refusal, then). The
// caller arms its watchdog (stream.watch) with how the transport ends it.
func (s *Server) openStream(ctx context.Context, out sender) *stream {
	if !s.budget.openStream() {
		return nil
	}
	return newStream(out, s.handler.NewExchange(ctx), s.opts.Limits, s.budget, &s.answers)
}

// closeStream ends what openStream started; err is why the stream ended
// early, nil at its natural end. The stream is closed (a message handled
// meanwhile on h2, where the watchdog may call this, finds it closed)
// before the exchange is told.
func (s *Server) closeStream(ctx context.Context, st *stream, err error) {
	st.close()
	st.ex.Close(ctx, st.summary(err))
	s.budget.closeStream()
}

// refusedWait bounds how long a refused stream waits for the message its
// refusal answers: it holds no Exchange, but its stream on the
// connection, and a client that never sends one would keep it.
func (s *Server) refusedWait() time.Duration {
	if d := s.opts.Limits.RequestIdleTimeout; d > 0 {
		return d
	}
	return s.opts.Limits.StreamIdleTimeout
}

// refusal answers the first message of a stream over the cap: a stream
// that is refused must cost next to nothing, so it gets no Exchange.
func refusal() *extprocv3.ProcessingResponse {
	return ImmediateResponse(overloaded("limit of open requests"))
}

// refuse answers a grpc-go stream over the cap and ends it; end, when
// set, ends it from a timer if no message comes within refusedWait.
func (s *Server) refuse(gs extprocv3.ExternalProcessor_ProcessServer, end func(error)) error {
	if d := s.refusedWait(); d > 0 && end != nil {
		t := time.AfterFunc(d, func() { end(nil) })
		defer t.Stop()
	}
	if err := gs.RecvMsg(&inbound{}); err != nil {
		if errors.Is(err, io.EOF) || gs.Context().Err() != nil {
			return nil // the client's end, or the timer's
		}
		return fmt.Errorf("receive: %w", err)
	}
	if err := gs.Send(refusal()); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}
