// Package peers lets the endpoint picker's replicas run active-active: each
// tells the others the routing decisions it makes, so every replica's prefix
// index, calibration and load estimate learn from all the pool's traffic, as
// one replica would; a replica that starts or comes back is given the
// others' learned state when it joins.
//
// Membership, failure detection and the state given on joining are
// hashicorp/memberlist's (SWIM gossip, as in Consul, Nomad, Loki and
// Mimir). Decisions are batched every flush interval and sent to each live
// peer as memberlist user messages: over UDP when a batch fits a packet,
// over TCP when it does not. Nothing here is on a decision's path: Share
// appends to a bounded queue and returns; a replica cut off from the others
// keeps routing on what it knows, and drops (and counts) what it could not
// send.
package peers

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/memberlist"

	"github.com/infergate/infergate/extproc/epp/scheduling"
)

// Local is the picker as its peers reach it.
type Local interface {
	PeerPicked(d scheduling.Shared)
	AppendState(dst []byte) []byte
	MergeState(b []byte) error
}

// Config configures a replica's membership.
type Config struct {
	// Bind is host:port for memberlist's TCP and UDP listeners; port 0
	// takes a free one.
	Bind string
	// Advertise is host:port the others reach this replica at; empty
	// means Bind's (with an unspecified host, memberlist picks a private
	// address of this host).
	Advertise string
	// Join lists peers as host:port; a DNS name (a headless Service)
	// joins every address it resolves to.
	Join []string
	// Name is this replica's unique name (the Pod's); empty means the
	// host name and a random suffix.
	Name string
	// SecretKey, 16, 24 or 32 bytes, encrypts all traffic between
	// replicas (AES-GCM, memberlist's keyring); empty sends it in clear.
	SecretKey []byte
	// FlushInterval is how often queued decisions are sent (10 ms).
	FlushInterval time.Duration
	// RejoinInterval is how often a replica without peers tries Join
	// again (5 s), so a partition or a peer's restart heals.
	RejoinInterval time.Duration
	// MaxQueued bounds the decisions waiting to be sent, and the batches
	// waiting per peer (4096).
	MaxQueued int
}

func (c *Config) defaults() {
	if c.FlushInterval <= 0 {
		c.FlushInterval = 10 * time.Millisecond
	}
	if c.RejoinInterval <= 0 {
		c.RejoinInterval = 5 * time.Second
	}
	if c.MaxQueued <= 0 {
		c.MaxQueued = 4096
	}
}

// Node is one replica's membership.
type Node struct {
	cfg   Config
	name  string
	ml    *memberlist.Memberlist
	local Local
	log   logr.Logger
	m     *metrics

	mu      sync.Mutex
	queue   []scheduling.Shared
	senders map[string]*sender

	cancel context.CancelFunc
	done   chan struct{}
}

// Start joins the replica to its peers (alone when none answers yet; it
// keeps trying) and starts sending. Stop leaves.
func Start(ctx context.Context, cfg Config, local Local, logger logr.Logger) (*Node, error) {
	cfg.defaults()
	host, port, err := splitHostPort(cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("peers: bind address %q: %w", cfg.Bind, err)
	}
	mc := memberlist.DefaultLANConfig()
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertisePort = port
	if cfg.Advertise != "" {
		ah, ap, err := splitHostPort(cfg.Advertise)
		if err != nil {
			return nil, fmt.Errorf("peers: advertise address %q: %w", cfg.Advertise, err)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = ah, ap
	} else if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		mc.AdvertiseAddr = host
	}
	if len(cfg.SecretKey) > 0 {
		if err := memberlist.ValidateKey(cfg.SecretKey); err != nil {
			return nil, fmt.Errorf("peers: secret key: %w", err)
		}
		mc.SecretKey = cfg.SecretKey
	}
	// State is exchanged when a replica joins, not periodically: decisions
	// keep the replicas in step, and a periodic full exchange of every
	// replica's index would cost far more than it corrects.
	mc.PushPullInterval = 0
	// A peer that does not accept a connection within a second is
	// treated as down for that send; memberlist's probes decide whether
	// it is.
	mc.TCPTimeout = time.Second
	mc.Logger = log.New(&logWriter{log: logger}, "", 0)
	n := &Node{cfg: cfg, local: local, log: logger, m: newMetrics(), senders: map[string]*sender{}, done: make(chan struct{})}
	mc.Delegate = (*delegate)(n)
	mc.Events = (*events)(n)
	mc.Name = cfg.Name
	if mc.Name == "" {
		// memberlist names a node by its host name; two replicas on one
		// host (tests, or a restart before the old name is reclaimed)
		// would clash.
		host, _ := os.Hostname()
		var r [4]byte
		_, _ = rand.Read(r[:])
		mc.Name = fmt.Sprintf("%s-%x", host, r)
	}
	n.name = mc.Name
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("peers: %w", err)
	}
	n.ml = ml
	ctx, n.cancel = context.WithCancel(ctx)
	n.join()
	go n.run(ctx)
	return n, nil
}

