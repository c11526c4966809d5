package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/infergate/infergate/extproc/server"
)

// rawConn is an HTTP/2 client connection that follows no rule it is not
// made to: it opens streams past the server's limit and never grants
// window.
type rawConn struct {
	fr *http2.Framer
	// limit is the server's SETTINGS_MAX_CONCURRENT_STREAMS, 0 if it
	// announced none.
	limit uint32
}

// dialRaw opens a raw connection to addr and reads the server's first
// SETTINGS; it closes with the test.
func dialRaw(t *testing.T, addr string) *rawConn {
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
	rc := &rawConn{fr: http2.NewFramer(nc, nc)}
	rc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := rc.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the server's SETTINGS: %v", err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			rc.limit, _ = sf.Value(http2.SettingMaxConcurrentStreams)
			if err := rc.fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
			return rc
		}
	}
}

// open opens an ext_proc call on stream id: its HEADERS, nothing more.
func (rc *rawConn) open(t *testing.T, id uint32) {
	t.Helper()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/envoy.service.ext_proc.v3.ExternalProcessor/Process"},
		{":authority", "test"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
}

// refused reads frames until n streams have been refused
// (RST_STREAM REFUSED_STREAM), and returns their ids.
func (rc *rawConn) refused(t *testing.T, n int) []uint32 {
	t.Helper()
	var ids []uint32
	for len(ids) < n {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("%d streams refused, want %d: %v", len(ids), n, err)
		}
		if rst, ok := f.(*http2.RSTStreamFrame); ok {
			if rst.ErrCode != http2.ErrCodeRefusedStream {
				t.Fatalf("stream %d reset with %v, want REFUSED_STREAM", rst.StreamID, rst.ErrCode)
			}
			ids = append(ids, rst.StreamID)
		}
	}
	return ids
}

// TestPerConnectionStreamLimit: a connection holding its limit's worth of
// streams, and trying for more, cannot keep another connection's
// requests out. The limit is announced in SETTINGS, a stream past it is
// refused with REFUSED_STREAM (RFC 9113 section 5.1.2), and the process's
// own cap, which the streams held would otherwise fill, is left for the
// other connection.
func TestPerConnectionStreamLimit(t *testing.T) { eachTransport(t, testPerConnectionStreamLimit) }

func testPerConnectionStreamLimit(t *testing.T, transport string) {
	const limit, extra = 4, 3
	reg := prometheus.NewRegistry()
	srv, _, _ := start(t, transport, &recorder{}, server.Options{Registerer: reg,
		Limits: server.Limits{MaxStreams: limit + 1, MaxStreamsPerConnection: limit}})
	hog := dialRaw(t, srv.GRPCAddr())
	if hog.limit != limit {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", hog.limit, limit)
	}
	for i := range limit + extra {
		hog.open(t, uint32(2*i+1))
	}
	ids := hog.refused(t, extra)
	for _, id := range ids {
		if id <= 2*limit {
			t.Errorf("stream %d refused, one of the first %d", id, limit)
		}
	}
	waitMetric(t, reg, "infergate_extproc_open_streams", limit)

	st := openStream(t, dial(t, srv.GRPCAddr(), nil))
	mustSend(t, st, reqHeaders(true, ":method", "GET"))
	if r := mustRecv(t, st); r.GetRequestHeaders() == nil {
		t.Fatalf("a request on another connection: %v, want it answered", r)
	}
	// grpc-go refuses in its transport and tells no one.
	want := float64(extra)
	if transport == server.TransportGRPC {
		want = 0
	}
	if got := metric(t, reg, "infergate_extproc_connection_streams_refused_total"); got != want {
		t.Fatalf("refusals counted %v, want %v", got, want)
	}
}

// stingyClient is a gRPC connection whose windows are the smallest
// grpc-go allows (64 KiB): a client that sends requests and never reads
// an answer takes 64 KiB of each stream's answers and no more.
func stingyClient(t *testing.T, addr string) extprocv3.ExternalProcessorClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return extprocv3.NewExternalProcessorClient(cc)
}

// sendUnread sends a request of body to a new stream of c and reads
// nothing back.
func sendUnread(t *testing.T, ctx context.Context, c extprocv3.ExternalProcessorClient, body []byte) {
	t.Helper()
	st, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(reqHeaders(false, ":method", "POST")); err != nil {
		return // the server ended the stream already (the budget is spent)
	}
	_ = st.Send(reqBody(body, true))
}

