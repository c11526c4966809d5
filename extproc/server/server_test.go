package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/wire"
)

// recorder is a Handler whose exchanges record what they saw and answer
// with a fixed decision.
type recorder struct {
	mu       sync.Mutex
	requests []*server.Request
	closed   []server.Summary
	decide   func(*server.Request) *server.Decision
	release  chan struct{} // when set, HandleRequest waits on it
}

func (r *recorder) NewExchange(context.Context) server.Exchange { return &recExchange{r: r} }

type recExchange struct{ r *recorder }

func (e *recExchange) HandleRequest(ctx context.Context, req *server.Request) *server.Decision {
	e.r.mu.Lock()
	cp := *req // the server lets go of req.Body once it has answered
	e.r.requests = append(e.r.requests, &cp)
	e.r.mu.Unlock()
	if e.r.release != nil {
		<-e.r.release
	}
	if e.r.decide != nil {
		return e.r.decide(req)
	}
	return &server.Decision{SetHeaders: []server.Header{{Name: "x-test", Value: "seen"}}, ClearRouteCache: true}
}

func (e *recExchange) HandleResponseHeaders(context.Context, *server.Response) *server.Decision {
	return &server.Decision{SetHeaders: []server.Header{{Name: "x-resp", Value: "1"}}}
}

// HandleResponseBody passes chunks through and emits metadata at the end,
// as a processor reporting token usage does.
func (e *recExchange) HandleResponseBody(_ context.Context, chunk []byte, eos bool) ([]byte, *structpb.Struct) {
	if !eos {
		return chunk, nil
	}
	md, _ := structpb.NewStruct(map[string]any{"test.ns": map[string]any{"bytes": len(chunk)}})
	return chunk, md
}

func (e *recExchange) Close(_ context.Context, s server.Summary) {
	e.r.mu.Lock()
	e.r.closed = append(e.r.closed, s)
	e.r.mu.Unlock()
}

// eachTransport runs test over each transport the ext_proc listener has.
func eachTransport(t *testing.T, test func(t *testing.T, transport string)) {
	for _, tr := range []string{server.TransportGRPC, server.TransportH2} {
		t.Run(tr, func(t *testing.T) { test(t, tr) })
	}
}

// start serves h with opts over transport until the test ends.
func start(t testing.TB, transport string, h server.Handler, opts server.Options) (*server.Server, context.CancelFunc, <-chan error) {
	t.Helper()
	opts.Transport = transport
	if opts.GRPCAddr == "" {
		opts.GRPCAddr = "127.0.0.1:0"
	}
	opts.Logger = logr.Discard()
	srv, err := server.New(h, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	stopped := make(chan struct{})
	go func() { done <- srv.Serve(ctx); close(stopped) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Error("server did not stop")
		}
	})
	return srv, cancel, done
}

func dial(t testing.TB, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func openStream(t *testing.T, conn *grpc.ClientConn) extprocv3.ExternalProcessor_ProcessClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func duplex() *extprocv3.ProtocolConfiguration {
	return &extprocv3.ProtocolConfiguration{
		RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	}
}

func reqHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingRequest{
		ProtocolConfig: duplex(),
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: eos}},
	}
}

func reqBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func mustSend(t testing.TB, st extprocv3.ExternalProcessor_ProcessClient, m *extprocv3.ProcessingRequest) {
	t.Helper()
	if err := st.Send(m); err != nil {
		t.Fatal(err)
	}
}

