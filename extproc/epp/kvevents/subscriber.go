package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// Defaults of Config.
const (
	DefaultMaxMessageBytes = 16 << 20
	DefaultMaxPublishers   = 1024
	DefaultMinBackoff      = 250 * time.Millisecond
	DefaultMaxBackoff      = 30 * time.Second
)

const (
	// handshakeTimeout bounds a TCP connect and the ZMTP handshake, so
	// that a peer that accepts and says nothing does not hold a dialer.
	handshakeTimeout = 10 * time.Second
	// maxTopicBytes bounds a topic, which may become a Source.
	maxTopicBytes = 1024
	// queued is how many received batches wait for the handler before the
	// connections stop reading: TCP then pushes back on the publishers,
	// whose ZeroMQ queues drop what is over their high-water mark, which
	// shows here as gaps.
	queued = 256
)

// Config configures a Subscriber: dial mode (Targets), bind mode
// (Listener), or both.
type Config struct {
	// Targets gives the publishers to dial, tcp://host:port, vLLM's way
	// (its publisher binds, tcp://*:5557 by default): each value received
	// replaces the whole set. A target added is dialled at once; one
	// removed is disconnected and its sequence forgotten; one down is
	// retried with backoff, apart from the others.
	Targets <-chan []string
	// Listener, if set, takes the connections of publishers that dial the
	// subscriber, llm-d's way (llm-d-inference-sim always dials its
	// --zmq-endpoint). Run closes it. See Listen.
	Listener net.Listener
	// Topic is the subscription, a topic prefix; "" takes every topic. The
	// publisher applies it.
	Topic string
	// Handler is given each batch taken, in order per publisher (Source and
	// DPRank), from one goroutine: while it runs no other batch is handled,
	// so it should be quick. It owns the batch.
	Handler func(Batch)
	Logger  logr.Logger
	// MaxMessageBytes bounds a message, all its frames; a connection that
	// sends a larger one is closed. DefaultMaxMessageBytes if 0.
	MaxMessageBytes int64
	// MaxPublishers bounds the publishers (Source, DPRank) whose sequence
	// is tracked, and so the source label of the batches counter: past it,
	// the one heard from least recently is forgotten (pods come and go, and
	// in bind mode anyone may connect and name itself). It also bounds the
	// connections taken in bind mode. DefaultMaxPublishers if 0.
	MaxPublishers int
	// MinBackoff and MaxBackoff bound the wait before redialling a target;
	// it doubles from one failure to the next, and starts again from
	// MinBackoff after a connection that lasted MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
}

// Subscriber receives KV events. It is a prometheus.Collector of its
// series, for the caller to register.
type Subscriber struct {
	cfg      Config
	log      logr.Logger
	m        *metrics
	items    chan item
	nextConn atomic.Uint64
}

// New validates cfg and applies its defaults.
func New(cfg Config) (*Subscriber, error) {
	if cfg.Handler == nil {
		return nil, errors.New("kvevents: no Handler")
	}
	if cfg.Targets == nil && cfg.Listener == nil {
		return nil, errors.New("kvevents: neither Targets nor Listener")
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.MaxPublishers <= 0 {
		cfg.MaxPublishers = DefaultMaxPublishers
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.MinBackoff)
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = logr.Discard()
	}
	return &Subscriber{
		cfg:   cfg,
		log:   cfg.Logger.WithName("kvevents"),
		m:     newMetrics(),
		items: make(chan item, queued),
	}, nil
}

// Listen opens a listener for bind mode on a ZeroMQ endpoint,
// tcp://host:port, where a host of * is every interface.
func Listen(ctx context.Context, endpoint string) (net.Listener, error) {
	addr, err := tcpAddr(endpoint, true)
	if err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("kvevents: listen on %s: %w", endpoint, err)
	}
	return ln, nil
}