// heapInUse is the live heap: two collections empty the buffer pools
// (sync.Pool keeps what it held through one), which would count garbage.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestAnswersNotTakenAreCharged: answers a client does not take (it
// grants no window) are charged to the request buffer budget until they
// are written, so that many such streams cannot hold more than the budget
// between them: once it is spent, new requests are refused, and the
// process's heap stays near the budget rather than growing with the
// streams (before, 100 streams held 1.3 GiB on grpc-go and 0.9 GiB on h2).
func TestAnswersNotTakenAreCharged(t *testing.T) { eachTransport(t, testAnswersNotTakenAreCharged) }

func testAnswersNotTakenAreCharged(t *testing.T, transport string) {
	const budget, streams, size = 4 << 20, 32, 1 << 20
	reg := prometheus.NewRegistry()
	srv, _, _ := start(t, transport, &recorder{}, server.Options{Registerer: reg, Limits: server.Limits{BufferBudgetBytes: budget}})
	c := stingyClient(t, srv.GRPCAddr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := heapInUse()
	body := bytes.Repeat([]byte("x"), size)
	for range streams {
		sendUnread(t, ctx, c, body)
	}
	// Every request is in once the refusals and the streams still open
	// (holding their answers) account for all of them.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		refused := metric(t, reg, "infergate_extproc_overload_refused_total", "limit", "buffer")
		open := metric(t, reg, "infergate_extproc_open_streams")
		if refused > 0 && refused+open == streams {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v refused and %v open of %d requests of %d bytes", refused, open, streams, size)
		}
	}
	held := metric(t, reg, "infergate_extproc_answer_bytes_in_flight") + metric(t, reg, "infergate_extproc_buffered_request_bytes")
	if held <= 0 || held > budget+size {
		t.Fatalf("%v bytes charged, want some and at most the budget (%d) and one answer", held, budget)
	}
	// Unbounded, the heap would hold every answer: 32 MiB. The client's
	// side of the refused requests (in this process too) may still be on
	// its way out: wait for it, not for a number of milliseconds.
	limit := int64(budget + 8<<20)
	grown := heapInUse() - before
	for deadline := time.Now().Add(10 * time.Second); grown > limit && time.Now().Before(deadline); grown = heapInUse() - before {
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%s: %d requests of %d KiB never read: %.0f KiB charged, heap %+d KiB", transport, streams, size>>10, held/1024, grown>>10)
	if grown > limit {
		t.Fatalf("the heap grew %d KiB with a budget of %d KiB, over %d KiB", grown>>10, budget>>10, limit>>10)
	}
}

// TestStreamIdleTimeout: after its request is decided, a stream that
// receives nothing for the stream idle timeout is ended by the processor
// (DEADLINE_EXCEEDED), gives back its slot and what it holds, and is
// counted; a stream still receiving is not, nor one whose answers are
// taken. Answers the client does not take are dropped with it.
func TestStreamIdleTimeout(t *testing.T) { eachTransport(t, testStreamIdleTimeout) }

func testStreamIdleTimeout(t *testing.T, transport string) {
	const idle = 200 * time.Millisecond
	reg := prometheus.NewRegistry()
	srv, _, _ := start(t, transport, &recorder{}, server.Options{Registerer: reg,
		Limits: server.Limits{RequestIdleTimeout: 10 * time.Second, StreamIdleTimeout: idle}})
	conn := dial(t, srv.GRPCAddr(), nil)

	t.Run("silent after the decision", func(t *testing.T) {
		st := openStream(t, conn)
		mustSend(t, st, reqHeaders(true, ":method", "GET"))
		if mustRecv(t, st).GetRequestHeaders() == nil {
			t.Fatal("no answer to the request")
		}
		if _, err := st.Recv(); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("the silent stream: %v, want it ended with DEADLINE_EXCEEDED", err)
		}
		waitMetric(t, reg, "infergate_extproc_open_streams", 0)
		if got := metric(t, reg, "infergate_extproc_idle_endings_total", "phase", "response"); got != 1 {
			t.Fatalf("response-phase endings counted %v, want 1", got)
		}
	})
	t.Run("still receiving", func(t *testing.T) {
		st := openStream(t, conn)
		mustSend(t, st, reqHeaders(true, ":method", "GET"))
		mustRecv(t, st)
		mustSend(t, st, respHeaders())
		mustRecv(t, st)
		for range 5 { // 5 × idle/2: longer than the timeout in all
			time.Sleep(idle / 2)
			mustSend(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: x\n\n")}}})
			if mustRecv(t, st).GetResponseBody() == nil {
				t.Fatal("a response chunk was not answered")
			}
		}
		_ = st.CloseSend()
		if _, err := st.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("a stream that kept receiving: %v, want its natural end", err)
		}
	})
	t.Run("answers not taken", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		sendUnread(t, ctx, stingyClient(t, srv.GRPCAddr()), bytes.Repeat([]byte("x"), 1<<20))
		for deadline := time.Now().Add(5 * time.Second); metric(t, reg, "infergate_extproc_answer_bytes_in_flight") == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the answers were never held")
			}
		}
		waitMetric(t, reg, "infergate_extproc_open_streams", 0)
		waitMetric(t, reg, "infergate_extproc_answer_bytes_in_flight", 0)
		if got := metric(t, reg, "infergate_extproc_idle_endings_total", "phase", "response"); got != 2 {
			t.Fatalf("response-phase endings counted %v, want 2", got)
		}
	})
}

