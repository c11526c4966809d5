package extproctest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
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
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/test/loopback"
)

// testCtx bounds every test so that a bug shows as a failure, not a hang.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fakeServer is an ext_proc server for tests: handle decides the behaviour,
// every received message is recorded.
type fakeServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	addr   string
	handle func(*conn) error

	mu       sync.Mutex
	received []*extprocv3.ProcessingRequest
	streams  int
}

type conn struct {
	srv extprocv3.ExternalProcessor_ProcessServer
	fs  *fakeServer
}

func (c *conn) recv() (*extprocv3.ProcessingRequest, error) {
	r, err := c.srv.Recv()
	if err == nil {
		c.fs.mu.Lock()
		c.fs.received = append(c.fs.received, r)
		c.fs.mu.Unlock()
	}
	return r, err
}

func (c *conn) send(r *extprocv3.ProcessingResponse) error { return c.srv.Send(r) }

func (s *fakeServer) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	s.mu.Lock()
	s.streams++
	s.mu.Unlock()
	return s.handle(&conn{srv: srv, fs: s})
}

func (s *fakeServer) messages() []*extprocv3.ProcessingRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*extprocv3.ProcessingRequest(nil), s.received...)
}

func startServer(t *testing.T, handle func(*conn) error, opts ...grpc.ServerOption) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &fakeServer{addr: ln.Addr().String(), handle: handle}
	gs := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(gs, fs)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return fs
}

func startTLSServer(t *testing.T, handle func(*conn) error) *fakeServer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "epp"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return startServer(t, handle, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})))
}

// closedAddr returns a loopback address nobody listens on.
func closedAddr(t *testing.T) string {
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

func headersResp(response bool, cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	if cr == nil {
		cr = &extprocv3.CommonResponse{}
	}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: cr}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

func bodyResp(response bool, cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: cr}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}}}
}

func streamed(response bool, data []byte, eos bool) *extprocv3.ProcessingResponse {
	return bodyResp(response, &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: data, EndOfStream: eos}},
	}})
}

func trailersResp(response bool, m *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{HeaderMutation: m}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{HeaderMutation: m}}}
}

func immediate(status int, body string, kv ...string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
		Headers: setHeaders(kv...),
		Body:    []byte(body),
		Details: "test_immediate",
	}}}
}

// setHeaders builds a mutation that overwrites each key with raw_value, as
// endpoint pickers do.
func setHeaders(kv ...string) *extprocv3.HeaderMutation {
	m := &extprocv3.HeaderMutation{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.SetHeaders = append(m.SetHeaders, &corev3.HeaderValueOption{
			Header: &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])},
		})
	}
	return m
}

func lbMetadata(key, value string) *structpb.Struct {
	s, _ := structpb.NewStruct(map[string]any{LBNamespace: map[string]any{key: value}})
	return s
}

// eppOpts shapes eppHandler, an endpoint picker in the style of the
// reference EPP: it holds the headers response until the whole request body
// arrived, answers with the pick in header and metadata, streams the body
// back re-chunked, and on the response path echoes each chunk at once.
type eppOpts struct {
	headerDest   string // value of the x-gateway-destination-endpoint header; "" for none
	metadataDest string // value of envoy.lb/x-gateway-destination-endpoint; "" for none
	appendHeader bool   // append the header instead of overwriting it
	rechunk      int    // re-chunk size for the request body (default 62000)
	seq          *atomic.Int64
	respSeen     *atomic.Int64 // set to seq's next value when response headers arrive
}

func eppHandler(o eppOpts) func(*conn) error {
	if o.rechunk == 0 {
		o.rechunk = 62000
	}
	return func(c *conn) error {
		var body []byte
		answer := func() error {
			cr := &extprocv3.CommonResponse{ClearRouteCache: true}
			if o.headerDest != "" {
				cr.HeaderMutation = setHeaders(DestinationEndpointKey, o.headerDest)
				if o.appendHeader {
					// APPEND_IF_EXISTS_OR_ADD is the enum's zero value, so Envoy
					// only appends when the deprecated append flag says so.
					cr.HeaderMutation.SetHeaders[0].Append = wrapperspb.Bool(true)
				}
			}
			r := headersResp(false, cr)
			if o.metadataDest != "" {
				r.DynamicMetadata = lbMetadata(DestinationEndpointKey, o.metadataDest)
			}
			return c.send(r)
		}
		for {
			req, err := c.recv()
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
				for len(body) > o.rechunk {
					if err := c.send(streamed(false, body[:o.rechunk], false)); err != nil {
						return err
					}
					body = body[o.rechunk:]
				}
				if err := c.send(streamed(false, body, true)); err != nil {
					return err
				}
			case *extprocv3.ProcessingRequest_ResponseHeaders:
				if o.respSeen != nil {
					o.respSeen.Store(o.seq.Add(1))
				}
				served := req.GetMetadataContext().GetFilterMetadata()[LBNamespace].GetFields()[ServedEndpointKey].GetStringValue()
				if err := c.send(headersResp(true, &extprocv3.CommonResponse{HeaderMutation: setHeaders("x-test-served", served)})); err != nil {
					return err
				}
			case *extprocv3.ProcessingRequest_ResponseBody:
				if err := c.send(streamed(true, v.ResponseBody.GetBody(), v.ResponseBody.GetEndOfStream())); err != nil {
					return err
				}
			case *extprocv3.ProcessingRequest_RequestTrailers:
				if err := c.send(trailersResp(false, nil)); err != nil {
					return err
				}
			case *extprocv3.ProcessingRequest_ResponseTrailers:
				if err := c.send(trailersResp(true, nil)); err != nil {
					return err
				}
			}
		}
	}
}

// upstream is a model-server stand-in that records what reached it.
type upstream struct {
	addr string

	mu      sync.Mutex
	headers []http.Header
	bodies  [][]byte
}

func startUpstream(t *testing.T, handler http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{}
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
		_, _ = io.WriteString(w, "hello from "+u.addr)
	}))
	t.Cleanup(srv.Close)
	u.addr = srv.Listener.Addr().String()
	return u
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.bodies)
}

func (u *upstream) last() (http.Header, []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		return nil, nil
	}
	return u.headers[len(u.headers)-1], u.bodies[len(u.bodies)-1]
}

// startProxy serves a Proxy on a loopback port until the test ends.
func startProxy(t *testing.T, cfg Config) string {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + loopback.Serve(t, p.Serve)
}

func httpClient() *http.Client { return &http.Client{Timeout: 10 * time.Second} }
