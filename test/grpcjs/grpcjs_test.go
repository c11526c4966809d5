package grpcjs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/test/childproc"
)

// target is one processor configuration, served on both transports.
type target struct {
	kind string
	tls  bool
}

func (tg target) String() string {
	if tg.tls {
		return tg.kind + "/tls"
	}
	return tg.kind + "/plaintext"
}

// run is what one scenario run against one processor sees.
type run struct {
	t      *testing.T
	js     jsEnv
	p      *processor
	served string // the picker pool's endpoint
}

// driver starts a grpc-js channel to the processor.
func (r run) driver(options map[string]any, trace string) (*driver, error) {
	return startDriver(r.t, r.js, driverConfig{Target: r.p.addr, TLS: r.p.tls, Options: options, Trace: trace})
}

func (r run) request(n, size, chunk int) httpRequest {
	return httpRequest{n: n, size: size, chunk: chunk, kind: r.p.kind, served: r.served}
}

// result is what a run produced: everything in it but notes must be equal
// on grpc-go and h2.
type result struct {
	outcomes []outcome
	// states are the grpc-js channel's connectivity states in order: one
	// connection is IDLE, CONNECTING, READY; a connection the server
	// closed shows as a READY left.
	states []string
	// pings and pingAcks are the keepalive pings grpc-js sent and saw
	// answered; goaways the GOAWAY frames it received, as it traced them.
	pings, pingAcks int
	goaways         []string
	notes           []string // figures for the log, not compared
}

func (res *result) note(format string, args ...any) {
	res.notes = append(res.notes, fmt.Sprintf(format, args...))
}

// traced records the keepalive and GOAWAY lines of a driver run with
// trace "keepalive,transport".
func (res *result) traced(d *driver) {
	res.pings = len(d.logLines("Sending ping"))
	res.pingAcks = len(d.logLines("Received ping response"))
	res.goaways = d.logLines("connection closed by GOAWAY")
	for i, l := range res.goaways {
		// The line starts with a timestamp and the process id.
		_, res.goaways[i], _ = strings.Cut(l, "connection closed by GOAWAY")
	}
}

// scenario is one way of driving a processor.
type scenario struct {
	name string
	// parallel bounds the runs at once, across the eight processors: the
	// CPU-heavy ones share two cores with the test.
	parallel int
	run      func(ctx context.Context, r run) (*result, error)
}

// Sizes of the bodies: Envoy passes a client's body on in the chunks it
// reads; 16 KiB is an HTTP/1 read, 64 KiB the largest chunk some Envoy
// builds stream (see extproc/server.MaxChunkBytes).
const (
	kib       = 1 << 10
	smallBody = 1 * kib
	largeBody = 200 * kib
)

func scenarios() []scenario {
	return []scenario{
		{name: "1KiB_body_one_chunk", parallel: 8, run: exchanges(1, smallBody, smallBody)},
		{name: "200KiB_body_16KiB_chunks", parallel: 4, run: exchanges(1, largeBody, 16*kib)},
		{name: "200KiB_body_64KiB_chunks", parallel: 4, run: exchanges(1, largeBody, 64*kib)},
		{name: "1000_concurrent_streams_one_connection", parallel: 2, run: exchanges(1000, smallBody, smallBody)},
		{name: "cancel_mid_stream", parallel: 8, run: cancelMidStream},
		{name: "deadline_300ms", parallel: 8, run: deadline(300 * time.Millisecond)},
		{name: "keepalive_pings_at_the_permitted_rate", parallel: 8, run: keepalivePermitted},
		{name: "keepalive_pings_too_often", parallel: 8, run: keepaliveTooOften},
	}
}

