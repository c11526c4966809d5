package envoysim

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/inference/wire"
)

// Active health checking as Envoy 1.39 runs it, gRPC checks only
// (source/extensions/health_checkers/common/health_checker_base_impl.cc
// HealthCheckerImplBase, source/extensions/health_checkers/grpc/
// health_checker_impl.cc GrpcHealthCheckerImpl):
//   - a host starts unhealthy (FAILED_ACTIVE_HC, upstream_impl.cc
//     updateDynamicHostList) and the cluster warms until every host had its
//     first check (ClusterImplBase::onInitDone); the first success makes a
//     host healthy at once (ActiveHealthCheckSession::handleSuccess,
//     first_check_), later ones after healthy_threshold in a row;
//   - a check is grpc.health.v1.Health/Check for service_name with the
//     :authority of grpc_health_check.authority, else the cluster's name; it
//     passes only on SERVING (isHealthCheckSucceeded). Any other answer is
//     an active failure that makes a healthy host unhealthy at once; a
//     connection failure or a timeout counts towards unhealthy_threshold
//     (setUnhealthy);
//   - checks share one connection per host (reuse_connection, true unset)
//     and a timeout resets only the stream (GrpcActiveHealthCheckSession
//     ::onTimeout): a connection whose peer vanished without a word keeps
//     failing checks until the kernel gives up on it. With reuse_connection
//     false each check opens a connection of its own and closes it after
//     the answer (onRpcComplete), so each check reaches whoever answers
//     the host's address now;
//   - a host that becomes unhealthy has its connections drained on every
//     worker, with or without close_connections_on_host_health_failure
//     (which changes only TCP pools): idle ones close, busy ones take no new
//     stream and end with their streams, which are not reset
//     (source/common/upstream/cluster_manager_impl.cc
//     ClusterManagerImpl::ThreadLocalClusterManagerImpl::onHostHealthFailure,
//     drainOrCloseConnPools); the next stream opens a new connection;
//   - the next check waits interval, or no_traffic_interval (60 s by
//     default) while the cluster never carried traffic, no_traffic_healthy
//     _interval for a healthy host then, unhealthy_interval for an
//     unhealthy one (HealthCheckerImplBase::interval);
//   - with no host healthy enough, below healthy_panic_threshold (50% by
//     default; 0 never panics), every host is used (LoadBalancerBase
//     ::isHostSetInPanic); otherwise only the healthy ones, and with none
//     the cluster has no host (a stream to it fails at its start).

// healthCheck is a cluster's health_checks entry.
type healthCheck struct {
	timeout, interval, unhealthyInterval, noTraffic, noTrafficHealthy time.Duration
	unhealthyThreshold, healthyThreshold                              uint32
	service, authority                                                string
	reuse                                                             bool   // reuse_connection
	tcp                                                               bool   // tcp_health_check: connect only
	id                                                                string // the entry's wire form: sessions of equal configs are shared
}

// defaultNoTrafficInterval is HealthCheck.no_traffic_interval's default.
const defaultNoTrafficInterval = 60 * time.Second