func mustRecv(t testing.TB, st extprocv3.ExternalProcessor_ProcessClient) *extprocv3.ProcessingResponse {
	t.Helper()
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestBodylessRequestIsDecidedAtOnce(t *testing.T) {
	eachTransport(t, testBodylessRequestIsDecidedAtOnce)
}

func testBodylessRequestIsDecidedAtOnce(t *testing.T, transport string) {
	rec := &recorder{}
	srv, _, _ := start(t, transport, rec, server.Options{})
	st := openStream(t, dial(t, srv.GRPCAddr(), nil))
	mustSend(t, st, reqHeaders(true, ":method", "GET", ":path", "/v1/models"))
	resp := mustRecv(t, st)
	hr := resp.GetRequestHeaders()
	if hr == nil {
		t.Fatalf("want request headers response, got %T", resp.GetResponse())
	}
	if !hr.GetResponse().GetClearRouteCache() {
		t.Error("clear_route_cache not set")
	}
	if got := hr.GetResponse().GetHeaderMutation().GetSetHeaders(); len(got) != 1 || string(got[0].GetHeader().GetRawValue()) != "seen" {
		t.Errorf("header mutation = %v", got)
	}
	if len(rec.requests) != 1 || rec.requests[0].Body != nil {
		t.Errorf("handler saw %d requests, body %v; want one with nil body", len(rec.requests), rec.requests)
	}
}

func TestDuplexBodyIsReassembledAndRechunked(t *testing.T) {
	eachTransport(t, testDuplexBodyIsReassembledAndRechunked)
}

func testDuplexBodyIsReassembledAndRechunked(t *testing.T, transport string) {
	cases := []struct {
		name      string
		size      int
		chunk     int
		trailers  bool
		wantParts int
	}{
		{"small single chunk", 100, 100, false, 1},
		{"empty body", 0, 1, false, 1},
		{"many small chunks", 200_000, 1000, false, 4},
		{"one huge chunk", 130_000, 130_000, false, 3},
		{"with trailers", 70_000, 7000, true, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			srv, _, _ := start(t, transport, rec, server.Options{})
			st := openStream(t, dial(t, srv.GRPCAddr(), nil))
			body := bytes.Repeat([]byte("abcdefghij"), tc.size/10)
			mustSend(t, st, reqHeaders(false, ":method", "POST"))
			if tc.size == 0 {
				mustSend(t, st, reqBody(nil, true))
			}
			for off := 0; off < len(body); off += tc.chunk {
				end := min(off+tc.chunk, len(body))
				mustSend(t, st, reqBody(body[off:end], end == len(body) && !tc.trailers))
			}
			if tc.trailers {
				mustSend(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
			}
			if mustRecv(t, st).GetRequestHeaders() == nil {
				t.Fatal("first response must answer the request headers")
			}
			var got []byte
			for i := 0; ; i++ {
				r := mustRecv(t, st)
				if r.GetRequestBody() == nil {
					t.Fatalf("response %d: want a request body response, got %T", i, r.GetResponse())
				}
				if r.GetRequestBody().GetResponse().GetBodyMutation().GetBody() != nil {
					t.Fatal("plain body mutation in FULL_DUPLEX_STREAMED mode")
				}
				sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
				if sr == nil {
					t.Fatal("body response without streamed_response")
				}
				if len(sr.GetBody()) > server.MaxChunkBytes {
					t.Fatalf("chunk of %d bytes exceeds %d", len(sr.GetBody()), server.MaxChunkBytes)
				}
				got = append(got, sr.GetBody()...)
				if len(got) == len(body) {
					if sr.GetEndOfStream() == tc.trailers {
						t.Fatalf("end_of_stream=%v on the last chunk with trailers=%v", sr.GetEndOfStream(), tc.trailers)
					}
					if i+1 != tc.wantParts {
						t.Errorf("re-emitted in %d chunks, want %d", i+1, tc.wantParts)
					}
					break
				}
			}
			if !bytes.Equal(got, body) {
				t.Fatal("body changed on the way through")
			}
			if tc.trailers && mustRecv(t, st).GetRequestTrailers() == nil {
				t.Fatal("want a trailers response last")
			}
			if len(rec.requests) != 1 || !bytes.Equal(rec.requests[0].Body, body) {
				t.Fatal("handler did not see the whole body")
			}
		})
	}
}

func TestOversizedBodyIs413(t *testing.T) { eachTransport(t, testOversizedBodyIs413) }

func testOversizedBodyIs413(t *testing.T, transport string) {
	rec := &recorder{}
	srv, _, _ := start(t, transport, rec, server.Options{Limits: server.Limits{MaxRequestBodyBytes: 1000}})
	st := openStream(t, dial(t, srv.GRPCAddr(), nil))
	mustSend(t, st, reqHeaders(false, ":method", "POST"))
	mustSend(t, st, reqBody(make([]byte, 600), false))
	mustSend(t, st, reqBody(make([]byte, 600), false))
	ir := mustRecv(t, st).GetImmediateResponse()
	if ir == nil || ir.GetStatus().GetCode() != 413 {
		t.Fatalf("want immediate 413, got %v", ir)
	}
	var reason string
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == wire.DropReasonHeader {
			reason = string(h.GetHeader().GetRawValue())
		}
	}
	if reason != "request-too-large" {
		t.Errorf("drop reason %q", reason)
	}
	if len(rec.requests) != 0 {
		t.Error("handler must not see an oversized request")
	}
}

