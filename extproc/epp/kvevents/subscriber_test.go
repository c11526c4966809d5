package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

const wait = 5 * time.Second

// testPub is a zmq4 PUB socket, the publisher llm-d-inference-sim uses.
type testPub struct {
	sock zmq4.Socket
	addr string // tcp://127.0.0.1:port when bound
}

// boundPub binds a PUB on a free loopback port, vLLM's way.
func boundPub(t *testing.T) *testPub {
	t.Helper()
	return boundPubAt(t, "tcp://127.0.0.1:0")
}

func boundPubAt(t *testing.T, endpoint string) *testPub {
	t.Helper()
	sock := zmq4.NewPub(t.Context())
	if err := sock.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sock.Close() })
	return &testPub{sock: sock, addr: "tcp://" + sock.Addr().String()}
}

// dialPub dials a PUB to a bound subscriber, llm-d's way.
func dialPub(t *testing.T, addr net.Addr) *testPub {
	t.Helper()
	sock := zmq4.NewPub(t.Context())
	if err := sock.Dial("tcp://" + addr.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sock.Close() })
	return &testPub{sock: sock}
}

// sync sends batches of no events on topic, numbered from *seq on, one
// every 20ms until the subscriber gets one (a PUB drops what it sends
// before the subscription has arrived), and returns the batches that came.
func (p *testPub) sync(t *testing.T, got <-chan Batch, topic string, seq *uint64) []Batch {
	t.Helper()
	probe := batchOf(t)
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		p.send(t, topic, *seq, probe)
		*seq++
		select {
		case b := <-got:
			out := []Batch{b}
			for out[len(out)-1].Seq != *seq-1 { // those sent since come too
				out = append(out, next(t, got))
			}
			return out
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("no subscription")
	return nil
}

func (p *testPub) send(t *testing.T, topic string, seq uint64, payload []byte) {
	t.Helper()
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	if err := p.sock.Send(zmq4.NewMsgFrom([]byte(topic), s[:], payload)); err != nil {
		t.Fatal(err)
	}
}

// run starts a subscriber of cfg, whose Handler sends on the returned
// channel, until the test ends.
func run(t *testing.T, cfg Config) (*Subscriber, <-chan Batch) {
	t.Helper()
	got := make(chan Batch, 100)
	cfg.Handler = func(b Batch) { got <- b }
	cfg.Logger = testr.NewWithOptions(t, testr.Options{Verbosity: 1})
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 100*time.Millisecond
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Error("Run did not return")
		}
	})
	return s, got
}

func next(t *testing.T, got <-chan Batch) Batch {
	t.Helper()
	select {
	case b := <-got:
		return b
	case <-time.After(wait):
		t.Fatal("no batch")
		return Batch{}
	}
}

// none checks that no batch comes for a while.
func none(t *testing.T, got <-chan Batch) {
	t.Helper()
	select {
	case b := <-got:
		t.Fatalf("unexpected batch %+v", b)
	case <-time.After(50 * time.Millisecond):
	}
}

// eventually waits for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// value is a counter's or a gauge's value.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if c := d.GetCounter(); c != nil {
		return c.GetValue()
	}
	return d.GetGauge().GetValue()
}

// count is how many series c has.
func count(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 100)
	c.Collect(ch)
	close(ch)
	return len(ch)
}

func targets(ts ...string) chan []string {
	ch := make(chan []string, 1)
	ch <- ts
	return ch
}

// lagSamples is how many batches the lag histogram has seen.
func lagSamples(t *testing.T, m *metrics) uint64 {
	t.Helper()
	var d dto.Metric
	if err := m.lag.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleCount()
}