// parseHealthChecks reads Cluster.health_checks: none, or one gRPC check.
func parseHealthChecks(c *clusterv3.Cluster) (*healthCheck, error) {
	hcs := c.GetHealthChecks()
	switch len(hcs) {
	case 0:
		return nil, nil
	case 1:
	default:
		return nil, errors.New("health_checks: more than one is not implemented by the stand-in")
	}
	h := hcs[0]
	if err := checkFields("health_checks[0]", h); err != nil {
		return nil, err
	}
	g, tcp := h.GetGrpcHealthCheck(), h.GetTcpHealthCheck()
	switch {
	case tcp != nil:
		if err := checkFields("health_checks[0].tcp_health_check", tcp); err != nil {
			return nil, err
		}
		if tcp.GetSend() != nil || len(tcp.GetReceive()) > 0 {
			return nil, errors.New("health_checks[0].tcp_health_check: send and receive payloads are not implemented by the stand-in (a connect-only check is)")
		}
		if r := h.GetReuseConnection(); r == nil || r.GetValue() {
			// With reuse, Envoy's connect-only check passes on an open
			// connection without sending anything: a peer that vanished
			// would pass until the kernel gives up on it.
			return nil, errors.New("health_checks[0]: a connect-only tcp_health_check with reuse_connection is not implemented by the stand-in (set reuse_connection false)")
		}
	case g == nil:
		return nil, errors.New("health_checks[0]: only grpc_health_check and a connect-only tcp_health_check are implemented by the stand-in")
	}
	if err := checkFields("health_checks[0].grpc_health_check", g); err != nil {
		return nil, err
	}
	if h.GetTimeout() == nil || h.GetInterval() == nil || h.GetUnhealthyThreshold() == nil || h.GetHealthyThreshold() == nil {
		// Required by the proto's validation rules.
		return nil, errors.New("health_checks[0]: timeout, interval, unhealthy_threshold and healthy_threshold are required")
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(h)
	if err != nil {
		return nil, err
	}
	hc := &healthCheck{
		timeout:            h.GetTimeout().AsDuration(),
		interval:           h.GetInterval().AsDuration(),
		unhealthyThreshold: max(h.GetUnhealthyThreshold().GetValue(), 1),
		healthyThreshold:   max(h.GetHealthyThreshold().GetValue(), 1),
		service:            g.GetServiceName(),
		authority:          g.GetAuthority(),
		reuse:              h.GetReuseConnection() == nil || h.GetReuseConnection().GetValue(),
		tcp:                tcp != nil,
		noTraffic:          defaultNoTrafficInterval,
		id:                 string(raw),
	}
	if hc.authority == "" {
		hc.authority = c.GetName()
	}
	hc.unhealthyInterval = hc.interval
	if d := h.GetUnhealthyInterval(); d != nil {
		hc.unhealthyInterval = d.AsDuration()
	}
	if d := h.GetNoTrafficInterval(); d != nil {
		hc.noTraffic = d.AsDuration()
	}
	hc.noTrafficHealthy = hc.noTraffic
	if d := h.GetNoTrafficHealthyInterval(); d != nil {
		hc.noTrafficHealthy = d.AsDuration()
	}
	if hc.timeout <= 0 || hc.interval <= 0 {
		return nil, errors.New("health_checks[0]: timeout and interval must be positive")
	}
	return hc, nil
}

// panicThreshold is common_lb_config.healthy_panic_threshold in percent.
func panicThreshold(c *clusterv3.Cluster) (float64, error) {
	cfg := c.GetCommonLbConfig()
	if err := checkFields("common_lb_config", cfg); err != nil {
		return 0, err
	}
	if p := cfg.GetHealthyPanicThreshold(); p != nil {
		return p.GetValue(), nil
	}
	return 50, nil
}

// clusterHealth is what a cluster's load balancer knows of its hosts'
// health: nil when nothing checks them (every host healthy).
type clusterHealth struct {
	sessions map[string]*hcSession // by host
	panicAt  float64               // healthy_panic_threshold, percent
	traffic  *atomic.Bool          // the cluster carried traffic
	keys     []hcKey               // the sessions', for healthChecks.reuse
}

// usable narrows hosts to those the load balancer may use: the healthy
// ones, or all of them in panic.
func (h *clusterHealth) usable(hosts []string) []string {
	if h == nil || len(hosts) == 0 {
		return hosts
	}
	healthy := h.healthyOf(hosts)
	if h.panicAt > 0 && float64(len(healthy))*100 < h.panicAt*float64(len(hosts)) {
		return hosts
	}
	return healthy
}

// healthyOf is hosts without those failing their checks (h may be nil).
func (h *clusterHealth) healthyOf(hosts []string) []string {
	if h == nil {
		return hosts
	}
	return slices.DeleteFunc(slices.Clone(hosts), func(ep string) bool {
		s := h.sessions[ep]
		return s != nil && !s.isHealthy()
	})
}

// start is what an ext_proc stream to cluster name does as it starts: it
// counts as traffic, and goes to the channel (conn) of the next usable
// host in round robin (next), or, with none, fails at once.
func (h *clusterHealth) start(name string, hosts []string, next *atomic.Uint64, conn func(host string) *grpc.ClientConn) func() (*grpc.ClientConn, error) {
	return func() (*grpc.ClientConn, error) {
		h.traffic.Store(true)
		if usable := h.usable(hosts); len(usable) > 0 {
			return conn(usable[next.Add(1)%uint64(len(usable))]), nil
		}
		return nil, fmt.Errorf("cluster %q has no healthy host (no healthy upstream)", name)
	}
}

// warming reports whether a host has not had its first check yet.
func (h *clusterHealth) warming() bool {
	if h == nil {
		return false
	}
	for _, s := range h.sessions {
		if !s.checked() {
			return true
		}
	}
	return false
}

// hcKey identifies a session: the cluster, its check's config, the host
// and how it is reached.
type hcKey struct {
	cluster, config, host, transport string
}

// hcSession checks one host until it is stopped.
type hcSession struct {
	cfg     *healthCheck
	traffic *atomic.Bool
	dial    func() (*grpc.ClientConn, error)
	addr    string      // host:port, for a connect-only check
	tls     *tls.Config // the host's TLS, whose handshake a connect-only check completes
	// drain is called as the host turns unhealthy: its connections are
	// drained (onHostHealthFailure).
	drain func()

	mu        sync.Mutex
	healthy   bool
	first     bool // the first check has completed
	streak    uint32
	failures  uint32
	firstDone chan struct{}
	cancel    context.CancelFunc
}

func (s *hcSession) isHealthy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.healthy
}

