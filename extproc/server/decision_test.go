package server_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/wire"
)

// costly is a Handler whose exchanges say that deciding a request costs
// what its x-cost header says (server.DecisionCoster), report each
// decision's x-name on started as it begins, and hold the decisions of
// requests with x-hold until release is closed.
type costly struct {
	started chan string
	release chan struct{}
}

func newCostly() *costly {
	return &costly{started: make(chan string, 64), release: make(chan struct{})}
}

func (c *costly) NewExchange(context.Context) server.Exchange { return costExchange{c} }

type costExchange struct{ c *costly }

func (e costExchange) DecisionCost(req *server.Request) int64 {
	n, _ := strconv.ParseInt(req.Headers.Get("x-cost"), 10, 64)
	return n
}

func (e costExchange) HandleRequest(_ context.Context, req *server.Request) *server.Decision {
	e.c.started <- req.Headers.Get("x-name")
	if req.Headers.Get("x-hold") != "" {
		<-e.c.release
	}
	return &server.Decision{}
}

func (costExchange) HandleResponseHeaders(context.Context, *server.Response) *server.Decision {
	return nil
}

func (costExchange) HandleResponseBody(_ context.Context, chunk []byte, _ bool) ([]byte, *structpb.Struct) {
	return chunk, nil
}

func (costExchange) Close(context.Context, server.Summary) {}

// costlyRequest sends a request of body bytes that costs cost to decide,
// whole; hold keeps its decision running until the handler's release.
func costlyRequest(t *testing.T, conn *grpc.ClientConn, name string, body int, cost int64, hold bool) extprocv3.ExternalProcessor_ProcessClient {
	t.Helper()
	st := openStream(t, conn)
	hdrs := []string{":method", "POST", "x-name", name, "x-cost", strconv.FormatInt(cost, 10)}
	if hold {
		hdrs = append(hdrs, "x-hold", "1")
	}
	mustSend(t, st, reqHeaders(false, hdrs...))
	mustSend(t, st, reqBody(make([]byte, body), true))
	return st
}

// waitStarted waits for the decision of name to begin.
func (c *costly) waitStarted(t *testing.T, name string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case got := <-c.started:
			if got == name {
				return
			}
		case <-deadline:
			t.Fatalf("the decision of %s did not begin", name)
		}
	}
}

// notStarted checks that no decision begins for a while.
func (c *costly) notStarted(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case got := <-c.started:
		t.Fatalf("the decision of %s began; want it to wait", got)
	case <-time.After(d):
	}
}

// wantImmediate checks r is an immediate answer of status and reason.
func wantImmediate(t *testing.T, r *extprocv3.ProcessingResponse, status int, reason string) {
	t.Helper()
	ir := r.GetImmediateResponse()
	if ir == nil || int(ir.GetStatus().GetCode()) != status {
		t.Fatalf("want immediate %d, got %v", status, r)
	}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == wire.DropReasonHeader && string(h.GetHeader().GetRawValue()) == reason {
			return
		}
	}
	t.Fatalf("drop reason not %s: %v", reason, ir.GetHeaders())
}

// TestDecisionCharge: what deciding a request costs (DecisionCoster) is
// charged to the buffer budget while the decision runs. Large decisions
// (over 1 MiB of work) hold at most half the budget together; one that
// does not fit waits for those before it, within the request idle
// timeout, and is answered 503 processor-overloaded after it; one over
// the share runs alone, once no other large decision holds any; one that
// could not fit the budget even alone is 413 at once, and one for which
// the bodies leave no room (a
// sixteenth of the budget kept free for small requests) is 503 at once.
// Decisions over bodies of 1 MiB or more run at most
// Limits.MaxLargeDecisions at once. Small decisions (at most 1 MiB of
// work, or a body under 16 KiB) are decided whatever the budget holds, so
// that well-behaved requests go on being answered beside huge ones. The
// budget is 8 MiB: a share of 4 MiB for large decisions.
func TestDecisionCharge(t *testing.T) { eachTransport(t, testDecisionCharge) }

// load is a request of body bytes whose decision costs cost.
type load struct {
	body int
	cost int64
}

