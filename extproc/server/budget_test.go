package server_test

import (
	"io"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/wire"
)

// metric reads one series from reg: a gauge's or counter's value, 0 when
// the series does not exist yet.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabels(m, labels) {
				return m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func hasLabels(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			found = found || (l.GetName() == kv[i] && l.GetValue() == kv[i+1])
		}
		if !found {
			return false
		}
	}
	return true
}

func waitMetric(t *testing.T, reg *prometheus.Registry, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for metric(t, reg, name) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v, want %v", name, metric(t, reg, name), want)
		}
		time.Sleep(time.Millisecond)
	}
}

func wantOverloaded(t *testing.T, r *extprocv3.ProcessingResponse) {
	t.Helper()
	ir := r.GetImmediateResponse()
	if ir == nil || ir.GetStatus().GetCode() != 503 {
		t.Fatalf("want immediate 503, got %v", r)
	}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == wire.DropReasonHeader && string(h.GetHeader().GetRawValue()) == server.ReasonOverloaded {
			return
		}
	}
	t.Fatalf("drop reason not %s: %v", server.ReasonOverloaded, ir.GetHeaders())
}

// TestBufferBudgetRefusesAndFrees: stalled uploads cannot hold more than
// the process budget between them; a request that would pass it is
// refused with a clear 503, and bytes come back once a request is decided.
func TestBufferBudgetRefusesAndFrees(t *testing.T) { eachTransport(t, testBufferBudgetRefusesAndFrees) }

func testBufferBudgetRefusesAndFrees(t *testing.T, transport string) {
	reg := prometheus.NewRegistry()
	rec := &recorder{}
	srv, _, _ := start(t, transport, rec, server.Options{Registerer: reg, Limits: server.Limits{BufferBudgetBytes: 1000}})
	conn := dial(t, srv.GRPCAddr(), nil)

	stalled := openStream(t, conn)
	mustSend(t, stalled, reqHeaders(false, ":method", "POST"))
	mustSend(t, stalled, reqBody(make([]byte, 700), false))
	waitMetric(t, reg, "infergate_extproc_buffered_request_bytes", 700)

	over := openStream(t, conn)
	mustSend(t, over, reqHeaders(false, ":method", "POST"))
	mustSend(t, over, reqBody(make([]byte, 400), false))
	wantOverloaded(t, mustRecv(t, over))
	if got := metric(t, reg, "infergate_extproc_buffered_request_bytes"); got != 700 {
		t.Fatalf("after the refusal %v bytes buffered, want the stalled request's 700", got)
	}

	// The stalled request completes, is decided, and frees its bytes.
	mustSend(t, stalled, reqBody(make([]byte, 200), true))
	if mustRecv(t, stalled).GetRequestHeaders() == nil {
		t.Fatal("the request within the budget was not answered")
	}
	waitMetric(t, reg, "infergate_extproc_buffered_request_bytes", 0)

	fits := openStream(t, conn)
	mustSend(t, fits, reqHeaders(false, ":method", "POST"))
	mustSend(t, fits, reqBody(make([]byte, 900), true))
	if mustRecv(t, fits).GetRequestHeaders() == nil {
		t.Fatal("a request that fits the freed budget was not answered")
	}
	if got := metric(t, reg, "infergate_extproc_overload_refused_total", "limit", "buffer"); got != 1 {
		t.Fatalf("buffer refusals counted %v, want 1", got)
	}
}

// TestStreamCap: one stream over MaxStreams is refused at its headers,
// and a slot comes back when a stream ends.
func TestStreamCap(t *testing.T) { eachTransport(t, testStreamCap) }