func (s *hcSession) checked() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

// failureKind is Envoy's HealthTransition cause: an active failure (the
// server answered, not SERVING) or a network one (no answer).
type failureKind int

const (
	passed failureKind = iota
	activeFailure
	networkFailure
)

func (s *hcSession) record(k failureKind) {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.healthy
	defer func() {
		if was && !s.healthy && s.drain != nil {
			s.drain()
		}
	}()
	switch {
	case k == passed:
		s.failures = 0
		s.streak++
		if !s.healthy && (!s.first || s.streak >= s.cfg.healthyThreshold) {
			s.healthy = true
		}
	case k == activeFailure:
		s.streak, s.healthy = 0, false
	default:
		s.streak = 0
		s.failures++
		if s.failures >= s.cfg.unhealthyThreshold {
			s.healthy = false
		}
	}
	if !s.first {
		s.first = true
		close(s.firstDone)
	}
}

// connect is a connect-only check of the session's host.
func (s *hcSession) connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	var (
		c   net.Conn
		err error
	)
	if s.tls != nil {
		c, err = (&tls.Dialer{NetDialer: &net.Dialer{KeepAlive: -1}, Config: s.tls}).DialContext(ctx, "tcp", s.addr)
	} else {
		c, err = (&net.Dialer{KeepAlive: -1}).DialContext(ctx, "tcp", s.addr)
	}
	if err != nil {
		return err
	}
	return c.Close()
}

// wait is the pause before the next check.
func (s *hcSession) wait() time.Duration {
	healthy := s.isHealthy()
	switch {
	case !s.traffic.Load() && healthy:
		return s.cfg.noTrafficHealthy
	case !s.traffic.Load():
		return s.cfg.noTraffic
	case !healthy:
		return s.cfg.unhealthyInterval
	}
	return s.cfg.interval
}

func (s *hcSession) run(ctx context.Context, settled func()) {
	var shared *grpc.ClientConn // reuse_connection
	defer func() {
		if shared != nil {
			_ = shared.Close()
		}
	}()
	for {
		var k failureKind
		if s.cfg.tcp {
			k = s.connectCheck(ctx)
		} else {
			k, shared = s.grpcCheck(ctx, shared)
		}
		if ctx.Err() != nil {
			return
		}
		wasFirst := !s.checked()
		s.record(k)
		if wasFirst {
			settled()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.wait()):
		}
	}
}

// grpcCheck is one grpc.health.v1 Check, on shared when the check reuses
// its connection (returned for the next), else on one of its own.
func (s *hcSession) grpcCheck(ctx context.Context, shared *grpc.ClientConn) (failureKind, *grpc.ClientConn) {
	conn := shared
	var err error
	if conn == nil {
		if conn, err = s.dial(); err != nil {
			return networkFailure, nil
		}
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	resp, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{Service: s.cfg.service})
	cancel()
	if s.cfg.reuse {
		shared = conn
	} else {
		_ = conn.Close()
	}
	switch {
	case err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING:
		return passed, shared
	case err == nil:
		return activeFailure, shared
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return networkFailure, shared
	}
	return activeFailure, shared
}

