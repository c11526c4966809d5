package extprocfilter

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/inference/wire"
	"github.com/infergate/infergate/internal/testcert"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func newClient(t *testing.T, fc FilterConfig) *Client {
	t.Helper()
	if fc.Name == "" {
		fc.Name = "test"
	}
	c, err := NewClient(fc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestHeaderMutationAndMetadata(t *testing.T) {
	fs := fakeproc.Start(t, func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			b := req.GetRequestBody()
			if b == nil || !b.GetEndOfStream() {
				continue
			}
			m := fakeproc.SetHeaders(wire.DestinationEndpointKey, "10.0.0.7:8000", ":path", "/rewritten", ":authority", "evil", "x-envoy-foo", "no")
			m.SetHeaders = append(m.SetHeaders,
				&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-added", RawValue: []byte("two")}, Append: wrapperspb.Bool(true)},
				&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-absent", RawValue: []byte("new")}, AppendAction: corev3.HeaderValueOption_ADD_IF_ABSENT},
				&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-value-only", Value: "lost"}},
			)
			m.RemoveHeaders = []string{"x-remove-me", ":method"}
			r := fakeproc.HeadersResp(false, &extprocv3.CommonResponse{HeaderMutation: m, ClearRouteCache: true})
			r.DynamicMetadata = fakeproc.LBMetadata(wire.DestinationEndpointKey, "10.0.0.7:8000")
			if err := c.Send(r); err != nil {
				return err
			}
			if err := c.Send(fakeproc.Streamed(false, []byte("processed"), true)); err != nil {
				return err
			}
		}
	})
	client := newClient(t, FilterConfig{Target: fs.Addr, ForwardMetadata: SubsetHintMetadata("10.0.0.7:8000", "10.0.0.8:8000")})
	res, err := client.Run(fakeproc.Ctx(t), Request{
		Method: "POST", Path: "/v1/completions",
		Headers: Headers{{"content-length", "10"}, {wire.DestinationEndpointKey, "1.1.1.1:1"}, {"x-added", "one"}, {"x-absent", "old"}, {"x-remove-me", "x"}},
		Body:    [][]byte{[]byte("hello"), []byte("world")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.LocalReply != nil {
		t.Fatalf("unexpected local reply: %v", res.LocalReply)
	}
	for _, tc := range []struct {
		key  string
		want []string
	}{
		{wire.DestinationEndpointKey, []string{"10.0.0.7:8000"}},
		{":path", []string{"/rewritten"}},
		{":authority", []string{"localhost"}}, // routing headers are not mutable
		{":method", []string{"POST"}},         // system headers cannot be removed
		{"x-envoy-foo", nil},
		{"x-added", []string{"one", "two"}},
		{"x-absent", []string{"new"}},  // ext_proc ignores append_action (ADD_IF_ABSENT)
		{"x-value-only", []string{""}}, // Envoy reads raw_value only
		{"x-remove-me", nil},
		{"content-length", nil}, // dropped in FULL_DUPLEX_STREAMED
	} {
		if got := res.Headers.Values(tc.key); !slices.Equal(got, tc.want) {
			t.Errorf("header %s = %q, want %q", tc.key, got, tc.want)
		}
	}
	if got := res.DynamicMetadata[wire.LBNamespace].GetFields()[wire.DestinationEndpointKey].GetStringValue(); got != "10.0.0.7:8000" {
		t.Errorf("metadata = %q", got)
	}
	if !res.ClearRouteCache || string(res.Body) != "processed" || len(res.Responses) != 2 {
		t.Errorf("clear=%v body=%q responses=%d", res.ClearRouteCache, res.Body, len(res.Responses))
	}

	// What the server saw is what Envoy sends.
	msgs := fs.Messages()
	if len(msgs) != 3 {
		t.Fatalf("server got %d messages, want 3", len(msgs))
	}
	pc := msgs[0].GetProtocolConfig()
	if pc.GetRequestBodyMode() != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED || pc.GetResponseBodyMode() != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		t.Errorf("protocol_config = %v", pc)
	}
	if msgs[1].GetProtocolConfig() != nil {
		t.Error("protocol_config must only be on the first message")
	}
	hh := msgs[0].GetRequestHeaders()
	if hh.GetEndOfStream() {
		t.Error("headers end_of_stream set although a body follows")
	}
	first := hh.GetHeaders().GetHeaders()[0]
	if first.GetKey() != ":authority" || string(first.GetRawValue()) != "localhost" || first.GetValue() != "" {
		t.Errorf("first header = %v, want :authority in raw_value", first)
	}
	for i, m := range msgs {
		hint := m.GetMetadataContext().GetFilterMetadata()[wire.SubsetHintNamespace].GetFields()[wire.SubsetKey].GetListValue()
		if len(hint.GetValues()) != 2 {
			t.Errorf("message %d: subset hint = %v", i, hint)
		}
	}
	if b := msgs[1].GetRequestBody(); string(b.GetBody()) != "hello" || b.GetEndOfStream() {
		t.Errorf("first chunk = %v", b)
	}
	if b := msgs[2].GetRequestBody(); string(b.GetBody()) != "world" || !b.GetEndOfStream() {
		t.Errorf("last chunk = %v", b)
	}
}

func TestStreamedBodyReassembly(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 15000) // 150,000 bytes
	for _, tc := range []struct {
		name   string
		length int64
	}{
		{"content-length", int64(len(body))},
		{"chunked", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: "10.0.0.1:8000"}))
			ctx := fakeproc.Ctx(t)
			ex := newClient(t, FilterConfig{Target: fs.Addr}).Open(ctx)
			defer ex.Close()
			h, out, err := ex.Request(Request{Method: "POST"}.headers(), BodyFromReader(bytes.NewReader(body), tc.length))
			if err != nil {
				t.Fatal(err)
			}
			if h.Get(wire.DestinationEndpointKey) != "10.0.0.1:8000" {
				t.Errorf("headers = %v", h)
			}
			var sizes []int
			var got []byte
			for {
				c, err := out.Next(ctx)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, c.Data...)
				sizes = append(sizes, len(c.Data))
			}
			if !bytes.Equal(got, body) || !slices.Equal(sizes, []int{62000, 62000, 26000}) {
				t.Errorf("got %d bytes in chunks %v", len(got), sizes)
			}

			// The server got the body as Envoy cuts it: socket-sized chunks,
			// end_of_stream on the last data chunk when the length is known,
			// an empty final chunk for chunked transfer.
			var chunks []*extprocv3.HttpBody
			for _, m := range fs.Messages() {
				if b := m.GetRequestBody(); b != nil {
					chunks = append(chunks, b)
				}
			}
			last := chunks[len(chunks)-1]
			if !last.GetEndOfStream() || (tc.length < 0) != (len(last.GetBody()) == 0) {
				t.Errorf("last chunk: %d bytes, eos %v", len(last.GetBody()), last.GetEndOfStream())
			}
			for _, c := range chunks {
				if len(c.GetBody()) > readChunkSize {
					t.Errorf("chunk of %d bytes exceeds %d", len(c.GetBody()), readChunkSize)
				}
			}
		})
	}
}