// Dial mode: gaps, old sequence numbers and malformed messages are
// counted, and the subscriber goes on.
func TestDialMode(t *testing.T) {
	pub := boundPub(t)
	s, got := run(t, Config{Targets: targets(pub.addr)})
	const topic = "kv@10.0.0.1:8000@m"
	seq := uint64(1)
	synced := len(pub.sync(t, got, topic, &seq))

	cleared := batchOf(t, []any{"AllBlocksCleared"})
	at := func(d uint64) uint64 { return seq + d }
	pub.send(t, topic, at(0), batchOf(t, stored(), []any{"BlockRemoved", []any{uint64(3)}}))
	pub.send(t, topic, at(1), cleared)
	pub.send(t, topic, at(4), cleared)                                                 // +2, +3 lost
	pub.send(t, topic, at(3), cleared)                                                 // old: dropped
	pub.send(t, topic, at(4), cleared)                                                 // again: dropped
	pub.send(t, topic, at(5), []byte("\x92\xa3bad"))                                   // malformed
	pub.send(t, topic, at(6), batchOf(t, []any{"Unheard"}, []any{"AllBlocksCleared"})) // +5 lost; one unknown event
	pub.send(t, topic, at(7), mp(t, []any{ts, make([]any, MaxEvents+1)}))              // oversized
	if err := pub.sock.Send(zmq4.NewMsgFrom([]byte(topic), []byte{9}, cleared)); err != nil {
		t.Fatal(err) // a 1-byte seq: malformed
	}
	pub.send(t, topic, at(8), cleared) // +7 lost

	for _, want := range []struct {
		seq, missed uint64
		events      int
	}{{at(0), 0, 2}, {at(1), 0, 1}, {at(4), 2, 1}, {at(6), 1, 1}, {at(8), 1, 1}} {
		b := next(t, got)
		if b.Source != pub.addr || b.Topic != topic || b.Seq != want.seq || b.Missed != want.missed || len(b.Events) != want.events || b.Restarted {
			t.Errorf("got %s %q seq %d missed %d, %d events; want seq %d missed %d, %d events",
				b.Source, b.Topic, b.Seq, b.Missed, len(b.Events), want.seq, want.missed, want.events)
		}
	}
	none(t, got)
	m := s.m
	for what, v := range map[string][2]float64{
		"gaps":         {value(m.gaps), 3},
		"old-seq":      {value(m.droppedBy[reasonOldSeq]), 2},
		"malformed":    {value(m.droppedBy[reasonMalformed]), 2},
		"oversized":    {value(m.droppedBy[reasonOversized]), 1},
		"unknown-type": {value(m.droppedBy[reasonUnknownType]), 1},
		"batches":      {value(m.batches.WithLabelValues(pub.addr)), float64(synced + 5)},
		"stored":       {value(m.eventsBy[BlockStored]), 1},
		"removed":      {value(m.eventsBy[BlockRemoved]), 1},
		"cleared":      {value(m.eventsBy[AllBlocksCleared]), 4},
		"connected":    {value(m.connected), 1},
		"known":        {value(m.known), 1},
		"restarts":     {value(m.restarts), 0},
		"lag samples":  {float64(lagSamples(t, m)), float64(synced + 5)},
	} {
		if v[0] != v[1] {
			t.Errorf("%s = %v, want %v", what, v[0], v[1])
		}
	}
}

// A publisher that restarts numbers its batches afresh: taken, and marked.
func TestPublisherRestart(t *testing.T) {
	pub := boundPub(t)
	s, got := run(t, Config{Targets: targets(pub.addr)})
	seq := uint64(100)
	pub.sync(t, got, "", &seq)

	// Restarted on the same port: a new connection, numbering from 1 (the
	// first few lost before the subscription).
	_ = pub.sock.Close()
	eventually(t, "disconnected", func() bool { return value(s.m.connected) == 0 })
	pub = boundPubAt(t, pub.addr)
	seq = 1
	bs := pub.sync(t, got, "", &seq)
	if b := bs[0]; b.Seq >= 100 || !b.Restarted || b.Missed != 0 {
		t.Errorf("after the restart: seq %d restarted %v missed %d", b.Seq, b.Restarted, b.Missed)
	}
	for _, b := range bs[1:] {
		if b.Restarted {
			t.Errorf("seq %d restarted", b.Seq)
		}
	}
	// vLLM numbers from 0: a 0 on the same connection is a restart too
	// (behind a proxy that kept the connection).
	pub.send(t, "", 0, batchOf(t))
	if b := next(t, got); b.Seq != 0 || !b.Restarted {
		t.Errorf("seq 0: seq %d restarted %v", b.Seq, b.Restarted)
	}
	if n := value(s.m.restarts); n != 2 {
		t.Errorf("%v restarts, want 2", n)
	}
}