func TestBufferedModeAnswersHeadersFirst(t *testing.T) {
	eachTransport(t, testBufferedModeAnswersHeadersFirst)
}

func testBufferedModeAnswersHeadersFirst(t *testing.T, transport string) {
	rec := &recorder{decide: func(*server.Request) *server.Decision {
		return &server.Decision{Body: []byte(`{"x":1}`), SetHeaders: []server.Header{{Name: "x-a", Value: "b"}}}
	}}
	srv, _, _ := start(t, transport, rec, server.Options{})
	st := openStream(t, dial(t, srv.GRPCAddr(), nil))
	h := reqHeaders(false, ":method", "POST", "content-length", "2")
	h.ProtocolConfig.RequestBodyMode = filterv3.ProcessingMode_BUFFERED
	mustSend(t, st, h)
	if mustRecv(t, st).GetRequestHeaders() == nil {
		t.Fatal("BUFFERED: headers must be answered before the body is sent")
	}
	mustSend(t, st, reqBody([]byte("{}"), true))
	br := mustRecv(t, st).GetRequestBody()
	if string(br.GetResponse().GetBodyMutation().GetBody()) != `{"x":1}` {
		t.Fatalf("body mutation = %v", br)
	}
	var cl string
	for _, h := range br.GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "content-length" {
			cl = string(h.GetHeader().GetRawValue())
		}
	}
	if cl != "7" {
		t.Errorf("content-length = %q, want 7 for the replaced body", cl)
	}
}