// Addr is the host:port the others reach this replica at.
func (n *Node) Addr() string { return n.ml.LocalNode().Address() }

// Name is this replica's name among its peers.
func (n *Node) Name() string { return n.ml.LocalNode().Name }

// Peers is how many other replicas are alive.
func (n *Node) Peers() int { return n.ml.NumMembers() - 1 }

// Share queues a decision for the peers; it never blocks. With the queue
// full the oldest decision is dropped and counted.
func (n *Node) Share(d scheduling.Shared) {
	n.mu.Lock()
	if len(n.queue) >= n.cfg.MaxQueued {
		n.queue = n.queue[1:]
		n.m.dropped.WithLabelValues(dropQueueFull).Inc()
	}
	n.queue = append(n.queue, d)
	n.mu.Unlock()
}

// Stop tells the peers this replica is leaving and stops it.
func (n *Node) Stop() {
	n.cancel()
	<-n.done
	_ = n.ml.Leave(time.Second)
	_ = n.ml.Shutdown()
}

func (n *Node) join() {
	if len(n.cfg.Join) == 0 {
		return
	}
	joined, err := n.ml.Join(n.cfg.Join)
	if err != nil {
		n.log.V(1).Info("no peer answered yet; routing alone until one does", "join", n.cfg.Join, "error", err.Error())
		return
	}
	n.log.Info("joined the picker's peers", "contacted", joined, "peers", n.Peers())
}

func (n *Node) run(ctx context.Context) {
	defer close(n.done)
	flush := time.NewTicker(n.cfg.FlushInterval)
	defer flush.Stop()
	rejoin := time.NewTicker(n.cfg.RejoinInterval)
	defer rejoin.Stop()
	defer n.stopSenders()
	for {
		select {
		case <-ctx.Done():
			return
		case <-flush.C:
			n.flush()
		case <-rejoin.C:
			if n.Peers() == 0 {
				n.join()
			}
		}
	}
}

// flush encodes the queued decisions once and hands the batch to every
// live peer's sender.
func (n *Node) flush() {
	n.mu.Lock()
	queued := n.queue
	n.queue = nil
	n.mu.Unlock()
	live := n.reconcileSenders()
	if len(queued) == 0 || len(live) == 0 {
		return
	}
	for len(queued) > 0 {
		batch, rest := encodeBatch(queued, time.Now(), maxBatchBytes)
		queued = rest
		for _, s := range live {
			s.enqueue(batch, n.m)
		}
		n.m.decisionsSent.Add(float64(len(live)) * float64(countOf(batch)))
	}
}

// maxBatchBytes bounds one message; memberlist reads a TCP user message
// of any size, but a bounded one keeps a peer's receive bounded too.
const maxBatchBytes = 1 << 20

// reconcileSenders starts a sender for each live peer without one and
// stops those of peers gone, returning the live ones.
func (n *Node) reconcileSenders() []*sender {
	self := n.ml.LocalNode().Name
	alive := map[string]*memberlist.Node{}
	for _, m := range n.ml.Members() {
		if m.Name != self {
			alive[m.Name] = m
		}
	}
	n.m.peers.Set(float64(len(alive)))
	live := make([]*sender, 0, len(alive))
	for name, s := range n.senders {
		if alive[name] == nil {
			s.stop()
			delete(n.senders, name)
		}
	}
	for name, node := range alive {
		s := n.senders[name]
		if s == nil {
			s = newSender(n.ml, node, n.cfg.MaxQueued, n.m)
			n.senders[name] = s
		}
		live = append(live, s)
	}
	return live
}

func (n *Node) stopSenders() {
	for name, s := range n.senders {
		s.stop()
		delete(n.senders, name)
	}
}