func testDecisionCharge(t *testing.T, transport string) {
	const budget, body, heavy = 8 << 20, 32 << 10, 1 << 20
	for _, tc := range []struct {
		name     string
		maxLarge int
		idle     time.Duration // request idle timeout; 0: 10 s
		stalled  int           // an upload left open holding this many bytes of the budget
		held     []load        // decisions held running while the probe comes
		probe    load
		want     string // decided, waits, 503 (at once), 503-after-wait, 413
		refuse   float64
	}{
		{name: "small work beside a full share", maxLarge: 4, held: []load{{body, 4 << 20}}, probe: load{1 << 10, 6 << 10}, want: "decided"},
		{name: "small body beside a full share, however costly", maxLarge: 4, held: []load{{body, 4 << 20}}, probe: load{8 << 10, 2 << 20}, want: "decided"},
		// 128 KiB left: a 64 KiB chunk of the upload in the h2
		// transport's hands takes from the budget too.
		{name: "small work with the budget full of bodies", maxLarge: 4, stalled: budget - 128<<10, probe: load{1 << 10, 1 << 20}, want: "decided"},
		{name: "large decisions within the share run together", maxLarge: 4, held: []load{{body, 2 << 20}}, probe: load{body, 2 << 20}, want: "decided"},
		{name: "past the share waits", maxLarge: 4, held: []load{{body, 3 << 20}}, probe: load{body, 2 << 20}, want: "waits"},
		{name: "the wait ends with the request idle timeout", maxLarge: 4, idle: 300 * time.Millisecond, held: []load{{body, 3 << 20}}, probe: load{body, 2 << 20}, want: "503-after-wait", refuse: 1},
		{name: "work over the share runs alone", maxLarge: 4, probe: load{body, 6 << 20}, want: "decided"},
		{name: "work over the share waits for the share to empty", maxLarge: 4, held: []load{{body, 2 << 20}}, probe: load{body, 5 << 20}, want: "waits"},
		// 8 MiB less the 512 KiB kept and the probe's own body.
		{name: "work no budget can hold beside its body", maxLarge: 4, probe: load{body, 8<<20 - 512<<10 - body + 1}, want: "413", refuse: 1},
		{name: "no room beside the bodies", maxLarge: 4, stalled: 6 << 20, probe: load{body, 2 << 20}, want: "503", refuse: 1},
		// 8 MiB less the 512 KiB kept for the bodies of small requests.
		{name: "room kept for small bodies", maxLarge: 4, stalled: 5 << 20, probe: load{body, 2<<20 + 512<<10}, want: "503", refuse: 1},
		{name: "within the room kept", maxLarge: 4, stalled: 5 << 20, probe: load{body, 2<<20 + 256<<10}, want: "decided"},
		{name: "heavy bodies past the cores wait", maxLarge: 1, held: []load{{heavy, 1 << 20}}, probe: load{heavy, 1 << 20}, want: "waits"},
		{name: "a heavy body waits for a core however small its work", maxLarge: 1, held: []load{{heavy, 0}}, probe: load{heavy, 0}, want: "waits"},
		{name: "lighter bodies do not wait for a core", maxLarge: 1, held: []load{{heavy, 1 << 20}}, probe: load{body, 2 << 20}, want: "decided"},
		{name: "heavy bodies within the cores run together", maxLarge: 2, held: []load{{heavy, 1 << 20}}, probe: load{heavy, 1 << 20}, want: "decided"},
		{name: "no bound on cores", maxLarge: -1, held: []load{{heavy, 1 << 20}, {heavy, 1 << 20}}, probe: load{heavy, 1 << 20}, want: "decided"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idle := tc.idle
			if idle == 0 {
				idle = 10 * time.Second
			}
			reg := prometheus.NewRegistry()
			h := newCostly()
			srv, _, _ := start(t, transport, h, server.Options{Registerer: reg, Limits: server.Limits{
				BufferBudgetBytes: budget, MaxLargeDecisions: tc.maxLarge, RequestIdleTimeout: idle}})
			released := false
			release := func() {
				if !released {
					released = true
					close(h.release)
				}
			}
			t.Cleanup(release) // before the server stops: held decisions end
			conn := dial(t, srv.GRPCAddr(), nil)

			if tc.stalled > 0 {
				// Announced, so that the buffer is sized to it exactly.
				st := openStream(t, conn)
				mustSend(t, st, reqHeaders(false, ":method", "POST", "content-length", strconv.Itoa(tc.stalled+1)))
				for sent := 0; sent < tc.stalled; sent += 64 << 10 {
					mustSend(t, st, reqBody(make([]byte, min(64<<10, tc.stalled-sent)), false))
				}
				waitMetric(t, reg, "infergate_extproc_buffered_request_bytes", float64(tc.stalled+1))
			}
			var held []extprocv3.ExternalProcessor_ProcessClient
			var charged float64
			for i, l := range tc.held {
				name := "held-" + strconv.Itoa(i)
				held = append(held, costlyRequest(t, conn, name, l.body, l.cost, true))
				h.waitStarted(t, name)
				charged += float64(l.cost)
			}
			waitMetric(t, reg, "infergate_extproc_decision_bytes", charged)

			started := time.Now()
			probe := costlyRequest(t, conn, "probe", tc.probe.body, tc.probe.cost, false)
			switch tc.want {
			case "decided":
				if r := mustRecv(t, probe); r.GetRequestHeaders() == nil {
					t.Fatalf("want the probe decided, got %v", r)
				}
			case "waits":
				waitMetric(t, reg, "infergate_extproc_decisions_waiting", 1)
				h.notStarted(t, 200*time.Millisecond)
				release()
				if r := mustRecv(t, probe); r.GetRequestHeaders() == nil {
					t.Fatalf("want the probe decided once the held decisions ended, got %v", r)
				}
			case "503-after-wait":
				wantOverloaded(t, mustRecv(t, probe))
				if waited := time.Since(started); waited < idle {
					t.Fatalf("refused after %s, before the idle timeout of %s", waited, idle)
				}
			case "503":
				wantOverloaded(t, mustRecv(t, probe))
			case "413":
				wantImmediate(t, mustRecv(t, probe), 413, "request-too-large")
			}
			if got := metric(t, reg, "infergate_extproc_overload_refused_total", "limit", "decision"); got != tc.refuse {
				t.Errorf("decision refusals counted %v, want %v", got, tc.refuse)
			}
			release()
			for i, st := range held {
				if r := mustRecv(t, st); r.GetRequestHeaders() == nil {
					t.Fatalf("held decision %d: want it answered once let go, got %v", i, r)
				}
			}
			waitMetric(t, reg, "infergate_extproc_decision_bytes", 0)
			waitMetric(t, reg, "infergate_extproc_decisions_waiting", 0)
		})
	}
}