// Bind mode: publishers dial in; each is named by its llm-d topic, or by
// its IP.
func TestBindMode(t *testing.T) {
	ln, err := Listen(t.Context(), "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, got := run(t, Config{Listener: ln})
	const topic = "kv@10.1.2.3:8000@llama"
	a, b := dialPub(t, ln.Addr()), dialPub(t, ln.Addr())
	aSeq, bSeq := uint64(100), uint64(1)
	if got := a.sync(t, got, topic, &aSeq)[0]; got.Source != "10.1.2.3:8000" || got.Topic != topic {
		t.Errorf("source %q topic %q", got.Source, got.Topic)
	}
	if got := b.sync(t, got, "", &bSeq)[0]; got.Source != "127.0.0.1" || got.Restarted {
		t.Errorf("source %q restarted %v", got.Source, got.Restarted)
	}
	if n := value(s.m.connected); n != 2 {
		t.Errorf("%v connected, want 2", n)
	}
	a.send(t, topic, aSeq-1, batchOf(t)) // a duplicate on the same connection
	none(t, got)
	if n := value(s.m.droppedBy[reasonOldSeq]); n != 1 {
		t.Errorf("old-seq %v, want 1", n)
	}
	// The same pod on a new connection, starting over: a restart.
	c := dialPub(t, ln.Addr())
	cSeq := uint64(1)
	if got := c.sync(t, got, topic, &cSeq)[0]; got.Source != "10.1.2.3:8000" || got.Seq >= aSeq || !got.Restarted {
		t.Errorf("source %q seq %d restarted %v", got.Source, got.Seq, got.Restarted)
	}
	// Data-parallel ranks number their batches apart.
	c.send(t, topic, 1, mp(t, []any{ts, []any{}, 1}))
	if got := next(t, got); got.DPRank != 1 || got.Restarted {
		t.Errorf("rank %d restarted %v", got.DPRank, got.Restarted)
	}
	if n := value(s.m.known); n != 3 {
		t.Errorf("%v publishers known, want 3", n)
	}
}

// Targets come and go while running; one that is down holds up no other,
// and is connected once it is up.
func TestTargetsChange(t *testing.T) {
	a, b := boundPub(t), boundPub(t)
	// A port nothing listens on, yet.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "tcp://" + l.Addr().String()
	_ = l.Close()

	set := make(chan []string)
	s, got := run(t, Config{Targets: set})
	set <- []string{down, a.addr, "http://not-zmq", "tcp://*:1"}
	aSeq, bSeq, cSeq := uint64(1), uint64(1), uint64(1)
	if got := a.sync(t, got, "", &aSeq)[0]; got.Source != a.addr {
		t.Errorf("source %q, want %q", got.Source, a.addr)
	}

	set <- []string{down, a.addr, b.addr} // b added
	if got := b.sync(t, got, "", &bSeq)[0]; got.Source != b.addr {
		t.Errorf("source %q, want %q", got.Source, b.addr)
	}
	if n := value(s.m.known); n != 2 {
		t.Errorf("%v known, want 2", n)
	}

	set <- []string{down, b.addr} // a removed: disconnected, forgotten
	eventually(t, "a disconnected", func() bool { return value(s.m.connected) == 1 })
	if n := value(s.m.known); n != 1 {
		t.Errorf("%v known, want 1", n)
	}
	if n := count(s.m.batches); n != 1 {
		t.Errorf("%d batch series, want 1 (b's)", n)
	}
	a.send(t, "", aSeq, batchOf(t))
	b.send(t, "", bSeq, batchOf(t))
	if got := next(t, got); got.Source != b.addr || got.Seq != bSeq {
		t.Errorf("source %q seq %d, want b's %d", got.Source, got.Seq, bSeq)
	}

	// The target that was down comes up, and is retried into.
	c := boundPubAt(t, down)
	if got := c.sync(t, got, "", &cSeq)[0]; got.Source != down {
		t.Errorf("source %q, want %q", got.Source, down)
	}

	set <- []string{a.addr} // a back, b and the other gone
	aSeq = 1
	if got := a.sync(t, got, "", &aSeq)[0]; got.Source != a.addr || got.Restarted || got.Missed != 0 {
		t.Errorf("a again: source %q restarted %v missed %d: its past was not forgotten", got.Source, got.Restarted, got.Missed)
	}
	eventually(t, "only a connected", func() bool { return value(s.m.connected) == 1 })
}

// A message over MaxMessageBytes closes the connection (zmq4 would
// allocate whatever a frame declares); the dialer reconnects.
func TestOversizedMessage(t *testing.T) {
	pub := boundPub(t)
	s, got := run(t, Config{Targets: targets(pub.addr), MaxMessageBytes: 1024})
	seq := uint64(1)
	pub.sync(t, got, "", &seq)
	pub.send(t, "", seq, make([]byte, 2000))
	eventually(t, "oversized counted", func() bool { return value(s.m.droppedBy[reasonOversized]) == 1 })
	seq++
	if b := pub.sync(t, got, "", &seq)[0]; b.Missed == 0 {
		t.Error("the oversized batch is not missed")
	}
}

// greeting is a ZMTP 3.0 NULL greeting.
func greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	return g
}