// TestBufferedBodyWithTrailers: a BUFFERED body followed by trailers comes
// in one message without end_of_stream, and the proxy sends the trailers
// only once the body is answered: the body is answered at once, then the
// trailers.
func TestBufferedBodyWithTrailers(t *testing.T) {
	eachTransport(t, func(t *testing.T, transport string) {
		rec := &recorder{}
		srv, _, _ := start(t, transport, rec, server.Options{})
		st := openStream(t, dial(t, srv.GRPCAddr(), nil))
		h := reqHeaders(false, ":method", "POST")
		h.ProtocolConfig.RequestBodyMode = filterv3.ProcessingMode_BUFFERED
		mustSend(t, st, h)
		if mustRecv(t, st).GetRequestHeaders() == nil {
			t.Fatal("BUFFERED: headers must be answered before the body is sent")
		}
		mustSend(t, st, reqBody([]byte(`{"model":"m"}`), false))
		if mustRecv(t, st).GetRequestBody() == nil {
			t.Fatal("the body, trailers to follow, was not answered")
		}
		mustSend(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
		if mustRecv(t, st).GetRequestTrailers() == nil {
			t.Fatal("the trailers were not answered")
		}
	})
}

// gatedRecorder refuses requests whose x-refuse header is set from their
// headers alone.
type gatedRecorder struct{ recorder }

func (g *gatedRecorder) NewExchange(context.Context) server.Exchange {
	return &gatedExchange{recExchange{r: &g.recorder}}
}

type gatedExchange struct{ recExchange }

func (gatedExchange) RejectEarly(_ context.Context, req *server.Request) *server.Rejection {
	if req.Headers.Get("x-refuse") == "" {
		return nil
	}
	return &server.Rejection{Status: 429, Reason: "early"}
}

func TestHeaderGateRefusesBeforeTheBody(t *testing.T) {
	eachTransport(t, testHeaderGateRefusesBeforeTheBody)
}

func testHeaderGateRefusesBeforeTheBody(t *testing.T, transport string) {
	cases := []struct {
		name    string
		mode    filterv3.ProcessingMode_BodySendMode
		eos     bool // body-less request
		refuse  bool
		refused bool
	}{
		{"duplex refused", filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, true, true},
		{"buffered refused", filterv3.ProcessingMode_BUFFERED, false, true, true},
		{"duplex let through", filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, false, false},
		{"body-less requests are decided whole", filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, true, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &gatedRecorder{}
			srv, _, _ := start(t, transport, rec, server.Options{})
			st := openStream(t, dial(t, srv.GRPCAddr(), nil))
			kv := []string{":method", "POST"}
			if tc.refuse {
				kv = append(kv, "x-refuse", "1")
			}
			h := reqHeaders(tc.eos, kv...)
			h.ProtocolConfig.RequestBodyMode = tc.mode
			mustSend(t, st, h)
			if !tc.eos && !tc.refused {
				mustSend(t, st, reqBody([]byte("{}"), true))
			}
			resp := mustRecv(t, st)
			if ir := resp.GetImmediateResponse(); (ir != nil) != tc.refused {
				t.Fatalf("immediate response %v, want refused=%v", ir, tc.refused)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if handled := len(rec.requests) == 1; handled == tc.refused {
				t.Fatalf("HandleRequest called %d times, refused=%v", len(rec.requests), tc.refused)
			}
		})
	}
}

func TestMetadataMergedAcrossMessagesAndResponsePath(t *testing.T) {
	eachTransport(t, testMetadataMergedAcrossMessagesAndResponsePath)
}

func testMetadataMergedAcrossMessagesAndResponsePath(t *testing.T, transport string) {
	rec := &recorder{}
	srv, _, _ := start(t, transport, rec, server.Options{})
	st := openStream(t, dial(t, srv.GRPCAddr(), nil))
	md := func(ns, k, v string) *corev3.Metadata {
		s, _ := structpb.NewStruct(map[string]any{k: v})
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{ns: s}}
	}
	mustSend(t, st, reqHeaders(false, ":method", "POST"))
	b := reqBody([]byte("{}"), true)
	b.MetadataContext = md("envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset", "10.0.0.1:8000")
	mustSend(t, st, b)
	mustRecv(t, st)
	mustRecv(t, st)
	rh := &extprocv3.ProcessingRequest{
		MetadataContext: md("envoy.lb", "x-gateway-destination-endpoint-served", "10.0.0.1:8000"),
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}},
		}},
	}
	mustSend(t, st, rh)
	if r := mustRecv(t, st).GetResponseHeaders(); len(r.GetResponse().GetHeaderMutation().GetSetHeaders()) != 1 {
		t.Fatalf("response header mutation missing: %v", r)
	}
	mustSend(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: x\n\n"), EndOfStream: true}}})
	last := mustRecv(t, st)
	sr := last.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if string(sr.GetBody()) != "data: x\n\n" || !sr.GetEndOfStream() {
		t.Fatalf("response chunk not passed through: %v", sr)
	}
	if n := last.GetDynamicMetadata().GetFields()["test.ns"].GetStructValue().GetFields()["bytes"].GetNumberValue(); n != 9 {
		t.Errorf("end-of-stream metadata = %v, want test.ns.bytes 9", last.GetDynamicMetadata())
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("want EOF after close, got %v", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if hint := rec.requests[0].Metadata["envoy.lb.subset_hint"]; hint == nil {
		t.Error("metadata from the body message not seen by the handler")
	}
	if len(rec.closed) != 1 {
		t.Fatalf("Close called %d times", len(rec.closed))
	}
	s := rec.closed[0]
	if s.ResponseStatus != 200 || s.Err != nil || s.ResponseMetadata["envoy.lb"].GetFields()["x-gateway-destination-endpoint-served"].GetStringValue() != "10.0.0.1:8000" {
		t.Errorf("summary = %+v", s)
	}
}

func TestHealthServices(t *testing.T) { eachTransport(t, testHealthServices) }

func testHealthServices(t *testing.T, transport string) {
	srv, _, _ := start(t, transport, &recorder{}, server.Options{HealthAddr: "127.0.0.1:0"})
	// Gateways probe the ext_proc port; the kubelet, the health port.
	for _, addr := range []string{srv.HealthAddr(), srv.GRPCAddr()} {
		hc := healthpb.NewHealthClient(dial(t, addr, nil))
		check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil {
				t.Fatalf("%s: check %q: %v", addr, svc, err)
			}
			return r.GetStatus()
		}
		srv.SetReady(false)
		serving, not := healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
		want := map[string]healthpb.HealthCheckResponse_ServingStatus{server.HealthLiveness: serving, server.HealthReadiness: not, server.HealthExtProc: not}
		for svc, w := range want {
			if got := check(svc); got != w {
				t.Errorf("%s: before ready: %s = %v, want %v", addr, svc, got, w)
			}
		}
		srv.SetReady(true)
		for _, svc := range []string{server.HealthLiveness, server.HealthReadiness, server.HealthExtProc} {
			if got := check(svc); got != serving {
				t.Errorf("%s: after ready: %s = %v", addr, svc, got)
			}
		}
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "no.such.Service"}); status.Code(err) != codes.NotFound {
			t.Errorf("%s: check of an unknown service: %v, want NotFound", addr, err)
		}
	}
}