// connectCheck is a connect-only check: a connection made passes, one
// refused or not made within the timeout is a network failure, and it is
// closed at once (tcp/health_checker_impl.cc
// TcpActiveHealthCheckSession::onEvent, reuse_connection false).
func (s *hcSession) connectCheck(ctx context.Context) failureKind {
	if err := s.connect(ctx); err != nil {
		return networkFailure
	}
	return passed
}

// healthChecks holds the node's sessions across builds: a build asks for
// the ones its clusters need (session); endBuild keeps those the accepted
// build uses and stops the rest, so health survives updates that do not
// change a cluster, as Envoy keeps its hosts' health flags.
type healthChecks struct {
	ctx     func() context.Context // the node's run context
	settled func()                 // a session completed its first check
	drain   func(grpcTarget)       // drains the connections to a host (connPool.drain)

	mu       sync.Mutex
	sessions map[hcKey]*hcSession
	traffic  map[string]*atomic.Bool // by cluster name and check
	used     map[hcKey]bool
	live     map[hcKey]bool
}

func newHealthChecks(ctx func() context.Context, settled func(), drain func(grpcTarget)) *healthChecks {
	return &healthChecks{ctx: ctx, settled: settled, drain: drain, sessions: map[hcKey]*hcSession{}, traffic: map[string]*atomic.Bool{},
		used: map[hcKey]bool{}, live: map[hcKey]bool{}}
}

// forCluster returns the health of cluster name's hosts under cfg,
// starting sessions for hosts it has none for.
func (r *healthChecks) forCluster(name string, cfg *healthCheck, panicAt float64, hosts []string, target func(host string) grpcTarget) (*clusterHealth, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tk := name + "\x00" + cfg.id
	traffic := r.traffic[tk]
	if traffic == nil {
		traffic = &atomic.Bool{}
		r.traffic[tk] = traffic
	}
	h := &clusterHealth{sessions: make(map[string]*hcSession, len(hosts)), panicAt: panicAt, traffic: traffic}
	for _, host := range hosts {
		t := target(host)
		k := hcKey{cluster: name, config: cfg.id, host: host, transport: fmt.Sprint(t.addr, t.tls, t.certID, t.sockopts)}
		s := r.sessions[k]
		if s == nil {
			// A target that cannot be dialled at all fails the build,
			// before any session starts.
			conn, err := dialHealth(t, cfg.authority)
			if err != nil {
				return nil, fmt.Errorf("health check of %s: %w", host, err)
			}
			_ = conn.Close()
			ctx, cancel := context.WithCancel(r.ctx())
			s = &hcSession{cfg: cfg, traffic: traffic, firstDone: make(chan struct{}), cancel: cancel, addr: t.addr, tls: t.tlsConfig(),
				dial: func() (*grpc.ClientConn, error) { return dialHealth(t, cfg.authority) }}
			if r.drain != nil {
				s.drain = func() { r.drain(t) }
			}
			r.sessions[k] = s
			go s.run(ctx, r.settled)
		}
		r.used[k] = true
		h.sessions[host] = s
		h.keys = append(h.keys, k)
	}
	return h, nil
}

// endBuild keeps the sessions of an accepted build and stops every other.
func (r *healthChecks) endBuild(accepted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if accepted {
		r.live = r.used
	}
	r.used = map[hcKey]bool{}
	inUse := map[string]bool{}
	for k, s := range r.sessions {
		if !r.live[k] {
			s.cancel()
			delete(r.sessions, k)
			continue
		}
		inUse[k.cluster+"\x00"+k.config] = true
	}
	maps.DeleteFunc(r.traffic, func(k string, _ *atomic.Bool) bool { return !inUse[k] })
}

func (r *healthChecks) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, s := range r.sessions {
		s.cancel()
		delete(r.sessions, k)
	}
}

// dialHealth is the health checker's own connection to a host, with the
// cluster's transport socket.
func dialHealth(t grpcTarget, authority string) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if t.tls {
		creds = credentials.NewTLS(extprocfilter.TLSConfig(t.cert))
	}
	return grpc.NewClient(t.addr, grpc.WithTransportCredentials(creds), grpc.WithAuthority(authority), extprocfilter.WithSocketOptions(t.sockopts))
}