// sender sends one peer its batches in order, so that a slow or
// unreachable peer delays no other.
type sender struct {
	ml   *memberlist.Memberlist
	node *memberlist.Node
	ch   chan []byte
	done chan struct{}
}

func newSender(ml *memberlist.Memberlist, node *memberlist.Node, depth int, m *metrics) *sender {
	s := &sender{ml: ml, node: node, ch: make(chan []byte, max(depth/64, 16)), done: make(chan struct{})}
	go s.run(m)
	return s
}

func (s *sender) enqueue(batch []byte, m *metrics) {
	select {
	case s.ch <- batch:
	default:
		m.dropped.WithLabelValues(dropPeerBehind).Add(float64(countOf(batch)))
	}
}

func (s *sender) run(m *metrics) {
	defer close(s.done)
	for b := range s.ch {
		transport, send := "tcp", s.ml.SendReliable
		if len(b) <= udpPayload {
			transport, send = "udp", s.ml.SendBestEffort
		}
		if err := send(s.node, b); err != nil {
			m.dropped.WithLabelValues(dropSendFailed).Add(float64(countOf(b)))
			continue
		}
		m.messages.WithLabelValues("sent", transport).Inc()
		m.bytes.WithLabelValues("sent").Add(float64(len(b)))
	}
}

func (s *sender) stop() {
	close(s.ch)
	<-s.done
}

// udpPayload is the largest batch sent over UDP: memberlist's packet
// buffer (1,400 bytes) less its headers and the encryption's overhead.
const udpPayload = 1400 - 100

// delegate is the Node as memberlist calls it.
type delegate Node

func (d *delegate) NodeMeta(int) []byte { return nil }

func (d *delegate) NotifyMsg(b []byte) {
	n := (*Node)(d)
	n.m.messages.WithLabelValues("received", "any").Inc()
	n.m.bytes.WithLabelValues("received").Add(float64(len(b)))
	sent, decisions, err := decodeBatch(b)
	if err != nil {
		n.m.dropped.WithLabelValues(dropMalformed).Inc()
		n.log.V(1).Info("dropped a malformed message from a peer", "error", err.Error())
		return
	}
	n.m.lag.Observe(max(time.Since(sent), 0).Seconds())
	n.m.decisionsReceived.Add(float64(len(decisions)))
	for _, dec := range decisions {
		n.local.PeerPicked(dec)
	}
}

func (d *delegate) GetBroadcasts(int, int) [][]byte { return nil }

// LocalState gives this replica's learned state to a replica that joins.
func (d *delegate) LocalState(join bool) []byte {
	n := (*Node)(d)
	b := n.local.AppendState(nil)
	n.m.stateBytes.WithLabelValues("sent").Add(float64(len(b)))
	return b
}

// MergeRemoteState merges a peer's state: it fills this replica's gaps
// and never evicts what it learned itself.
func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	n := (*Node)(d)
	n.m.stateBytes.WithLabelValues("received").Add(float64(len(buf)))
	if len(buf) == 0 {
		return
	}
	if err := n.local.MergeState(buf); err != nil {
		n.m.merges.WithLabelValues("error").Inc()
		n.log.Error(err, "a peer's state could not be merged; this replica keeps learning from decisions")
		return
	}
	n.m.merges.WithLabelValues("ok").Inc()
}

// events logs membership changes.
type events Node

func (e *events) NotifyJoin(m *memberlist.Node) {
	if m.Name != (*Node)(e).name {
		(*Node)(e).log.Info("peer joined", "peer", m.Name, "address", m.Address())
	}
}

func (e *events) NotifyLeave(m *memberlist.Node) {
	(*Node)(e).log.Info("peer left or failed", "peer", m.Name, "address", m.Address())
}

func (e *events) NotifyUpdate(*memberlist.Node) {}

// logWriter passes memberlist's log lines on to logr: warnings and errors
// at info, the rest at V(2).
type logWriter struct{ log logr.Logger }

func (w *logWriter) Write(b []byte) (int, error) {
	line := string(bytes.TrimSpace(b))
	switch {
	case bytes.Contains(b, []byte("[ERR]")), bytes.Contains(b, []byte("[WARN]")):
		w.log.Info(line)
	default:
		w.log.V(2).Info(line)
	}
	return len(b), nil
}

func splitHostPort(hp string) (string, int, error) {
	host, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, errors.New("invalid port")
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}