// exchanges runs n requests at once on one channel (one HTTP/2
// connection), each a whole exchange as Envoy runs it, and checks every
// answer. The response paths wait until every request path is answered,
// so that all n streams are open on the processor at once, which its
// open-streams gauge must show.
func exchanges(n, size, chunk int) func(context.Context, run) (*result, error) {
	return func(ctx context.Context, r run) (*result, error) {
		d, err := r.driver(nil, "")
		if err != nil {
			return nil, err
		}
		res := &result{outcomes: make([]outcome, n)}
		errs := make([]error, n)
		var reached sync.WaitGroup
		reached.Add(n)
		release := make(chan struct{})
		var openErr error
		go func() {
			defer close(release)
			reached.Wait()
			_, openErr = r.p.waitOpenStreams(ctx, n, 10*time.Second)
		}()
		start := time.Now()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				var once sync.Once
				arrive := func() { once.Do(reached.Done) }
				defer arrive() // a stream that failed early must not hold the others
				req := r.request(i, size, chunk)
				s, err := d.open(0)
				if err == nil {
					res.outcomes[i], err = exchange(ctx, s, req, func() error {
						arrive()
						<-release
						return nil
					})
				}
				if err == nil {
					err = checkAnswered(req, res.outcomes[i])
				}
				errs[i] = err
			})
		}
		wg.Wait()
		<-release
		elapsed := time.Since(start)
		res.states = d.stateLog()
		if err := d.close(ctx); err != nil {
			return res, err
		}
		var failed []string
		for i, err := range errs {
			if err != nil {
				failed = append(failed, fmt.Sprintf("stream %d: %v", i, err))
			}
		}
		if len(failed) > 0 {
			return res, fmt.Errorf("%d of %d streams failed, first: %s", len(failed), n, strings.Join(failed[:min(3, len(failed))], "; "))
		}
		if openErr != nil {
			return res, fmt.Errorf("with every request answered and no stream ended: %w", openErr)
		}
		if !slices.Equal(res.states, oneConnection()) {
			return res, fmt.Errorf("channel states %v, want one connection throughout (%v)", res.states, oneConnection())
		}
		slowest := 0.0
		for _, o := range res.outcomes {
			slowest = max(slowest, o.ms)
		}
		o := res.outcomes[0]
		res.note("%d exchange(s) of %d B in %d B chunks, %d answers each, %d streams open at once: done %s after the driver started, the slowest call %.1f ms; response headers %v, status %d %q, trailing metadata %v",
			n, size, chunk, len(o.answers), n, elapsed.Round(time.Millisecond), slowest, o.headers, o.code, o.details, o.trailers)
		return res, nil
	}
}