// blocker is a recorder whose handler says it may block.
type blocker struct{ recorder }

func (*blocker) MayBlock() bool { return true }

// TestTransportChoice: auto (and the default) serves grpc-go, h2 only when
// asked for and refusing a handler that may block, and an unknown
// transport is refused by name.
func TestTransportChoice(t *testing.T) {
	for _, tc := range []struct {
		name, transport string
		h               server.Handler
		want, err       string
	}{
		{"auto", server.TransportAuto, &recorder{}, server.TransportGRPC, ""},
		{"default", "", &recorder{}, server.TransportGRPC, ""},
		{"h2 when asked", server.TransportH2, &recorder{}, server.TransportH2, ""},
		{"blocking handler on auto", server.TransportAuto, &blocker{}, server.TransportGRPC, ""},
		{"blocking handler on grpc", server.TransportGRPC, &blocker{}, server.TransportGRPC, ""},
		{"blocking handler on h2", server.TransportH2, &blocker{}, "", "may hold requests"},
		{"unknown transport", "quic", &recorder{}, "", `transport "quic"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := server.New(tc.h, server.Options{GRPCAddr: "127.0.0.1:0", Transport: tc.transport})
			if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("New: %v, want %q", err, tc.err)
			}
			if err == nil && srv.Transport() != tc.want {
				t.Fatalf("serves %s, want %s", srv.Transport(), tc.want)
			}
		})
	}
}

func TestSelfSignedTLS(t *testing.T) { eachTransport(t, testSelfSignedTLS) }

func testSelfSignedTLS(t *testing.T, transport string) {
	srv, _, _ := start(t, transport, &recorder{}, server.Options{TLS: server.TLSOptions{Enabled: true}})
	creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})
	st := openStream(t, dial(t, srv.GRPCAddr(), creds))
	mustSend(t, st, reqHeaders(true, ":method", "GET"))
	if mustRecv(t, st).GetRequestHeaders() == nil {
		t.Fatal("no answer over TLS")
	}
	// A plain-text client must not get through.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	plain, err := extprocv3.NewExternalProcessorClient(dial(t, srv.GRPCAddr(), nil)).Process(ctx)
	if err == nil {
		_ = plain.Send(reqHeaders(true))
		_, err = plain.Recv()
	}
	if err == nil {
		t.Fatal("plain-text client was served by a TLS listener")
	}
}

func TestGracefulStopDrainsOpenStreams(t *testing.T) {
	eachTransport(t, testGracefulStopDrainsOpenStreams)
}

func testGracefulStopDrainsOpenStreams(t *testing.T, transport string) {
	rec := &recorder{release: make(chan struct{})}
	srv, cancel, done := start(t, transport, rec, server.Options{DrainTimeout: 10 * time.Second})
	st := openStream(t, dial(t, srv.GRPCAddr(), nil))
	mustSend(t, st, reqHeaders(true, ":method", "GET"))
	for { // wait until the handler holds the request
		rec.mu.Lock()
		n := len(rec.requests)
		rec.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
		t.Fatal("server stopped with a stream still open")
	case <-time.After(100 * time.Millisecond):
	}
	close(rec.release)
	if mustRecv(t, st).GetRequestHeaders() == nil {
		t.Fatal("open stream did not get its answer during the drain")
	}
	_ = st.CloseSend()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server did not stop after the stream ended")
	}
}

// TestLargeDecisionDoesNotHoldTheConnection: a decision over a large body
// that takes long (a guardrail pass, say) does not delay the requests
// beside it on the same connection, as Envoy puts a worker's requests on
// one connection. On h2 the connection's streams share one goroutine, so
// before such decisions left it every request here waited for the first.
func TestLargeDecisionDoesNotHoldTheConnection(t *testing.T) {
	eachTransport(t, testLargeDecisionDoesNotHoldTheConnection)
}

func testLargeDecisionDoesNotHoldTheConnection(t *testing.T, transport string) {
	const large = 64 << 10
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	h := &recorder{decide: func(req *server.Request) *server.Decision {
		if len(req.Body) >= large {
			<-release
		}
		return &server.Decision{SetHeaders: []server.Header{{Name: "x-body-bytes", Value: strconv.Itoa(len(req.Body))}}}
	}}
	srv, _, _ := start(t, transport, h, server.Options{})
	conn := dial(t, srv.GRPCAddr(), nil)

	slow := openStream(t, conn)
	mustSend(t, slow, reqHeaders(false, ":method", "POST", "content-length", strconv.Itoa(large)))
	mustSend(t, slow, reqBody(bytes.Repeat([]byte("x"), large), true))

	// Small requests on the same connection, one after another, while
	// the large decision waits.
	answered := make(chan error, 1)
	go func() {
		for i := range 10 {
			st, err := extprocv3.NewExternalProcessorClient(conn).Process(t.Context())
			if err == nil {
				err = st.Send(reqHeaders(false, ":method", "POST"))
			}
			if err == nil {
				err = st.Send(reqBody([]byte(`{"model":"m"}`), true))
			}
			if err == nil {
				_, err = st.Recv()
			}
			if err != nil {
				answered <- fmt.Errorf("small request %d: %w", i, err)
				return
			}
		}
		answered <- nil
	}()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("small requests on the connection were not answered while a large decision ran")
	}
	unblock()
	r := mustRecv(t, slow)
	if got := headerOf(r.GetRequestHeaders().GetResponse(), "x-body-bytes"); got != strconv.Itoa(large) {
		t.Fatalf("the large request's answer: x-body-bytes %q, want %d", got, large)
	}
}

// headerOf is the value a common response sets for name, "" if none.
func headerOf(r *extprocv3.CommonResponse, name string) string {
	for _, h := range r.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == name {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}

// TestLargeDecisionEndsTheStream: a decision made off the connection
// goroutine that refuses the request ends the stream there, with the
// immediate response and then the OK status, and the exchange is closed
// once, on both transports. On h2 the transport's own Close of the stream
// comes when the connection next reads; a second request on the same
// connection makes it read, so a second close would show.
func TestLargeDecisionEndsTheStream(t *testing.T) { eachTransport(t, testLargeDecisionEndsTheStream) }

func testLargeDecisionEndsTheStream(t *testing.T, transport string) {
	h := &recorder{decide: func(req *server.Request) *server.Decision {
		if len(req.Body) < 64<<10 {
			return &server.Decision{}
		}
		return &server.Decision{Reject: &server.Rejection{Status: 403, Reason: "denied"}}
	}}
	srv, _, _ := start(t, transport, h, server.Options{})
	conn := dial(t, srv.GRPCAddr(), nil)
	st := openStream(t, conn)
	mustSend(t, st, reqHeaders(false, ":method", "POST"))
	mustSend(t, st, reqBody(bytes.Repeat([]byte("x"), 64<<10), true))
	if got := mustRecv(t, st).GetImmediateResponse().GetStatus().GetCode(); got != 403 {
		t.Fatalf("immediate response %v, want 403", got)
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after the immediate response: %v, want the end of the stream", err)
	}

	next := openStream(t, conn)
	mustSend(t, next, reqHeaders(true, ":method", "GET"))
	if mustRecv(t, next).GetRequestHeaders() == nil {
		t.Fatal("the next request on the connection was not answered")
	}
	if err := next.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := next.Recv(); err != io.EOF {
		t.Fatalf("end of the next request: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		h.mu.Lock()
		closed := len(h.closed)
		h.mu.Unlock()
		if closed == 2 {
			break
		}
		if closed > 2 || time.Now().After(deadline) {
			t.Fatalf("%d exchanges closed for two requests, want 2", closed)
		}
	}
}