// tcpAddr is the host:port of a tcp:// endpoint.
func tcpAddr(endpoint string, wildcard bool) (string, error) {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("kvevents: endpoint %q: want tcp://host:port", endpoint)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("kvevents: endpoint %q: %w", endpoint, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || (p == 0 && !wildcard) {
		return "", fmt.Errorf("kvevents: endpoint %q: bad port", endpoint)
	}
	switch {
	case host == "*" && wildcard:
		host = ""
	case host == "" || host == "*":
		return "", fmt.Errorf("kvevents: endpoint %q: no host", endpoint)
	}
	return net.JoinHostPort(host, port), nil
}

// Run receives until ctx is done, then closes every connection (and the
// Listener) and returns nil; or returns an error if the Listener was closed
// under it. It is called once.
func (s *Subscriber) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	acceptErr := make(chan error, 1)
	if s.cfg.Listener != nil {
		wg.Go(func() { acceptErr <- s.accept(ctx, &wg) })
	}
	d := &dispatcher{s: s, wg: &wg, dialers: map[string]*dialer{}, states: map[stream]*seqState{}}
	return d.run(ctx, acceptErr)
}

// accept takes the connections of publishers that dial in.
func (s *Subscriber) accept(ctx context.Context, wg *sync.WaitGroup) error {
	ln := s.cfg.Listener
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	s.log.Info("listening for publishers", "address", ln.Addr().String())
	var active atomic.Int64
	var pause time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("kvevents: accept: %w", err)
			}
			// Out of file descriptors and the like: it may pass, and
			// retrying at once would spin.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			s.log.Error(err, "accepting a publisher", "retryIn", pause)
			if !sleep(ctx, pause) {
				return nil
			}
			continue
		}
		pause = 0
		if active.Load() >= int64(s.cfg.MaxPublishers) {
			_ = nc.Close()
			s.m.droppedBy[reasonTooMany].Inc()
			continue
		}
		active.Add(1)
		wg.Go(func() {
			defer active.Add(-1)
			peer := nc.RemoteAddr().String()
			_, err := s.serve(ctx, nc, true, "", nil)
			if ctx.Err() == nil {
				s.log.V(1).Info("publisher disconnected", "peer", peer, "reason", err)
			}
		})
	}
}

// dialer runs the connections to one target.
type dialer struct {
	target string
	cancel context.CancelFunc
}

// dial connects to target until ctx is done, reconnecting with backoff.
func (s *Subscriber) dial(ctx context.Context, d *dialer, addr string) {
	backoff := s.cfg.MinBackoff
	failures := 0
	for {
		start := time.Now()
		up, err := s.dialOnce(ctx, d, addr)
		if ctx.Err() != nil {
			return
		}
		if up && time.Since(start) >= s.cfg.MaxBackoff {
			backoff = s.cfg.MinBackoff
		}
		if up {
			failures = 0
			s.log.Info("publisher disconnected", "target", d.target, "reason", err)
		} else {
			failures++
			// The first failure of a run is worth seeing; a target that
			// stays down would fill the log.
			log := s.log.V(1)
			if failures == 1 {
				log = s.log
			}
			log.Info("cannot connect to publisher", "target", d.target, "failures", failures, "retryIn", backoff, "reason", err)
		}
		// Jitter spreads the reconnections of many subscribers to one
		// restarted publisher.
		if !sleep(ctx, backoff/2+rand.N(backoff/2+1)) {
			return
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
}

// dialOnce makes one connection to d's target and serves it; up tells
// whether the ZMTP handshake succeeded.
func (s *Subscriber) dialOnce(ctx context.Context, d *dialer, addr string) (up bool, err error) {
	nd := net.Dialer{Timeout: handshakeTimeout}
	nc, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false, err
	}
	return s.serve(ctx, nc, false, d.target, d)
}

// serve runs one ZMTP connection, as the SUB side, until it fails or ctx
// is done. zmq4 is used for ZMTP (its Conn), not for the socket: its SUB
// socket cannot tell which peer a message came from, nor bound what a peer
// makes it allocate, nor stop a dial in progress.
func (s *Subscriber) serve(ctx context.Context, nc net.Conn, server bool, target string, owner *dialer) (up bool, err error) {
	defer func() { _ = nc.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer stop()
	id := s.nextConn.Add(1)
	ip := ""
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		ip = a.IP.String()
	}
	_ = nc.SetDeadline(time.Now().Add(handshakeTimeout))
	zc, err := zmq4.Open(newFrameGuard(nc, s.cfg.MaxMessageBytes), null.Security(), zmq4.Sub, nil, server, nil)
	if err != nil {
		if isOversized(err) {
			s.send(ctx, item{conn: id, owner: owner, source: target, reason: reasonOversized, err: err})
		}
		return false, fmt.Errorf("ZMTP handshake: %w", err)
	}
	if err := zc.SendMsg(zmq4.NewMsg(append([]byte{1}, s.cfg.Topic...))); err != nil {
		return false, fmt.Errorf("subscribe: %w", err)
	}
	_ = nc.SetDeadline(time.Time{})
	s.m.connected.Inc()
	defer s.m.connected.Dec()
	if target != "" {
		s.log.Info("publisher connected", "target", target)
	} else {
		s.log.V(1).Info("publisher connected", "peer", nc.RemoteAddr().String())
	}
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			if isOversized(err) {
				s.send(ctx, item{conn: id, owner: owner, source: target, reason: reasonOversized, err: err})
			}
			return true, err
		}
		if msg.Type == zmq4.CmdMsg { // a PING (answered by zmq4) or the like
			continue
		}
		if !s.send(ctx, s.message(id, owner, target, ip, msg.Frames)) {
			return true, ctx.Err()
		}
	}
}