// blockingBody is a request body whose data only arrives when the test
// says. Only the first release counts: a case can release the body before
// the request and again when it fails open, and two writers on the pipe
// could both land before either closed it (a body read twice).
func blockingBody(t *testing.T) (Body, func(string)) {
	t.Helper()
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	var once sync.Once
	return BodyFromReader(pr, -1), func(s string) {
		once.Do(func() {
			go func() {
				_, _ = io.WriteString(pw, s)
				_ = pw.Close()
			}()
		})
	}
}

func TestFailureModes(t *testing.T) {
	failOnHeaders := func(c *fakeproc.Conn) error {
		_, _ = c.Recv()
		return errors.New("picker crashed")
	}
	crashMidBody := func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return err
			}
			if req.GetRequestBody() != nil {
				return errors.New("picker crashed mid-body")
			}
		}
	}
	plainBody := func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			if b := req.GetRequestBody(); b != nil && b.GetEndOfStream() {
				_ = c.Send(fakeproc.HeadersResp(false, nil))
				_ = c.Send(fakeproc.BodyResp(false, &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("x")}}}))
			}
		}
	}
	bodyBeforeHeaders := func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			if req.GetRequestBody() != nil {
				_ = c.Send(fakeproc.Streamed(false, []byte("x"), true))
			}
		}
	}
	wrongType := func(c *fakeproc.Conn) error {
		_, _ = c.Recv()
		_ = c.Send(fakeproc.HeadersResp(true, nil))
		_, _ = c.Recv()
		return nil
	}
	closeEarly := func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			if req.GetRequestBody() != nil {
				return nil // OK status while the body is still owed
			}
		}
	}
	silent := func(c *fakeproc.Conn) error {
		<-c.Context().Done()
		return nil
	}
	slowDuplex := func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			if b := req.GetRequestBody(); b != nil && b.GetEndOfStream() {
				time.Sleep(3 * DefaultMessageTimeout / 2)
				_ = c.Send(fakeproc.HeadersResp(false, nil))
				_ = c.Send(fakeproc.Streamed(false, b.GetBody(), true))
			}
		}
	}
	badMutation := func(c *fakeproc.Conn) error {
		_, _ = c.Recv()
		m := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x", RawValue: []byte("a\r\nb")}}}}
		_ = c.Send(fakeproc.HeadersResp(false, &extprocv3.CommonResponse{HeaderMutation: m}))
		_, _ = c.Recv()
		return nil
	}
	deny := func(c *fakeproc.Conn) error {
		_, _ = c.Recv()
		_ = c.Send(fakeproc.Immediate(429, "slow down", "x-llm-d-request-dropped-reason", "rejected-saturated"))
		_, _ = c.Recv()
		return nil
	}
	headersOnly := &filterv3.ProcessingMode{RequestBodyMode: filterv3.ProcessingMode_NONE, ResponseHeaderMode: filterv3.ProcessingMode_SKIP}
	buffered := &filterv3.ProcessingMode{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseHeaderMode: filterv3.ProcessingMode_SKIP}
	crashAfterBufferedBody := func(c *fakeproc.Conn) error {
		if _, err := c.Recv(); err != nil {
			return err
		}
		if err := c.Send(fakeproc.HeadersResp(false, &extprocv3.CommonResponse{})); err != nil {
			return err
		}
		_, _ = c.Recv()
		return errors.New("picker crashed with the body")
	}

	for _, tc := range []struct {
		name        string
		handle      func(*fakeproc.Conn) error // nil: nobody listens
		failOpen    bool
		mode        *filterv3.ProcessingMode
		timeout     time.Duration
		withBody    bool   // send a body (the first chunk is held back until the filter decided)
		wantStatus  int    // 0: the request continues
		wantErr     error  // matched against the local reply's cause
		wantText    string // in the local reply's error
		failedOpen  bool
		noImmediate bool // disable_immediate_response
		noHost      bool // the stream's start fails at once (no healthy host)
		bodyFirst   bool // the body arrives with the headers even when failing open
	}{
		{name: "spurious plain body mutation", handle: plainBody, withBody: true, wantStatus: 500, wantErr: ErrSpurious,
			wantText: "spurious message: Normal body mutation response is received while body_mode_ is FULL_DUPLEX_STREAMED"},
		{name: "spurious plain body mutation fail-open", handle: plainBody, failOpen: true, withBody: true, wantStatus: 500, wantErr: ErrSpurious},
		{name: "body response before headers response", handle: bodyBeforeHeaders, withBody: true, wantStatus: 500, wantErr: ErrSpurious},
		{name: "unexpected response type", handle: wrongType, wantStatus: 500, wantErr: ErrSpurious},
		{name: "fail-close stream error", handle: failOnHeaders, wantStatus: 500, wantErr: ErrStream},
		{name: "fail-open before body", handle: failOnHeaders, failOpen: true, withBody: true, failedOpen: true},
		{name: "fail-open after body started", handle: crashMidBody, failOpen: true, withBody: true, wantStatus: 500, wantErr: ErrStream},
		// A clean close (grpc-status OK) leaves the filter out for the rest
		// of the request whatever is owed (Filter::onGrpcCloseWithStatus).
		{name: "clean close while a response is owed", handle: closeEarly, withBody: true},
		{name: "not listening fail-close", wantStatus: 500, wantErr: ErrStream},
		// The body reaches the filter with the headers, before the failed
		// connection is known: Envoy no longer fails open.
		{name: "not listening fail-open, body with the headers", failOpen: true, withBody: true, wantStatus: 500, wantErr: ErrStream},
		{name: "not listening fail-open, body held back", failOpen: true, withBody: true, failedOpen: true},
		{name: "not listening fail-open, no body", failOpen: true, failedOpen: true},
		// A start that fails at once comes before any body.
		{name: "no host fail-open, body with the headers", noHost: true, failOpen: true, withBody: true, bodyFirst: true, failedOpen: true},
		{name: "no host fail-close", noHost: true, withBody: true, wantStatus: 500, wantErr: ErrStream, wantText: "no healthy host"},
		{name: "buffered body fails open after it was sent", handle: crashAfterBufferedBody, mode: buffered, failOpen: true, withBody: true, bodyFirst: true, failedOpen: true},
		{name: "message timeout fail-close", handle: silent, mode: headersOnly, timeout: 50 * time.Millisecond, wantStatus: 504, wantErr: ErrMessageTimeout},
		{name: "message timeout fail-open", handle: silent, mode: headersOnly, timeout: 50 * time.Millisecond, failOpen: true, failedOpen: true},
		{name: "no message timeout in full duplex", handle: slowDuplex, withBody: true},
		{name: "invalid mutation fails even open", handle: badMutation, failOpen: true, wantStatus: 500, wantErr: ErrInvalidMutation},
		{name: "immediate response", handle: deny, wantStatus: 429},
		{name: "immediate response disabled", handle: deny, noImmediate: true, wantStatus: 500, wantErr: ErrSpurious,
			wantText: "unhandled immediate response due to config disabled it"},
		{name: "immediate response disabled fail-open", handle: deny, noImmediate: true, failOpen: true, failedOpen: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := fakeproc.ClosedAddr(t)
			if tc.handle != nil {
				target = fakeproc.Start(t, tc.handle).Addr
			}
			ctx := fakeproc.Ctx(t)
			fc := FilterConfig{Name: "test", Target: target, FailureModeAllow: tc.failOpen, ProcessingMode: tc.mode, MessageTimeout: tc.timeout,
				DisableImmediateResponse: tc.noImmediate}
			c := newClient(t, fc)
			if tc.noHost {
				var err error
				if c, err = NewClientStarting(fc, func() (*grpc.ClientConn, error) { return nil, errors.New("no healthy host") }); err != nil {
					t.Fatal(err)
				}
			}
			ex := c.Open(ctx)
			defer ex.Close()
			var body Body
			release := func(string) {}
			if tc.withBody {
				body, release = blockingBody(t)
				if tc.wantStatus != 0 || !tc.failedOpen || tc.bodyFirst {
					release("payload") // the server must see the body
				}
			}
			hdrs := Request{Method: "POST", Headers: Headers{{"x-client", "1"}}}.headers()
			h, out, err := ex.Request(hdrs, body)
			if err == nil && out != nil {
				release("payload") // failing open: the body only arrives now
				var got []byte
				got, _, err = ReadAll(ctx, out)
				if err == nil && tc.failedOpen && string(got) != "payload" {
					t.Errorf("failed-open body = %q, want the original", got)
				}
			}
			var lr *LocalReply
			switch {
			case tc.wantStatus == 0:
				if err != nil {
					t.Fatalf("want the request to continue, got %v", err)
				}
				if tc.failedOpen && (h.Get("x-client") != "1" || ex.FailedOpen() == nil) {
					t.Errorf("failed open: headers %v, cause %v", h, ex.FailedOpen())
				}
				if !tc.failedOpen && ex.FailedOpen() != nil {
					t.Errorf("unexpected fail-open: %v", ex.FailedOpen())
				}
			case !errors.As(err, &lr):
				t.Fatalf("want a %d local reply, got %v", tc.wantStatus, err)
			case lr.Status != tc.wantStatus:
				t.Errorf("status %d, want %d (%v)", lr.Status, tc.wantStatus, lr)
			case tc.wantErr != nil && !errors.Is(lr, tc.wantErr):
				t.Errorf("reply %v does not wrap %v", lr, tc.wantErr)
			case tc.wantText != "" && !strings.Contains(lr.Error(), tc.wantText):
				t.Errorf("reply %q does not mention %q", lr.Error(), tc.wantText)
			}
			if tc.name == "immediate response" {
				if string(lr.Body) != "slow down" || lr.Headers.Get("x-llm-d-request-dropped-reason") != "rejected-saturated" || lr.Details != "test_immediate" || lr.Err != nil {
					t.Errorf("immediate reply = %+v", lr)
				}
			}
		})
	}
}