// TestImmediateAnswersEndTheCall: every immediate answer (413, 503 for
// the buffer budget or the stream cap, a decision's or a header gate's
// 4xx) is followed by the end of the call from the processor's side,
// with the client still open: a client that never closes does not keep
// the stream, or its slot. (The 408: TestTimedOutStreamsAreLetGo.)
func TestImmediateAnswersEndTheCall(t *testing.T) { eachTransport(t, testImmediateAnswersEndTheCall) }

func testImmediateAnswersEndTheCall(t *testing.T, transport string) {
	deny := func(*server.Request) *server.Decision {
		return &server.Decision{Reject: &server.Rejection{Status: 403, Reason: "denied"}}
	}
	for _, tc := range []struct {
		name    string
		h       server.Handler
		limits  server.Limits
		headers []string
		hold    bool // another stream holds the process's one slot
		want    int32
	}{
		{"413 body limit", &recorder{}, server.Limits{MaxRequestBodyBytes: 10}, nil, false, 413},
		{"503 buffer budget", &recorder{}, server.Limits{BufferBudgetBytes: 10}, nil, false, 503},
		{"503 stream cap", &recorder{}, server.Limits{MaxStreams: 1}, nil, true, 503},
		{"a decision's 403", &recorder{decide: deny}, server.Limits{}, nil, false, 403},
		{"a header gate's 429", &gatedRecorder{}, server.Limits{}, []string{"x-refuse", "1"}, false, 429},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			srv, _, _ := start(t, transport, tc.h, server.Options{Registerer: reg, Limits: tc.limits})
			conn := dial(t, srv.GRPCAddr(), nil)
			if tc.hold {
				held := openStream(t, conn)
				mustSend(t, held, reqHeaders(false, ":method", "POST"))
				waitMetric(t, reg, "infergate_extproc_open_streams", 1)
			}
			st := openStream(t, conn)
			mustSend(t, st, reqHeaders(false, append([]string{":method", "POST"}, tc.headers...)...))
			_ = st.Send(reqBody(make([]byte, 100), true)) // may find the stream answered already
			if got := mustRecv(t, st).GetImmediateResponse().GetStatus().GetCode(); int32(got) != tc.want {
				t.Fatalf("immediate response %v, want %d", got, tc.want)
			}
			if m, err := st.Recv(); !errors.Is(err, io.EOF) {
				t.Fatalf("after the immediate response: %v, %v; want the call ended (OK)", m, err)
			}
			if !tc.hold {
				waitMetric(t, reg, "infergate_extproc_open_streams", 0)
			}
		})
	}
}

// TestRefusedSilentStreamIsEnded: a stream over the process's cap is
// refused at its first message; one that never sends it is ended at the
// request idle timeout rather than kept (it has no slot, but a stream of
// its connection, and on grpc-go a goroutine).
func TestRefusedSilentStreamIsEnded(t *testing.T) { eachTransport(t, testRefusedSilentStreamIsEnded) }

func testRefusedSilentStreamIsEnded(t *testing.T, transport string) {
	reg := prometheus.NewRegistry()
	srv, _, _ := start(t, transport, &recorder{}, server.Options{Registerer: reg,
		Limits: server.Limits{MaxStreams: 1, RequestIdleTimeout: 150 * time.Millisecond, StreamIdleTimeout: time.Minute}})
	conn := dial(t, srv.GRPCAddr(), nil)
	held := openStream(t, conn)
	mustSend(t, held, reqHeaders(true, ":method", "GET"))
	mustRecv(t, held) // decided: the request idle timeout no longer applies
	silent := openStream(t, conn)
	if m, err := silent.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("a refused stream that sent nothing: %v, %v; want the call ended (OK)", m, err)
	}
	if got := metric(t, reg, "infergate_extproc_overload_refused_total", "limit", "streams"); got != 1 {
		t.Fatalf("stream refusals counted %v, want 1", got)
	}
}