// message decodes one message into an item for the dispatcher.
func (s *Subscriber) message(id uint64, owner *dialer, target, ip string, frames [][]byte) item {
	it := item{conn: id, owner: owner, source: target, recv: time.Now()}
	if len(frames) != 3 || len(frames[1]) != 8 || len(frames[0]) > maxTopicBytes {
		it.reason = reasonMalformed
		it.err = fmt.Errorf("message of %d frames: want [topic of at most %d bytes, 8-byte seq, payload]", len(frames), maxTopicBytes)
		return it
	}
	it.topic = string(frames[0])
	if it.source == "" {
		it.source = sourceOf(it.topic, ip)
	}
	it.seq = binary.BigEndian.Uint64(frames[1])
	it.batch, it.err = Decode(frames[2])
	switch {
	case errors.Is(it.err, ErrTooLarge):
		it.reason = reasonOversized
	case it.err != nil:
		it.reason = reasonMalformed
	}
	return it
}

// sourceOf names the publisher of a bound connection: the pod of an llm-d
// topic, kv@<pod>@<model>, which stays the same across reconnections, else
// the peer's IP. Other topics are not used: vLLM's default is "" and one
// topic is often set for every pod.
func sourceOf(topic, ip string) string {
	if rest, ok := strings.CutPrefix(topic, "kv@"); ok {
		if pod, _, ok := strings.Cut(rest, "@"); ok && pod != "" {
			return pod
		}
	}
	return ip
}

// send queues it for the dispatcher, or gives up when ctx is done.
func (s *Subscriber) send(ctx context.Context, it item) bool {
	select {
	case s.items <- it:
		return true
	case <-ctx.Done():
		return false
	}
}

// item is a received message, decoded or not.
type item struct {
	conn   uint64  // the connection, for telling restarts from duplicates
	owner  *dialer // the dialer of a dialled connection
	source string
	topic  string
	seq    uint64
	recv   time.Time
	batch  Batch
	reason string // why the message is dropped, with err
	err    error
}

// stream is one publisher: each data-parallel rank numbers its batches.
type stream struct {
	source string
	rank   int
}

type seqState struct {
	last uint64    // seq of the last batch taken
	conn uint64    // the connection it came on
	seen time.Time // when
}

// dispatcher owns the dialers and the sequence state, on one goroutine,
// and calls the handler.
type dispatcher struct {
	s       *Subscriber
	wg      *sync.WaitGroup
	dialers map[string]*dialer
	states  map[stream]*seqState
}

func (d *dispatcher) run(ctx context.Context, acceptErr <-chan error) error {
	targets := d.s.cfg.Targets
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-acceptErr:
			if err != nil {
				return err
			}
			acceptErr = nil
		case set, ok := <-targets:
			if !ok { // the set stays as it is
				targets = nil
				continue
			}
			d.setTargets(ctx, set)
		case it := <-d.s.items:
			d.take(it)
		}
	}
}