func TestResponsePath(t *testing.T) {
	fs := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: "10.0.0.7:8000", MetadataDest: "10.0.0.7:8000"}))
	ex := newClient(t, FilterConfig{Target: fs.Addr, ForwardMetadata: SubsetHintMetadata("10.0.0.7:8000")}).Open(fakeproc.Ctx(t))
	defer ex.Close()
	if _, err := ex.RunRequest(Request{Path: "/v1/models"}); err != nil {
		t.Fatal(err)
	}
	res, err := ex.RunResponse(Response{
		Status:  200,
		Headers: Headers{{"content-type", "text/event-stream"}},
		Body:    [][]byte{[]byte("data: 1\n\n"), []byte("data: 2\n\n"), []byte("data: [DONE]\n\n")},
		Served:  "10.0.0.7:8000",
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.LocalReply != nil {
		t.Fatal(res.LocalReply)
	}
	if res.Headers.Get(":status") != "200" || res.Headers.Get("x-test-served") != "10.0.0.7:8000" {
		t.Errorf("response headers = %v", res.Headers)
	}
	if string(res.Body) != "data: 1\n\ndata: 2\n\ndata: [DONE]\n\n" || len(res.BodyChunkSizes) != 3 {
		t.Errorf("body %q in %v", res.Body, res.BodyChunkSizes)
	}
	var rh *extprocv3.ProcessingRequest
	for _, m := range fs.Messages() {
		if m.GetResponseHeaders() != nil {
			rh = m
		}
	}
	md := rh.GetMetadataContext().GetFilterMetadata()
	if md[wire.LBNamespace].GetFields()[wire.ServedEndpointKey].GetStringValue() != "10.0.0.7:8000" || md[wire.SubsetHintNamespace] == nil {
		t.Errorf("response metadata_context = %v", md)
	}
	if rh.GetProtocolConfig() != nil {
		t.Error("protocol_config resent on the response path")
	}
}

func TestServerClosedCleanlySkipsRest(t *testing.T) {
	// A server that has answered everything may end the stream; Envoy then
	// leaves it out for the rest of the request.
	fs := fakeproc.Start(t, func(c *fakeproc.Conn) error {
		_, _ = c.Recv()
		return c.Send(fakeproc.HeadersResp(false, &extprocv3.CommonResponse{HeaderMutation: fakeproc.SetHeaders("x-seen", "1")}))
	})
	ex := newClient(t, FilterConfig{Target: fs.Addr}).Open(fakeproc.Ctx(t))
	defer ex.Close()
	req, err := ex.RunRequest(Request{})
	if err != nil || req.Headers.Get("x-seen") != "1" {
		t.Fatalf("request: %v %v", req, err)
	}
	// Give the stream end time to arrive before the response path starts.
	time.Sleep(50 * time.Millisecond)
	res, err := ex.RunResponse(Response{Body: [][]byte{[]byte("untouched")}})
	if err != nil || res.LocalReply != nil || string(res.Body) != "untouched" || res.FailedOpen != nil {
		t.Fatalf("response: %+v %v", res, err)
	}
}

func TestTrailers(t *testing.T) {
	fs := fakeproc.Start(t, func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			switch v := req.Request.(type) {
			case *extprocv3.ProcessingRequest_RequestHeaders:
				_ = c.Send(fakeproc.HeadersResp(false, nil))
			case *extprocv3.ProcessingRequest_RequestBody:
				_ = c.Send(fakeproc.Streamed(false, v.RequestBody.GetBody(), false))
			case *extprocv3.ProcessingRequest_RequestTrailers:
				_ = c.Send(fakeproc.TrailersResp(false, fakeproc.SetHeaders("x-checksum", "ok")))
			}
		}
	})
	res, err := newClient(t, FilterConfig{Target: fs.Addr}).Run(fakeproc.Ctx(t), Request{
		Body: [][]byte{[]byte("a"), []byte("b")}, Trailers: Headers{{"x-checksum", "raw"}},
	})
	if err != nil || res.LocalReply != nil {
		t.Fatal(res, err)
	}
	if string(res.Body) != "ab" || res.Trailers.Get("x-checksum") != "ok" {
		t.Errorf("body %q trailers %v", res.Body, res.Trailers)
	}
	// With trailers, no body chunk carries end_of_stream.
	for _, m := range fs.Messages() {
		if m.GetRequestBody().GetEndOfStream() {
			t.Error("end_of_stream on a body chunk although trailers follow")
		}
	}
}