// healthAwareClient is the ext_proc filter's client for a health-checked
// cluster: each stream starts on the first usable host (Envoy's load
// balancer chooses when the stream starts), and with none it fails at its
// start, so failure_mode_allow applies whatever of the request came.
// The channel is looked up as each stream starts, since a host that turned
// unhealthy has had its channel drained (connPool.drain) and gets a new one.
func healthAwareClient(cfg extprocfilter.FilterConfig, name string, cl *cluster, env buildEnv) (*extprocfilter.Client, error) {
	conns := make(map[string]*grpc.ClientConn, len(cl.endpoints))
	for _, host := range cl.endpoints {
		t := cl.target(host)
		conn, err := env.connFor(t.addr, t.tls, t.cert, t.sockopts)
		if err != nil {
			return nil, fmt.Errorf("ext_proc filter %q (cluster %q): %w", cfg.Name, name, err)
		}
		conns[host] = conn
	}
	current := func(host string) *grpc.ClientConn {
		t := cl.target(host)
		if env.currentConn != nil {
			if conn, err := env.currentConn(t.addr, t.tls, t.cert, t.sockopts); err == nil {
				return conn
			}
		}
		return conns[host]
	}
	return extprocfilter.NewClientStarting(cfg, cl.health.start(name, cl.endpoints, &cl.next, current))
}

// reuse keeps the sessions of h, the health of a cluster version that
// serves on while its update warms, as if this build had asked for them.
func (r *healthChecks) reuse(h *clusterHealth) {
	if h == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range h.keys {
		r.used[k] = true
	}
}

// keep ends a build that is accepted but held back while its clusters
// warm: its sessions go on with those in use.
func (r *healthChecks) keep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.used {
		r.live[k] = true
	}
	r.used = map[hcKey]bool{}
}

// flagHealth is how flag mode checks each filter's processor: as the
// clusters infergate's integrations render for a processor are checked
// (gateways/internal/xdsbuild ProcessorHealth), with no panic.
func flagHealth(name string) *healthCheck {
	const interval = 2 * time.Second
	return &healthCheck{
		timeout: time.Second, interval: interval, unhealthyInterval: interval, noTraffic: interval, noTrafficHealthy: interval,
		unhealthyThreshold: 2, healthyThreshold: 1, service: wire.ExtProcHealthService, authority: name, id: "flag",
		reuse: false,
	}
}

// flagFilterClient is a flag-mode filter: its processor a cluster of the
// given health-checked hosts, each stream started on the next usable one
// (clusterHealth.start: round robin over the healthy hosts). It waits for
// every host's first check, as Envoy warms a health-checked cluster before
// using it.
func flagFilterClient(fc extprocfilter.FilterConfig, hosts []string, checks *healthChecks) (*extprocfilter.Client, []*grpc.ClientConn, error) {
	conns := make(map[string]*grpc.ClientConn, len(hosts))
	owned := make([]*grpc.ClientConn, 0, len(hosts))
	closeAll := func() {
		for _, c := range owned {
			_ = c.Close()
		}
	}
	for _, h := range hosts {
		conn, err := extprocfilter.Dial(h, fc.TLS, fc.ClientCert)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("ext_proc filter %q: %w", fc.Name, err)
		}
		conns[h] = conn
		owned = append(owned, conn)
	}
	target := func(h string) grpcTarget {
		return grpcTarget{addr: h, tls: fc.TLS, cert: fc.ClientCert, certID: certID(fc.ClientCert)}
	}
	cl := &cluster{name: fc.Name, endpoints: hosts}
	hc := flagHealth(fc.Name)
	var err error
	if cl.health, err = checks.forCluster(fc.Name, hc, 0, cl.endpoints, target); err != nil {
		closeAll()
		return nil, nil, err
	}
	checks.keep()
	warm := time.After(hc.timeout + time.Second)
	for _, h := range hosts {
		select {
		case <-cl.health.sessions[h].firstDone:
		case <-warm:
		}
	}
	c, err := extprocfilter.NewClientStarting(fc, cl.health.start(fc.Name, cl.endpoints, &cl.next, func(h string) *grpc.ClientConn { return conns[h] }))
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return c, owned, nil
}