// Hostile peers in bind mode: frames declaring 2^62 bytes, before and after
// the handshake, reserved flags, garbage. None takes the process down; the
// subscriber goes on.
func TestHostilePeers(t *testing.T) {
	ln, err := Listen(t.Context(), "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, got := run(t, Config{Listener: ln})
	for name, send := range map[string][]byte{
		"huge command in the handshake": append(greeting(), flagLong|flagCommand, 0x40, 0, 0, 0, 0, 0, 0, 0),
		"reserved flags":                append(greeting(), 0x80, 1, 0),
		"garbage":                       []byte(strings.Repeat("GET / HTTP/1.1\r\n", 10)),
	} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(send); err != nil {
			t.Fatal(name, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: the connection was not closed", name)
		}
		_ = c.Close()
	}
	// A peer that completes the handshake as a PUB, then declares a frame
	// of 2^62 bytes.
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	zc, err := zmq4.Open(nc, null.Security(), zmq4.Pub, nil, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zc.RecvMsg(); err != nil { // the subscription
		t.Fatal(err)
	}
	if _, err := nc.Write([]byte{flagLong, 0x40, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "oversized counted", func() bool { return value(s.m.droppedBy[reasonOversized]) == 2 })

	// And the subscriber still works.
	pub := dialPub(t, ln.Addr())
	seq := uint64(1)
	pub.sync(t, got, "", &seq)
}

// The messages captured from llm-d-inference-sim, published again, come
// out whole and in order.
func TestCapturedSimulatorReplay(t *testing.T) {
	for _, format := range []string{"array", "map"} {
		t.Run(format, func(t *testing.T) {
			msgs := readCapture(t, format)
			ln, err := Listen(t.Context(), "tcp://127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			s, got := run(t, Config{Listener: ln, Topic: "kv@"})
			pub := dialPub(t, ln.Addr())
			seq := uint64(1)
			pub.sync(t, got, "kv@probe@x", &seq)   // its own publisher
			pub.send(t, "not-kv", 100, batchOf(t)) // not subscribed to
			for _, m := range msgs {
				if err := pub.sock.Send(zmq4.NewMsgFrom(m.frames...)); err != nil {
					t.Fatal(err)
				}
			}
			pod := strings.Split(msgs[0].Topic, "@")[1]
			events := 0
			for i := range msgs {
				b := next(t, got)
				if b.Seq != uint64(i+1) || b.Source != pod || b.Missed != 0 || b.Restarted {
					t.Errorf("batch %d: seq %d from %q, missed %d, restarted %v", i, b.Seq, b.Source, b.Missed, b.Restarted)
				}
				events += len(b.Events)
			}
			none(t, got)
			if events != 18 {
				t.Errorf("%d events, want 18", events)
			}
			if n := value(s.m.batches.WithLabelValues(pod)); n != 7 {
				t.Errorf("%v batches from %s, want 7", n, pod)
			}
			for r, c := range s.m.droppedBy {
				if value(c) != 0 {
					t.Errorf("%v dropped as %s", value(c), r)
				}
			}
		})
	}
}

// The subscriber registers as a collector of its series.
func TestCollector(t *testing.T) {
	s, err := New(Config{Targets: make(chan []string), Handler: func(Batch) {}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(s); err != nil {
		t.Fatal(err)
	}
	s.m.batches.WithLabelValues("tcp://10.0.0.1:5557").Inc()
	s.m.lag.Observe(0.01)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	want := "infergate_epp_kv_events_batches_total infergate_epp_kv_events_dropped_total infergate_epp_kv_events_gaps_total infergate_epp_kv_events_lag_seconds " +
		"infergate_epp_kv_events_publisher_restarts_total infergate_epp_kv_events_publishers infergate_epp_kv_events_total"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("series\n got %s\nwant %s", got, want)
	}
	// A second subscriber's series go in another registry: no global state.
	s2, _ := New(Config{Targets: make(chan []string), Handler: func(Batch) {}})
	if err := prometheus.NewPedanticRegistry().Register(s2); err != nil {
		t.Fatal(err)
	}
}

func TestConfig(t *testing.T) {
	h := func(Batch) {}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Targets: make(chan []string)}, "no Handler"},
		{Config{Handler: h}, "neither Targets nor Listener"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want %q", tc.cfg, err, tc.want)
		}
	}
	for endpoint, want := range map[string]string{
		"tcp://127.0.0.1:5557": "127.0.0.1:5557",
		"tcp://*:5557":         ":5557",
		"tcp://[::1]:5557":     "[::1]:5557",
		"ipc:///tmp/x":         "want tcp://host:port",
		"tcp://127.0.0.1":      "missing port",
		"tcp://127.0.0.1:http": "bad port",
		"tcp://:5557":          "", // every interface, to listen on
	} {
		got, err := tcpAddr(endpoint, true)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, want) {
			t.Errorf("tcpAddr(%q) = %q, want %q", endpoint, got, want)
		}
	}
	for _, bad := range []string{"tcp://*:5557", "tcp://:5557", "tcp://10.0.0.1:0"} {
		if _, err := tcpAddr(bad, false); err == nil {
			t.Errorf("target %q accepted", bad)
		}
	}
}

// Past MaxPublishers, the publisher heard from least recently is
// forgotten: pods come and go, and their successors must not be refused.
func TestMaxPublishers(t *testing.T) {
	ln, err := Listen(t.Context(), "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, got := run(t, Config{Listener: ln, MaxPublishers: 2})
	pub := dialPub(t, ln.Addr())
	seq := uint64(10)
	pub.sync(t, got, "kv@pod-a@m", &seq)
	for _, pod := range []string{"pod-b", "pod-c"} {
		pub.send(t, "kv@"+pod+"@m", 10, batchOf(t))
		if b := next(t, got); b.Source != pod {
			t.Errorf("source %q, want %s", b.Source, pod)
		}
	}
	if n, series := value(s.m.known), count(s.m.batches); n != 2 || series != 2 {
		t.Errorf("%v known, %d batch series; want 2, 2", n, series)
	}
	// pod-a was forgotten: an old number from it is news, not a duplicate.
	pub.send(t, "kv@pod-a@m", 1, batchOf(t))
	if b := next(t, got); b.Source != "pod-a" || b.Restarted {
		t.Errorf("source %q restarted %v", b.Source, b.Restarted)
	}
	if n := value(s.m.droppedBy[reasonOldSeq]); n != 0 {
		t.Errorf("%v old-seq", n)
	}
}

// A Listener closed under Run stops it with an error.
func TestListenerClosed(t *testing.T) {
	ln, err := Listen(t.Context(), "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Listener: ln, Handler: func(Batch) {}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(t.Context()) }()
	time.Sleep(20 * time.Millisecond)
	_ = ln.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Run: %v, want net.ErrClosed", err)
		}
	case <-time.After(wait):
		t.Fatal("Run did not return")
	}
}