func TestBufferedMode(t *testing.T) {
	fs := fakeproc.Start(t, func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			switch v := req.Request.(type) {
			case *extprocv3.ProcessingRequest_RequestHeaders:
				_ = c.Send(fakeproc.HeadersResp(false, nil))
			case *extprocv3.ProcessingRequest_RequestBody:
				upper := bytes.ToUpper(v.RequestBody.GetBody())
				_ = c.Send(fakeproc.BodyResp(false, &extprocv3.CommonResponse{
					HeaderMutation: fakeproc.SetHeaders("content-length", "11", "x-body-seen", "1"),
					BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: upper}},
				}))
			}
		}
	})
	mode := DefaultProcessingMode()
	mode.RequestBodyMode = filterv3.ProcessingMode_BUFFERED
	res, err := newClient(t, FilterConfig{Target: fs.Addr, ProcessingMode: mode}).Run(fakeproc.Ctx(t), Request{
		Headers: Headers{{"content-length", "11"}},
		Body:    [][]byte{[]byte("hello "), []byte("world")},
	})
	if err != nil || res.LocalReply != nil {
		t.Fatal(res, err)
	}
	if string(res.Body) != "HELLO WORLD" || res.Headers.Get("x-body-seen") != "1" || res.Headers.Get("content-length") != "11" {
		t.Errorf("buffered result: body %q headers %v", res.Body, res.Headers)
	}
	var bodies int
	for _, m := range fs.Messages() {
		if b := m.GetRequestBody(); b != nil {
			bodies++
			if string(b.GetBody()) != "hello world" || !b.GetEndOfStream() {
				t.Errorf("buffered body message = %v", b)
			}
		}
	}
	if bodies != 1 {
		t.Errorf("%d body messages, want 1", bodies)
	}
}