// openHalfSent opens a stream and sends a large request's headers and its
// first body chunk, and no more: a request in flight.
func openHalfSent(d *driver, r run) (*jsStream, error) {
	s, err := d.open(0)
	if err != nil {
		return nil, err
	}
	for _, m := range r.request(0, largeBody, 16*kib).requestMessages()[:2] {
		if err := s.send(m); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// cancelMidStream cancels a stream after its headers and one body chunk,
// once the processor has it open, as Envoy resets the stream of a request
// whose client went away.
func cancelMidStream(ctx context.Context, r run) (*result, error) {
	d, err := r.driver(nil, "")
	if err != nil {
		return nil, err
	}
	s, err := openHalfSent(d, r)
	if err != nil {
		return nil, err
	}
	if _, err := r.p.waitOpenStreams(ctx, 1, 10*time.Second); err != nil {
		return nil, fmt.Errorf("before the cancel: %w", err)
	}
	if err := s.cancel(); err != nil {
		return nil, err
	}
	res := &result{outcomes: make([]outcome, 1)}
	if err := finish(ctx, s, &res.outcomes[0]); err != nil {
		return nil, err
	}
	res.states = d.stateLog()
	if err := d.close(ctx); err != nil {
		return res, err
	}
	if o := res.outcomes[0]; o.code != codeCancelled {
		return res, fmt.Errorf("status %d %q after the cancel, want CANCELLED", o.code, o.details)
	}
	return res, nil
}

// gRPC status codes the scenarios expect.
const (
	codeCancelled        = 1
	codeDeadlineExceeded = 4
	// codeResourceExhausted is what grpc-js makes of a stream the server
	// cut with ENHANCE_YOUR_CALM (a GOAWAY too_many_pings).
	codeResourceExhausted = 8
)

// deadline opens a stream with a grpc-js deadline on a connection already
// up (Envoy's are) and sends all of the body but its last chunk, as a
// client that stalls: the stream must end at about the deadline.
//
// Both ends enforce it, grpc-js with its timer and the server with the
// grpc-timeout header grpc-js sends, and on a loaded machine either may be
// first. grpc-js's timer gives DEADLINE_EXCEEDED; a server's status at its
// deadline gives DEADLINE_EXCEEDED too; grpc-go's transport also resets
// the stream at the deadline (RST_STREAM CANCEL, grpc-go
// internal/transport/http2_server.go), which grpc-js reports as CANCELLED
// "Call cancelled" if it comes first. Any of these is the stream ending
// at its deadline.
func deadline(after time.Duration) func(context.Context, run) (*result, error) {
	return func(ctx context.Context, r run) (*result, error) {
		d, err := r.driver(nil, "")
		if err != nil {
			return nil, err
		}
		res := &result{outcomes: make([]outcome, 2)}
		warm := r.request(0, smallBody, smallBody)
		s, err := d.open(0)
		if err != nil {
			return nil, err
		}
		if res.outcomes[0], err = exchange(ctx, s, warm, nil); err == nil {
			err = checkAnswered(warm, res.outcomes[0])
		}
		if err != nil {
			return res, fmt.Errorf("the request before: %w", err)
		}
		if s, err = d.open(after); err != nil {
			return res, err
		}
		msgs := r.request(1, largeBody, 16*kib).requestMessages()
		for _, m := range msgs[:len(msgs)-1] {
			if err := s.send(m); err != nil {
				return res, err
			}
		}
		o := &res.outcomes[1]
		if err := finish(ctx, s, o); err != nil {
			return res, err
		}
		res.states = d.stateLog()
		if err := d.close(ctx); err != nil {
			return res, err
		}
		var ender string
		switch {
		case o.code == codeDeadlineExceeded && strings.HasPrefix(o.details, "Deadline exceeded after"):
			ender = "grpc-js's timer"
		case o.code == codeDeadlineExceeded:
			ender = "the server's status"
		case o.code == codeCancelled && o.details == "Call cancelled":
			ender = "the server's RST_STREAM"
		default:
			return res, fmt.Errorf("status %d %q, want DEADLINE_EXCEEDED", o.code, o.details)
		}
		o.atDeadline = true
		res.note("status %d %q after %.1f ms (deadline %s), ended by %s; trailing metadata %v", o.code, o.details, o.ms, after, ender, o.trailers)
		// Early is a bug (but for the millisecond clock grpc-js sets the
		// deadline with), late is a loaded machine, up to a point.
		if late := time.Duration(o.ms * float64(time.Millisecond)); late < after-2*time.Millisecond || late > after+2*time.Second {
			return res, fmt.Errorf("the stream ended after %s, want about %s", late, after)
		}
		return res, nil
	}
}

// Keepalive: both transports permit a ping every 10 s, with or without
// streams open, and close a connection after more than two pings that
// came sooner with nothing sent in between (grpc-go's enforcement policy,
// extproc/server/server.go; h2server's copy, extproc/h2server/conn.go).
const permittedPing = 10 * time.Second

// keepalivePermitted keeps a connection open across a keepalive ping at
// the fastest permitted rate, with requests before and after it: the ping
// must be answered and the connection kept.
func keepalivePermitted(ctx context.Context, r run) (*result, error) {
	d, err := r.driver(map[string]any{
		"grpc.keepalive_time_ms":              permittedPing.Milliseconds(),
		"grpc.keepalive_timeout_ms":           5000,
		"grpc.keepalive_permit_without_calls": 1,
	}, "keepalive,transport")
	if err != nil {
		return nil, err
	}
	res := &result{outcomes: make([]outcome, 2)}
	for i := range res.outcomes {
		if i == 1 {
			wait, cancel := context.WithTimeout(ctx, permittedPing+10*time.Second)
			err := d.waitLog(wait, "Received ping response", 1)
			cancel()
			if err != nil {
				return res, err
			}
		}
		req := r.request(i, smallBody, smallBody)
		s, err := d.open(0)
		if err != nil {
			return res, err
		}
		if res.outcomes[i], err = exchange(ctx, s, req, nil); err != nil {
			return res, fmt.Errorf("request %d: %w", i, err)
		}
		if err := checkAnswered(req, res.outcomes[i]); err != nil {
			return res, fmt.Errorf("request %d: %w", i, err)
		}
	}
	res.states = d.stateLog()
	res.traced(d)
	if err := d.close(ctx); err != nil {
		return res, err
	}
	res.note("pings sent %d, answered %d; channel states %v", res.pings, res.pingAcks, res.states)
	if res.pingAcks < 1 || len(res.goaways) > 0 || !slices.Equal(res.states, oneConnection()) {
		return res, fmt.Errorf("pings sent %d, answered %d; GOAWAY %q; channel states %v, want one connection throughout (%v)",
			res.pings, res.pingAcks, res.goaways, res.states, oneConnection())
	}
	return res, nil
}

// oneConnection is a channel that connected once and stayed connected.
func oneConnection() []string { return []string{"IDLE", "CONNECTING", "READY"} }

// keepaliveTooOften pings every second while a stream waits for the rest
// of its body and nothing is sent: the processor must close the
// connection with GOAWAY too_many_pings at the third strike (the fourth
// ping), as grpc-go's enforcement does, end the stream, and serve the
// client's next connection.
func keepaliveTooOften(ctx context.Context, r run) (*result, error) {
	d, err := r.driver(map[string]any{
		"grpc.keepalive_time_ms":              1000,
		"grpc.keepalive_timeout_ms":           5000,
		"grpc.keepalive_permit_without_calls": 1,
	}, "keepalive,transport")
	if err != nil {
		return nil, err
	}
	s, err := openHalfSent(d, r)
	if err != nil {
		return nil, err
	}
	res := &result{outcomes: make([]outcome, 2)}
	wait, cancel := context.WithTimeout(ctx, 20*time.Second)
	err = finish(wait, s, &res.outcomes[0])
	cancel()
	// The pings of the first connection only: the next one pings at a
	// backed-off rate for as long as it lasts, which varies.
	res.traced(d)
	if err != nil {
		return res, fmt.Errorf("the held stream did not end (pings sent %d, GOAWAY %q): %w", res.pings, res.goaways, err)
	}
	res.note("the held stream ended %d %q after %.0f ms", res.outcomes[0].code, res.outcomes[0].details, res.outcomes[0].ms)
	// The client backs off its ping rate and reconnects; the processor
	// must serve it.
	req := r.request(1, smallBody, smallBody)
	s, err = d.open(0)
	if err != nil {
		return res, err
	}
	if res.outcomes[1], err = exchange(ctx, s, req, nil); err != nil {
		return res, fmt.Errorf("the request after the GOAWAY: %w", err)
	}
	if err := checkAnswered(req, res.outcomes[1]); err != nil {
		return res, fmt.Errorf("the request after the GOAWAY: %w", err)
	}
	res.states = d.stateLog()
	if err := d.close(ctx); err != nil {
		return res, err
	}
	tooMany := d.logLines("rejected by server because of excess pings")
	res.note("pings sent %d, answered %d; GOAWAY %q; channel states %v", res.pings, res.pingAcks, res.goaways, res.states)
	if len(tooMany) != 1 || res.outcomes[0].code != codeResourceExhausted {
		return res, fmt.Errorf("held stream %d %q; grpc-js excess-pings lines %q (GOAWAY %q), want the stream RESOURCE_EXHAUSTED and one GOAWAY too_many_pings",
			res.outcomes[0].code, res.outcomes[0].details, tooMany, res.goaways)
	}
	return res, nil
}

func TestInterop(t *testing.T) {
	js := findJS(t)
	procs := startProcessors(t, childproc.Command(t, "infergate"))
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			results := runScenario(t, js, procs, sc)
			for _, tg := range targets() {
				t.Run(tg.String(), func(t *testing.T) {
					g, h := results[procKey{tg, transportGRPC}], results[procKey{tg, transportH2}]
					for _, o := range []*runOutcome{g, h} {
						for _, n := range o.res.notes {
							t.Logf("%s: %s", o.p, n)
						}
						t.Logf("%s: nothing open %s after the last status", o.p, o.cleared.Round(time.Millisecond))
						if o.err != nil {
							t.Errorf("%s: %v", o.p, o.err)
						}
					}
					if g.err == nil && h.err == nil {
						compare(t, g.res, h.res)
					}
				})
			}
		})
	}
}

