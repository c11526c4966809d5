// Package fakeproc holds test doubles for ext_proc tests: a scripted
// ext_proc server whose handler decides every answer (and that records what
// it received), builders for the responses an ext_proc server sends, an
// endpoint picker in the reference EPP's style, and a recording upstream.
// They are fakes on purpose: tests use them to produce exact wire
// behaviour, including the wrong behaviour a real server would never show.
package fakeproc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/inference/wire"
	"github.com/infergate/infergate/internal/testcert"
)

// Ctx bounds every test so that a bug shows as a failure, not a hang.
func Ctx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Server is an ext_proc server for tests: handle decides the behaviour,
// every received message is recorded.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	Addr   string
	handle func(*Conn) error
	gs     *grpc.Server

	mu       sync.Mutex
	received []*extprocv3.ProcessingRequest
	streams  int
}

type Conn struct {
	srv extprocv3.ExternalProcessor_ProcessServer
	fs  *Server
}

func (c *Conn) Recv() (*extprocv3.ProcessingRequest, error) {
	r, err := c.srv.Recv()
	if err == nil {
		c.fs.mu.Lock()
		c.fs.received = append(c.fs.received, r)
		c.fs.mu.Unlock()
	}
	return r, err
}

// Send sends one response on the stream.
func (c *Conn) Send(r *extprocv3.ProcessingResponse) error { return c.srv.Send(r) }

// Context is the stream's context; it ends when the client goes away.
func (c *Conn) Context() context.Context { return c.srv.Context() }

func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	s.mu.Lock()
	s.streams++
	s.mu.Unlock()
	return s.handle(&Conn{srv: srv, fs: s})
}

// Stop stops the server at once: its listener closes and its connections
// are cut, as when a processor's process dies.
func (s *Server) Stop() { s.gs.Stop() }

// Messages returns what the server received so far, in order.
func (s *Server) Messages() []*extprocv3.ProcessingRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*extprocv3.ProcessingRequest(nil), s.received...)
}

func Start(t testing.TB, handle func(*Conn) error, opts ...grpc.ServerOption) *Server {
	t.Helper()
	return start(t, handle, true, opts...)
}

// StartWithoutHealth is Start for a processor that serves ext_proc alone,
// no grpc.health.v1: GAIE's and llm-d's endpoint pickers as they run by
// default (their health service on the ext_proc port needs
// --health-checking).
func StartWithoutHealth(t testing.TB, handle func(*Conn) error) *Server {
	t.Helper()
	return start(t, handle, false)
}

func start(t testing.TB, handle func(*Conn) error, withHealth bool, opts ...grpc.ServerOption) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	fs := &Server{Addr: ln.Addr().String(), handle: handle, gs: gs}
	extprocv3.RegisterExternalProcessorServer(gs, fs)
	// Every processor serves grpc.health.v1 on its ext_proc port, and
	// gateways (the stand-in too) check it there.
	if withHealth {
		hs := health.NewServer()
		hs.SetServingStatus(wire.ExtProcHealthService, healthpb.HealthCheckResponse_SERVING)
		healthpb.RegisterHealthServer(gs, hs)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return fs
}

func StartTLS(t testing.TB, handle func(*Conn) error) *Server {
	t.Helper()
	cert := testcert.NewCA(t, "epp").Server(t)
	return Start(t, handle, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})))
}

// StartMTLS is StartTLS for a server that requires a client certificate
// signed by one of clientCAs, as a processor run with --client-ca-file: a
// client without one fails its handshake.
func StartMTLS(t testing.TB, clientCAs *x509.CertPool, handle func(*Conn) error) *Server {
	t.Helper()
	cert := testcert.NewCA(t, "epp").Server(t)
	return Start(t, handle, grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert}, ClientCAs: clientCAs, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})))
}

// ClosedAddr returns a loopback address nobody listens on.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// Response builders.

func HeadersResp(response bool, cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	if cr == nil {
		cr = &extprocv3.CommonResponse{}
	}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: cr}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

func BodyResp(response bool, cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: cr}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}}}
}

func Streamed(response bool, data []byte, eos bool) *extprocv3.ProcessingResponse {
	return BodyResp(response, &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: data, EndOfStream: eos}},
	}})
}

func TrailersResp(response bool, m *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{HeaderMutation: m}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{HeaderMutation: m}}}
}

func Immediate(status int, body string, kv ...string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
		Headers: SetHeaders(kv...),
		Body:    []byte(body),
		Details: "test_immediate",
	}}}
}

// SetHeaders builds a mutation that overwrites each key with raw_value, as
// endpoint pickers do.
func SetHeaders(kv ...string) *extprocv3.HeaderMutation {
	m := &extprocv3.HeaderMutation{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.SetHeaders = append(m.SetHeaders, &corev3.HeaderValueOption{
			Header: &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])},
		})
	}
	return m
}