// TestTLS: TLS accepts the server's certificate whoever signed it; the
// client certificate (an Envoy cluster's tls_certificates) is presented
// when the server asks for one. A server that requires one signed by its CA
// fails the stream when none or another is presented, and the filter's
// failure mode decides (500 failing closed).
func TestTLS(t *testing.T) {
	gatewayCA, strangerCA := testcert.NewCA(t, "gateway CA"), testcert.NewCA(t, "someone else")
	gateway, stranger := gatewayCA.Client(t, "gateway"), strangerCA.Client(t, "intruder")
	var (
		mu   sync.Mutex
		seen []string // client certificate names the mTLS server saw
	)
	epp := fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: "10.0.0.1:8000"})
	serverTLS := fakeproc.StartTLS(t, epp)
	mutualTLS := fakeproc.StartMTLS(t, gatewayCA.Pool, func(c *fakeproc.Conn) error {
		if p, ok := peer.FromContext(c.Context()); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
				mu.Lock()
				seen = append(seen, ti.State.PeerCertificates[0].Subject.CommonName)
				mu.Unlock()
			}
		}
		return epp(c)
	})
	for _, tc := range []struct {
		name       string
		server     *fakeproc.Server
		cert       *tls.Certificate
		failOpen   bool
		wantStatus int  // 0: the picker answered
		failedOpen bool // the request went on without the picker
	}{
		{name: "server TLS without a client certificate", server: serverTLS},
		{name: "server TLS, certificate not asked for", server: serverTLS, cert: &gateway},
		{name: "mutual TLS with the gateway's certificate", server: mutualTLS, cert: &gateway},
		{name: "mutual TLS without a certificate fails closed", server: mutualTLS, wantStatus: 500},
		{name: "mutual TLS with another CA's certificate fails closed", server: mutualTLS, cert: &stranger, wantStatus: 500},
		{name: "mutual TLS without a certificate fails open", server: mutualTLS, failOpen: true, failedOpen: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			seen = nil
			mu.Unlock()
			res, err := newClient(t, FilterConfig{Target: tc.server.Addr, TLS: true, ClientCert: tc.cert, FailureModeAllow: tc.failOpen}).Run(fakeproc.Ctx(t), Request{})
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.wantStatus != 0:
				if res.LocalReply == nil || res.LocalReply.Status != tc.wantStatus || !errors.Is(res.LocalReply, ErrStream) {
					t.Fatalf("local reply %v, want %d for a stream error", res.LocalReply, tc.wantStatus)
				}
			case tc.failedOpen:
				if res.LocalReply != nil || res.FailedOpen == nil || res.Headers.Get(wire.DestinationEndpointKey) != "" {
					t.Fatalf("want the request to fail open: %+v", res)
				}
			default:
				if res.LocalReply != nil || res.Headers.Get(wire.DestinationEndpointKey) != "10.0.0.1:8000" {
					t.Fatalf("TLS exchange: %+v", res)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.server == mutualTLS && tc.wantStatus == 0 && !tc.failedOpen && !slices.Equal(seen, []string{"gateway"}) {
				t.Errorf("the server saw client certificates %q, want the gateway's", seen)
			}
		})
	}
}