// TestDecisionTurns: large decisions that wait for the share are charged
// in the order they came, and one whose stream ends while it waits gives
// its turn to the next.
func TestDecisionTurns(t *testing.T) { eachTransport(t, testDecisionTurns) }

func testDecisionTurns(t *testing.T, transport string) {
	reg := prometheus.NewRegistry()
	h := newCostly()
	srv, _, _ := start(t, transport, h, server.Options{Registerer: reg, Limits: server.Limits{
		BufferBudgetBytes: 8 << 20, RequestIdleTimeout: 10 * time.Second}})
	var once bool
	t.Cleanup(func() {
		if !once {
			close(h.release)
		}
	})
	conn := dial(t, srv.GRPCAddr(), nil)
	// Each holds 3 MiB of the 4 MiB share: one runs at a time.
	running := costlyRequest(t, conn, "running", 32<<10, 3<<20, true)
	h.waitStarted(t, "running")

	// The first to wait goes away; the two after it are decided in turn.
	ctx, cancel := context.WithCancel(context.Background())
	gone, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustSend(t, gone, reqHeaders(false, ":method", "POST", "x-name", "gone", "x-cost", strconv.Itoa(3<<20)))
	mustSend(t, gone, reqBody(make([]byte, 32<<10), true))
	waitMetric(t, reg, "infergate_extproc_decisions_waiting", 1)
	var next []extprocv3.ExternalProcessor_ProcessClient
	for i := range 2 {
		next = append(next, costlyRequest(t, conn, "next-"+strconv.Itoa(i), 32<<10, 3<<20, false))
		waitMetric(t, reg, "infergate_extproc_decisions_waiting", float64(2+i))
	}
	cancel()
	waitMetric(t, reg, "infergate_extproc_decisions_waiting", 2)
	h.notStarted(t, 100*time.Millisecond)

	once = true
	close(h.release)
	if r := mustRecv(t, running); r.GetRequestHeaders() == nil {
		t.Fatalf("the running decision: %v", r)
	}
	// In the order they came: next-0 first.
	for _, name := range []string{"next-0", "next-1"} {
		select {
		case got := <-h.started:
			if got != name {
				t.Fatalf("the decision of %s began, want %s", got, name)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the decision of %s did not begin", name)
		}
	}
	for i, st := range next {
		if r := mustRecv(t, st); r.GetRequestHeaders() == nil {
			t.Fatalf("waiter %d: %v", i, r)
		}
	}
	waitMetric(t, reg, "infergate_extproc_decision_bytes", 0)
	if got := metric(t, reg, "infergate_extproc_overload_refused_total", "limit", "decision"); got != 0 {
		t.Fatalf("decision refusals counted %v, want none", got)
	}
}