func LBMetadata(key, value string) *structpb.Struct {
	s, _ := structpb.NewStruct(map[string]any{wire.LBNamespace: map[string]any{key: value}})
	return s
}

// EPPOpts shapes EPPHandler, an endpoint picker in the style of the
// reference EPP: it holds the headers response until the whole request body
// arrived, answers with the pick in header and metadata, streams the body
// back re-chunked, and on the response path echoes each chunk at once.
type EPPOpts struct {
	HeaderDest   string // value of the x-gateway-destination-endpoint header; "" for none
	MetadataDest string // value of envoy.lb/x-gateway-destination-endpoint; "" for none
	AppendHeader bool   // append the header instead of overwriting it
	Rechunk      int    // re-chunk size for the request body (default 62000)
	Seq          *atomic.Int64
	RespSeen     *atomic.Int64 // set to Seq's next value when response headers arrive
}

func EPPHandler(o EPPOpts) func(*Conn) error {
	if o.Rechunk == 0 {
		o.Rechunk = 62000
	}
	return func(c *Conn) error {
		var body []byte
		answer := func() error {
			cr := &extprocv3.CommonResponse{ClearRouteCache: true}
			if o.HeaderDest != "" {
				cr.HeaderMutation = SetHeaders(wire.DestinationEndpointKey, o.HeaderDest)
				if o.AppendHeader {
					// APPEND_IF_EXISTS_OR_ADD is the enum's zero value, so Envoy
					// only appends when the deprecated append flag says so.
					cr.HeaderMutation.SetHeaders[0].Append = wrapperspb.Bool(true)
				}
			}
			r := HeadersResp(false, cr)
			if o.MetadataDest != "" {
				r.DynamicMetadata = LBMetadata(wire.DestinationEndpointKey, o.MetadataDest)
			}
			return c.Send(r)
		}
		for {
			req, err := c.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			switch v := req.Request.(type) {
			case *extprocv3.ProcessingRequest_RequestHeaders:
				if v.RequestHeaders.GetEndOfStream() {
					if err := answer(); err != nil {
						return err
					}
				}
			case *extprocv3.ProcessingRequest_RequestBody:
				body = append(body, v.RequestBody.GetBody()...)
				if !v.RequestBody.GetEndOfStream() {
					continue
				}
				if err := answer(); err != nil {
					return err
				}
				for len(body) > o.Rechunk {
					if err := c.Send(Streamed(false, body[:o.Rechunk], false)); err != nil {
						return err
					}
					body = body[o.Rechunk:]
				}
				if err := c.Send(Streamed(false, body, true)); err != nil {
					return err
				}
			case *extprocv3.ProcessingRequest_ResponseHeaders:
				if o.RespSeen != nil {
					o.RespSeen.Store(o.Seq.Add(1))
				}
				served := req.GetMetadataContext().GetFilterMetadata()[wire.LBNamespace].GetFields()[wire.ServedEndpointKey].GetStringValue()
				if err := c.Send(HeadersResp(true, &extprocv3.CommonResponse{HeaderMutation: SetHeaders("x-test-served", served)})); err != nil {
					return err
				}
			case *extprocv3.ProcessingRequest_ResponseBody:
				if err := c.Send(Streamed(true, v.ResponseBody.GetBody(), v.ResponseBody.GetEndOfStream())); err != nil {
					return err
				}
			case *extprocv3.ProcessingRequest_RequestTrailers:
				if err := c.Send(TrailersResp(false, nil)); err != nil {
					return err
				}
			case *extprocv3.ProcessingRequest_ResponseTrailers:
				if err := c.Send(TrailersResp(true, nil)); err != nil {
					return err
				}
			}
		}
	}
}

// upstream is a model-server stand-in that records what reached it.
type Upstream struct {
	Addr string

	mu      sync.Mutex
	headers []http.Header
	bodies  [][]byte
}

func StartUpstream(t testing.TB, handler http.HandlerFunc) *Upstream {
	t.Helper()
	u := &Upstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.headers = append(u.headers, r.Header.Clone())
		u.bodies = append(u.bodies, b)
		u.mu.Unlock()
		if handler != nil {
			handler(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "hello from "+u.Addr)
	}))
	t.Cleanup(srv.Close)
	u.Addr = srv.Listener.Addr().String()
	return u
}

func (u *Upstream) Count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.bodies)
}

func (u *Upstream) Last() (http.Header, []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		return nil, nil
	}
	return u.headers[len(u.headers)-1], u.bodies[len(u.bodies)-1]
}