func testStreamCap(t *testing.T, transport string) {
	reg := prometheus.NewRegistry()
	srv, _, _ := start(t, transport, &recorder{}, server.Options{Registerer: reg, Limits: server.Limits{MaxStreams: 2}})
	conn := dial(t, srv.GRPCAddr(), nil)

	held := []extprocv3.ExternalProcessor_ProcessClient{openStream(t, conn), openStream(t, conn)}
	for _, st := range held {
		mustSend(t, st, reqHeaders(false, ":method", "POST"))
	}
	waitMetric(t, reg, "infergate_extproc_open_streams", 2)

	third := openStream(t, conn)
	mustSend(t, third, reqHeaders(false, ":method", "POST"))
	wantOverloaded(t, mustRecv(t, third))

	mustSend(t, held[0], reqBody([]byte("{}"), true))
	if mustRecv(t, held[0]).GetRequestHeaders() == nil {
		t.Fatal("a request within the cap was not answered")
	}
	if err := held[0].CloseSend(); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, reg, "infergate_extproc_open_streams", 1)

	next := openStream(t, conn)
	mustSend(t, next, reqHeaders(true, ":method", "GET"))
	if mustRecv(t, next).GetRequestHeaders() == nil {
		t.Fatal("a stream after a slot came back was not answered")
	}
	if got := metric(t, reg, "infergate_extproc_overload_refused_total", "limit", "streams"); got != 1 {
		t.Fatalf("stream refusals counted %v, want 1", got)
	}
}

func respHeaders() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}}
}

// TestRequestIdleTimeout: a request that stops sending before its end is
// answered 408 and its body freed; a slow but moving request is not, and
// neither is the wait for the response once the request is decided.
func TestRequestIdleTimeout(t *testing.T) { eachTransport(t, testRequestIdleTimeout) }

func testRequestIdleTimeout(t *testing.T, transport string) {
	const idle = 150 * time.Millisecond
	reg := prometheus.NewRegistry()
	srv, _, _ := start(t, transport, &recorder{}, server.Options{Registerer: reg, Limits: server.Limits{RequestIdleTimeout: idle}})
	conn := dial(t, srv.GRPCAddr(), nil)

	t.Run("stalled upload", func(t *testing.T) {
		st := openStream(t, conn)
		mustSend(t, st, reqHeaders(false, ":method", "POST"))
		mustSend(t, st, reqBody(make([]byte, 5000), false))
		waitMetric(t, reg, "infergate_extproc_buffered_request_bytes", 5000)
		started := time.Now()
		ir := mustRecv(t, st).GetImmediateResponse()
		if ir == nil || ir.GetStatus().GetCode() != 408 {
			t.Fatalf("want immediate 408, got %v", ir)
		}
		if waited := time.Since(started); waited > 5*idle {
			t.Fatalf("answered after %s with an idle timeout of %s", waited, idle)
		}
		waitMetric(t, reg, "infergate_extproc_buffered_request_bytes", 0)
		if got := metric(t, reg, "infergate_extproc_request_idle_timeouts_total"); got != 1 {
			t.Fatalf("timeouts counted %v, want 1", got)
		}
	})
	t.Run("slow but moving upload", func(t *testing.T) {
		st := openStream(t, conn)
		mustSend(t, st, reqHeaders(false, ":method", "POST"))
		for range 5 { // 5 × idle/2: longer than the timeout in all
			mustSend(t, st, reqBody([]byte("xxxx"), false))
			time.Sleep(idle / 2)
		}
		mustSend(t, st, reqBody([]byte("{}"), true))
		if mustRecv(t, st).GetRequestHeaders() == nil {
			t.Fatal("a moving request was not answered normally")
		}
	})
	t.Run("long wait for the response", func(t *testing.T) {
		st := openStream(t, conn)
		mustSend(t, st, reqHeaders(true, ":method", "GET"))
		if mustRecv(t, st).GetRequestHeaders() == nil {
			t.Fatal("no answer to the request")
		}
		time.Sleep(3 * idle) // the model thinks
		mustSend(t, st, respHeaders())
		if mustRecv(t, st).GetResponseHeaders() == nil {
			t.Fatal("the response path was cut by the request idle timeout")
		}
	})
}