func targets() []target {
	return []target{{kindPicker, false}, {kindPicker, true}, {kindPayload, false}, {kindPayload, true}}
}

type procKey struct {
	target
	transport string
}

// startProcessors runs each target on both transports, all at once, and a
// pool file for the pickers that names one endpoint.
func startProcessors(t *testing.T, bin string) map[procKey]*processor {
	t.Helper()
	served, err := childproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	pool := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(pool, fmt.Appendf(nil, "name: interop\nendpoints:\n- address: %s\n  name: model-server-0\n", served), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	procs := map[procKey]*processor{}
	var errs []error
	var wg sync.WaitGroup
	for _, tg := range targets() {
		for _, tr := range []string{transportGRPC, transportH2} {
			wg.Go(func() {
				p, err := startProcessor(t, bin, tg.kind, tr, tg.tls, pool)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				p.served = served
				procs[procKey{tg, tr}] = p
			})
		}
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	return procs
}

// runOutcome is one scenario run on one processor.
type runOutcome struct {
	p       *processor
	res     *result
	err     error
	cleared time.Duration // how long the open-streams gauge took to read 0
}

// runScenario runs sc on every processor, at most sc.parallel at once (no
// processor runs two things at once: its open-streams gauge is the run's),
// and checks that each is left with nothing open.
func runScenario(t *testing.T, js jsEnv, procs map[procKey]*processor, sc scenario) map[procKey]*runOutcome {
	out := map[procKey]*runOutcome{}
	sem := make(chan struct{}, sc.parallel)
	var wg sync.WaitGroup
	for k, p := range procs {
		o := &runOutcome{p: p, res: &result{}}
		out[k] = o
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			res, err := sc.run(ctx, run{t: t, js: js, p: p, served: p.served})
			if res != nil {
				o.res = res
			}
			cleared, cerr := p.waitOpenStreams(ctx, 0, 5*time.Second)
			o.err, o.cleared = joinErrs(err, cerr), cleared
		})
	}
	wg.Wait()
	return out
}