func TestApplyHeaderMutation(t *testing.T) {
	opt := func(k, v string, a corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}, AppendAction: a}
	}
	for _, tc := range []struct {
		name     string
		set      *corev3.HeaderValueOption
		response bool
		want     []string // values of key "a" (or ":status")
		wantErr  bool
	}{
		{name: "default overwrites", set: opt("a", "new", 0), want: []string{"new"}},
		{name: "append flag", set: &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "a", RawValue: []byte("new")}, Append: wrapperspb.Bool(true)}, want: []string{"old", "new"}},
		// ext_proc reads the append flag only; append_action is ignored.
		{name: "append_action ADD_IF_ABSENT ignored: overwrites", set: opt("a", "new", corev3.HeaderValueOption_ADD_IF_ABSENT), want: []string{"new"}},
		{name: "append_action APPEND_IF_EXISTS_OR_ADD ignored: overwrites", set: opt("a", "new", corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD), want: []string{"new"}},
		{name: "value beside raw_value: raw_value wins", set: &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "a", Value: "v", RawValue: []byte("raw")}}, want: []string{"raw"}},
		{name: "overwrite if exists", set: opt("a", "new", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS), want: []string{"new"}},
		{name: "overwrite if exists, absent", set: opt("b", "new", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS), want: []string{"old"}},
		{name: "upper-case key", set: opt("A", "new", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD), want: []string{"new"}},
		{name: "status on response", set: opt(":status", "503", 0), response: true, want: []string{"old"}},
		{name: "bad value", set: opt("a", "x\r\ny", 0), wantErr: true},
		{name: "bad name", set: opt("a b", "x", 0), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Headers{{":status", "200"}, {"a", "old"}}
			err := applyHeaderMutation(&h, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{tc.set}}, tc.response)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if tc.wantErr {
				if !errors.Is(err, ErrInvalidMutation) {
					t.Errorf("err %v is not ErrInvalidMutation", err)
				}
				return
			}
			if got := h.Values("a"); !slices.Equal(got, tc.want) {
				t.Errorf("a = %q, want %q", got, tc.want)
			}
			if tc.response && h.Get(":status") != "503" {
				t.Errorf(":status = %q", h.Get(":status"))
			}
		})
	}
}