// setTargets dials the targets new in set and drops those not in it.
func (d *dispatcher) setTargets(ctx context.Context, set []string) {
	want := map[string]string{}
	for _, t := range set {
		addr, err := tcpAddr(t, false)
		if err != nil {
			d.s.log.Error(err, "ignoring target")
			continue
		}
		want[t] = addr
	}
	for t, dl := range d.dialers {
		if _, ok := want[t]; ok {
			continue
		}
		dl.cancel()
		delete(d.dialers, t)
		d.forget(t)
		d.s.log.Info("target removed", "target", t)
	}
	for _, t := range slices.Sorted(maps.Keys(want)) {
		if _, ok := d.dialers[t]; ok {
			continue
		}
		dctx, cancel := context.WithCancel(ctx)
		dl := &dialer{target: t, cancel: cancel}
		d.dialers[t] = dl
		addr := want[t]
		d.wg.Go(func() { d.s.dial(dctx, dl, addr) })
		d.s.log.Info("target added", "target", t)
	}
}

// forget drops what is known of source: a target removed and added back
// later starts afresh.
func (d *dispatcher) forget(source string) {
	for k := range d.states {
		if k.source == source {
			delete(d.states, k)
		}
	}
	d.s.m.batches.DeleteLabelValues(source)
	d.s.m.known.Set(float64(len(d.states)))
}

// forgetOldest forgets the source heard from least recently, to make room.
// A scan, but only when a new publisher comes and the table is full.
func (d *dispatcher) forgetOldest() {
	var oldest stream
	var at time.Time
	for k, st := range d.states {
		if at.IsZero() || st.seen.Before(at) {
			oldest, at = k, st.seen
		}
	}
	d.s.log.V(1).Info("forgetting publisher", "source", oldest.source, "lastHeard", at)
	d.forget(oldest.source)
}

// take checks a received message's sequence and hands its batch over.
//
// Per publisher, a batch is taken if its seq is after the last one taken
// (a jump counts as a gap, Batch.Missed). A seq at or before it is a
// publisher restart when it came on another connection than the last
// batch (a restarted process has a new connection, and may have sent
// batches before this subscriber reconnected, so no particular number is
// expected), or when it is 0 or 1 (vLLM numbers from 0,
// llm-d-inference-sim from 1: a restart behind a proxy that kept the
// connection). Otherwise it is a duplicate or out of order, and dropped:
// one TCP stream neither reorders nor repeats.
func (d *dispatcher) take(it item) {
	m := d.s.m
	if it.owner != nil && d.dialers[it.source] != it.owner {
		return // from a target since removed
	}
	if it.err != nil {
		m.droppedBy[it.reason].Inc()
		d.s.log.V(1).Info("dropping message", "source", it.source, "topic", it.topic, "seq", it.seq, "reason", it.err)
		return
	}
	b := it.batch
	b.Source, b.Topic, b.Seq = it.source, it.topic, it.seq
	key := stream{b.Source, b.DPRank}
	st, ok := d.states[key]
	switch {
	case !ok:
		if len(d.states) >= d.s.cfg.MaxPublishers {
			d.forgetOldest()
		}
		st = &seqState{}
		d.states[key] = st
		m.known.Set(float64(len(d.states)))
	case it.seq > st.last:
		if b.Missed = it.seq - st.last - 1; b.Missed > 0 {
			m.gaps.Inc()
			d.s.log.V(1).Info("batches lost", "source", b.Source, "rank", b.DPRank, "after", st.last, "seq", it.seq)
		}
	case it.conn != st.conn || (it.seq <= 1 && it.seq < st.last):
		b.Restarted = true
		m.restarts.Inc()
		d.s.log.Info("publisher restarted", "source", b.Source, "rank", b.DPRank, "lastSeq", st.last, "seq", it.seq)
	default:
		m.droppedBy[reasonOldSeq].Inc()
		d.s.log.V(1).Info("dropping old batch", "source", b.Source, "rank", b.DPRank, "lastSeq", st.last, "seq", it.seq)
		return
	}
	st.last, st.conn, st.seen = it.seq, it.conn, it.recv

	m.batches.WithLabelValues(b.Source).Inc()
	for _, e := range b.Events {
		m.eventsBy[e.Kind].Inc()
	}
	if b.Unknown > 0 {
		m.droppedBy[reasonUnknownType].Add(float64(b.Unknown))
	}
	if b.Time.After(time.Unix(0, 0)) { // a ts of 0 says nothing
		m.lag.Observe(max(0, it.recv.Sub(b.Time).Seconds()))
	}
	d.s.cfg.Handler(b)
}

// sleep waits for d or ctx, and tells whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