func joinErrs(a, b error) error {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return fmt.Errorf("%w; and %w", a, b)
}

// compare requires h2's run to be grpc-go's: the same answers, byte for
// byte once normalised, the same response headers, statuses and trailers,
// the same connection events. Only the first few streams that differ are
// shown in full.
func compare(t *testing.T, g, h *result) {
	t.Helper()
	if len(g.outcomes) != len(h.outcomes) {
		t.Fatalf("%d streams on grpc-go, %d on h2", len(g.outcomes), len(h.outcomes))
	}
	var diffs []string
	reordered := 0
	for i := range g.outcomes {
		a, b := g.outcomes[i], h.outcomes[i]
		var d []string
		if len(a.answers) != len(b.answers) {
			d = append(d, fmt.Sprintf("%d answers on grpc-go, %d on h2:\ngrpc-go: %v\nh2:      %v", len(a.answers), len(b.answers), describe(a.answers), describe(b.answers)))
		} else {
			for j := range a.answers {
				na, nb := normalise(t, a.answers[j]), normalise(t, b.answers[j])
				if !bytes.Equal(na, nb) {
					d = append(d, fmt.Sprintf("answer %d differs:\ngrpc-go: %v\nh2:      %v", j, describe(a.answers[j:j+1]), describe(b.answers[j:j+1])))
				} else if !bytes.Equal(a.answers[j], b.answers[j]) {
					reordered++
				}
			}
		}
		// A stream that ended at its deadline ended by whichever end was
		// first (see deadline): the status's code (grpc-go's RST_STREAM
		// can beat grpc-js's timer by a fraction of a millisecond and
		// give CANCELLED), details (grpc-js's carry timings and the
		// peer's address) and trailers are that end's. That it ended then
		// is what both transports must agree on; deadline checked each
		// ending is one of those.
		deadlineRace := a.atDeadline && b.atDeadline
		if !deadlineRace && (a.code != b.code || a.details != b.details) {
			d = append(d, fmt.Sprintf("status %d %q on grpc-go, %d %q on h2", a.code, a.details, b.code, b.details))
		}
		if fmt.Sprint(a.headers) != fmt.Sprint(b.headers) {
			d = append(d, fmt.Sprintf("response headers %v on grpc-go, %v on h2", a.headers, b.headers))
		}
		if !deadlineRace && fmt.Sprint(a.trailers) != fmt.Sprint(b.trailers) {
			d = append(d, fmt.Sprintf("trailing metadata %v on grpc-go, %v on h2", a.trailers, b.trailers))
		}
		if len(d) > 0 {
			diffs = append(diffs, fmt.Sprintf("stream %d: %s", i, strings.Join(d, "; ")))
		}
	}
	if len(diffs) > 0 {
		t.Errorf("%d of %d streams differ between grpc-go and h2; the first:\n%s", len(diffs), len(g.outcomes), strings.Join(diffs[:min(3, len(diffs))], "\n"))
	}
	if reordered > 0 {
		t.Logf("%d answers equal only once normalised (map order)", reordered)
	}
	if !slices.Equal(g.states, h.states) {
		t.Errorf("channel states %v on grpc-go, %v on h2", g.states, h.states)
	}
	if g.pings != h.pings || g.pingAcks != h.pingAcks || !slices.Equal(g.goaways, h.goaways) {
		t.Errorf("keepalive: grpc-go pings %d, answered %d, GOAWAY %q; h2 pings %d, answered %d, GOAWAY %q",
			g.pings, g.pingAcks, g.goaways, h.pings, h.pingAcks, h.goaways)
	}
}

// normalise re-encodes an answer deterministically. Go's protobuf encoder
// writes map entries (a Struct's fields: dynamic metadata) in whatever
// order it ranges over the map, so two correct encodings of one answer
// may differ in byte order; nothing else about an answer may differ.
func normalise(t *testing.T, b []byte) []byte {
	t.Helper()
	var m extprocv3.ProcessingResponse
	if err := proto.Unmarshal(b, &m); err != nil {
		t.Errorf("an answer that is not a ProcessingResponse: %v", err)
		return b
	}
	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func describe(answers [][]byte) string {
	var sb strings.Builder
	for _, b := range answers {
		var m extprocv3.ProcessingResponse
		if err := proto.Unmarshal(b, &m); err != nil {
			fmt.Fprintf(&sb, "[undecodable %d bytes: %v] ", len(b), err)
			continue
		}
		s := m.String()
		if len(s) > 400 {
			s = s[:400] + "…"
		}
		fmt.Fprintf(&sb, "[%s] ", s)
	}
	return sb.String()
}