func TestFilterConfigChecks(t *testing.T) {
	badTrailer := DefaultProcessingMode()
	badTrailer.RequestTrailerMode = filterv3.ProcessingMode_SKIP
	streamedMode := DefaultProcessingMode()
	streamedMode.ResponseBodyMode = filterv3.ProcessingMode_STREAMED
	for _, tc := range []struct {
		name string
		fc   FilterConfig
	}{
		{"no name", FilterConfig{Target: "127.0.0.1:1"}},
		{"no target", FilterConfig{Name: "x"}},
		{"duplex needs trailers", FilterConfig{Name: "x", Target: "127.0.0.1:1", ProcessingMode: badTrailer}},
		{"streamed not reproduced", FilterConfig{Name: "x", Target: "127.0.0.1:1", ProcessingMode: streamedMode}},
		{"client certificate without TLS", FilterConfig{Name: "x", Target: "127.0.0.1:1", ClientCert: &tls.Certificate{Certificate: [][]byte{{1}}}}},
		{"client certificate holding no certificate", FilterConfig{Name: "x", Target: "127.0.0.1:1", TLS: true, ClientCert: &tls.Certificate{}}},
	} {
		if _, err := NewClient(tc.fc); err == nil {
			t.Errorf("%s: want an error", tc.name)
		}
	}
}