// TestTimedOutStreamsAreLetGo: a stream answered 408 by the idle
// watchdog is ended by the processor (trailers, not left for the client to
// close) and gives back its --max-streams slot at once: a client holding
// header-only streams open cannot keep others out past the idle timeout.
func TestTimedOutStreamsAreLetGo(t *testing.T) { eachTransport(t, testTimedOutStreamsAreLetGo) }

func testTimedOutStreamsAreLetGo(t *testing.T, transport string) {
	const idle, held = 150 * time.Millisecond, 8
	reg := prometheus.NewRegistry()
	srv, _, _ := start(t, transport, &recorder{}, server.Options{Registerer: reg,
		Limits: server.Limits{RequestIdleTimeout: idle, MaxStreams: held}})
	conn := dial(t, srv.GRPCAddr(), nil)
	var streams []extprocv3.ExternalProcessor_ProcessClient
	for range held {
		st := openStream(t, conn)
		mustSend(t, st, reqHeaders(false, ":method", "POST")) // and nothing more, never closed
		streams = append(streams, st)
	}
	waitMetric(t, reg, "infergate_extproc_open_streams", held)
	for i, st := range streams {
		if ir := mustRecv(t, st).GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 408 {
			t.Fatalf("stream %d: want immediate 408, got %v", i, ir)
		}
		// The processor ends the call: the next receive is the end, OK.
		if m, err := st.Recv(); err != io.EOF {
			t.Fatalf("stream %d after its 408: %v, %v; want the call ended (EOF)", i, m, err)
		}
	}
	waitMetric(t, reg, "infergate_extproc_open_streams", 0)
	st := openStream(t, conn)
	mustSend(t, st, reqHeaders(true, ":method", "GET"))
	if mustRecv(t, st).GetRequestHeaders() == nil {
		t.Fatal("a request after the held streams timed out was not served")
	}
}

// TestAnnouncedBodySizesTheBuffer: the first chunk of a body whose
// content-length says how large it is gets a buffer for all of it (so the
// body is not copied as it grows), bounded so a false announcement takes at
// most 64 KiB past what has arrived, and what the budget has left when it
// cannot spare all of it.
func TestAnnouncedBodySizesTheBuffer(t *testing.T) { eachTransport(t, testAnnouncedBodySizesTheBuffer) }

func testAnnouncedBodySizesTheBuffer(t *testing.T, transport string) {
	for _, tc := range []struct {
		name          string
		budget        int64
		contentLength string // "" sends none
		first         int
		want          float64 // bytes held after the first chunk, and after the rest
	}{
		{"no content-length", 8 << 20, "", 1000, 1000},
		{"announced", 8 << 20, "4000", 1000, 4000},
		{"announced beyond the bound", 8 << 20, "104857600", 1000, 1000 + 64<<10},
		{"a byte announcing a megabyte", 8 << 20, "1048576", 1, 1 + 64<<10},
		{"not a number", 8 << 20, "lots", 1000, 1000},
		{"the budget cannot spare it", 2000, "4000", 1000, 2000},
		{"the announced buffer holds the rest", 4000, "4000", 1000, 4000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			srv, _, _ := start(t, transport, &recorder{}, server.Options{Registerer: reg, Limits: server.Limits{BufferBudgetBytes: tc.budget}})
			st := openStream(t, dial(t, srv.GRPCAddr(), nil))
			hdrs := []string{":method", "POST"}
			if tc.contentLength != "" {
				hdrs = append(hdrs, "content-length", tc.contentLength)
			}
			mustSend(t, st, reqHeaders(false, hdrs...))
			mustSend(t, st, reqBody(make([]byte, tc.first), false))
			waitMetric(t, reg, "infergate_extproc_buffered_request_bytes", tc.want)
			if tc.budget == 4000 {
				// The whole budget is this request's now: the rest of its
				// body must fit what it holds, with nothing reserved again.
				mustSend(t, st, reqBody(make([]byte, 3000), true))
				if r := mustRecv(t, st); r.GetRequestHeaders() == nil {
					t.Fatalf("the rest of the announced body was not taken into the buffer it had: %v", r)
				}
			}
		})
	}
}
