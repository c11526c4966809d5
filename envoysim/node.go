package envoysim

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/envoysim/xdsclient"
)

// NodeConfig configures a Node: the stand-in as an Envoy node taking its
// listeners, routes and clusters over xDS, or from a static bootstrap.
type NodeConfig struct {
	// XDS is the ADS server and the node's identity. Unused (and must be
	// left empty) with Bootstrap.
	XDS xdsclient.Config
	// Bootstrap, if set, is the node's whole configuration, as `envoy -c`
	// takes it: the listeners and clusters of its static_resources (route
	// configurations inline in the connection managers), built under the
	// same rules as xDS resources; a resource the stand-in would NACK over
	// xDS makes Run fail with the same message. No ADS stream is opened, so
	// EDS clusters, RDS and dynamic_resources are errors. See
	// LoadBootstrap.
	Bootstrap *bootstrapv3.Bootstrap
	// BootstrapClusters are, over xDS, the static_resources clusters of
	// the bootstrap Envoy would run with beside its ADS stream (Envoy
	// Gateway's xds_cluster, say). They are clusters of the node like those
	// CDS sends, and the only ones an api_config_source may name (those not
	// of type EDS), as Envoy requires; nil is a bootstrap with none.
	BootstrapClusters []*clusterv3.Cluster
	// Address is the IP every listener binds on, whatever address the
	// control plane gives it (default 127.0.0.1: tests never bind others).
	Address string
	// FreePorts binds each listener on a free port instead of its own
	// port; ListenerAddr and OnListener tell which.
	FreePorts bool
	// Resolve maps host names of STRICT_DNS and LOGICAL_DNS clusters to IP
	// addresses (a test's own namespace of names, e.g. the endpoint
	// picker's Service name); names not in it go to the system resolver,
	// unless ResolveOnly.
	Resolve     map[string]string
	ResolveOnly bool
	// Lookup, if set, resolves the names Resolve does not hold, in place of
	// the system resolver: a test's cluster DNS (a Service name to its
	// cluster IP, a headless Service's to its ready Pods' IPs, say). A
	// STRICT_DNS cluster has a host per address, LOGICAL_DNS the first.
	Lookup   func(ctx context.Context, host string) ([]string, error)
	Timeouts Timeouts
	// DebugMetadata adds DebugMetadataHeader to responses.
	DebugMetadata bool
	Logger        logr.Logger
	// OnListener, if set, is called when a listener starts serving, with
	// its name, the address the control plane gave it and where it is bound.
	OnListener func(name, xdsAddress, bound string)
}

// Node is the stand-in configured over xDS: it subscribes to LDS and CDS
// (and the RDS and EDS names they need), NACKs what it cannot reproduce,
// and serves every listener with a Proxy whose table is swapped on each
// accepted update, so requests in flight finish on the table they started
// with. With NodeConfig.Bootstrap it serves the bootstrap's static
// resources instead, built once when Run starts.
type Node struct {
	cfg    NodeConfig
	log    logr.Logger
	client *xdsclient.Client // nil with a bootstrap
	static *resources        // the bootstrap's; nil over xDS
	health *healthChecks
	// bootstrap holds NodeConfig.BootstrapClusters by name (xDS mode).
	bootstrap map[string]*clusterv3.Cluster
	conns     *connPool

	mu        sync.Mutex
	res       *resources
	listeners map[string]*liveListener
	warming   map[string]*warmingListener
	side      map[string]*sideStream // by the cluster that reaches the EDS server
	runCtx    context.Context        // Run's, for the side streams
	dns       *dnsSeen               // STRICT_DNS names of the last accepted build
	dnsKick   chan struct{}          // dns changed: refreshDNS restarts its wait
	sideRuns  sync.WaitGroup
	// warmSince is when clusters started warming during initialization;
	// zero when none are.
	warmSince time.Time
	// Initialization ends when a CDS update has been put in use with no
	// cluster warming (or past its fetch timeout), as Envoy's cluster
	// manager initializes before LDS starts. After it, clusters warm one
	// by one: active holds each cluster in use (by name), warmStart when
	// each warming cluster began to.
	cdsSeen, initialized bool
	active               map[string]activeCluster
	warmStart            map[string]time.Time
}

// activeCluster is a cluster in use and how gRPC clients reach it.
type activeCluster struct {
	cl  *cluster
	tgt grpcTarget
}

// liveListener is a bound listener and its server.
type liveListener struct {
	xdsPort uint32
	bound   string
	proxy   *Proxy
	srv     *http.Server
	done    chan struct{}
}

// NewNode checks cfg and prepares the xDS client (Run connects), or, with
// a bootstrap, checks the bootstrap's own fields (Run builds its
// resources).
func NewNode(cfg NodeConfig) (*Node, error) {
	if cfg.Address == "" {
		cfg.Address = "127.0.0.1"
	}
	if net.ParseIP(cfg.Address) == nil {
		return nil, fmt.Errorf("envoysim node: address %q is not an IP address", cfg.Address)
	}
	for name, ip := range cfg.Resolve {
		if net.ParseIP(ip) == nil {
			return nil, fmt.Errorf("envoysim node: resolve %s=%s: not an IP address", name, ip)
		}
	}
	cfg.Timeouts.setDefaults()
	cfg.XDS.Logger = cfg.Logger.WithName("xds")
	n := &Node{
		cfg: cfg, log: cfg.Logger, conns: newConnPool(cfg.Timeouts.Route),
		res: &resources{
			listeners: map[string]*listenerv3.Listener{}, routes: map[string]*routev3.RouteConfiguration{},
			clusters: map[string]*clusterv3.Cluster{}, endpoints: map[string]*endpointv3.ClusterLoadAssignment{},
			side: map[string]map[string]*endpointv3.ClusterLoadAssignment{},
		},
		listeners: map[string]*liveListener{},
		warming:   map[string]*warmingListener{},
		warmStart: map[string]time.Time{},
		side:      map[string]*sideStream{},
		runCtx:    context.Background(),
		dnsKick:   make(chan struct{}, 1),
	}
	n.health = newHealthChecks(n.runContext, n.healthSettled, func(t grpcTarget) { n.conns.drain(t.addr, t.tls, t.cert, t.sockopts) })
	if cfg.Bootstrap != nil && cfg.BootstrapClusters != nil {
		return nil, errors.New("envoysim node: BootstrapClusters are for xDS mode; a Bootstrap holds its own clusters")
	}
	if len(cfg.BootstrapClusters) > 0 {
		n.bootstrap = make(map[string]*clusterv3.Cluster, len(cfg.BootstrapClusters))
		for _, c := range cfg.BootstrapClusters {
			if _, dup := n.bootstrap[c.GetName()]; dup || c.GetName() == "" {
				return nil, fmt.Errorf("envoysim node: bootstrap cluster %q: a name given once is required", c.GetName())
			}
			n.bootstrap[c.GetName()] = c
		}
	}
	if cfg.Bootstrap != nil {
		if cfg.XDS.Server != "" || cfg.XDS.NodeID != "" {
			return nil, errors.New("envoysim node: a bootstrap and an xDS server (XDS.Server, XDS.NodeID) are exclusive")
		}
		res, err := staticResources(cfg.Bootstrap)
		if err != nil {
			return nil, fmt.Errorf("envoysim node: %w", err)
		}
		n.static = res
		return n, nil
	}
	c, err := xdsclient.New(cfg.XDS, n)
	if err != nil {
		return nil, fmt.Errorf("envoysim node: %w", err)
	}
	n.client = c
	// Envoy subscribes to clusters and listeners as wildcards; routes and
	// endpoints follow by name.
	c.Subscribe(xdsclient.ClusterType, nil)
	c.Subscribe(xdsclient.ListenerType, nil)
	return n, nil
}

// XDS returns the node's xDS client, for its Status and WaitVersion; nil
// when the node runs from a bootstrap.
func (n *Node) XDS() *xdsclient.Client { return n.client }

// Run keeps the ADS stream up and serves the listeners until ctx ends, then
// drains every listener for up to Timeouts.Shutdown. With a bootstrap it
// builds and binds the static resources first, returning at once with the
// error if any is refused (as Envoy exits on a bootstrap it rejects); else
// it returns nil when ctx ends.
func (n *Node) Run(ctx context.Context) error {
	n.mu.Lock()
	n.runCtx = ctx
	n.mu.Unlock()
	// DNS is resolved again until Run returns, which a bootstrap refused at
	// start makes it do before ctx ends.
	dnsCtx, stopDNS := context.WithCancel(ctx)
	n.sideRuns.Add(1)
	go func() {
		defer n.sideRuns.Done()
		n.refreshDNS(dnsCtx)
	}()
	var err error
	if n.client != nil {
		err = n.client.Run(ctx)
	} else if err = n.startStatic(); err == nil {
		<-ctx.Done()
	}
	stopDNS()
	n.sideRuns.Wait() // they end with ctx
	n.mu.Lock()
	lls := n.listeners
	n.listeners = map[string]*liveListener{}
	for _, w := range n.warming {
		_ = w.ln.Close()
	}
	n.warming = map[string]*warmingListener{}
	n.mu.Unlock()
	for _, ll := range lls {
		n.stopListener(ll)
	}
	for _, ll := range lls {
		<-ll.done
	}
	n.conns.closeAll()
	n.health.closeAll()
	return err
}

// startStatic builds the bootstrap's resources and serves its listeners,
// through the path xDS updates take.
func (n *Node) startStatic() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	b, err := n.rebuild(n.static, "bootstrap", "")
	if err != nil {
		return fmt.Errorf("envoysim node: bootstrap static_resources: %w", err)
	}
	n.log.Info("bootstrap served", "listeners", len(b.listeners), "clusters", len(n.static.clusters))
	return nil
}

// ListenerAddr returns where a listener is bound, if it serves.
func (n *Node) ListenerAddr(name string) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ll, ok := n.listeners[name]
	if !ok {
		return "", false
	}
	return ll.bound, true
}

// ClusterHosts describes, for diagnostics, the hosts of every cluster the
// node's listeners serve with now: each cluster's name, then its hosts the
// load balancer uses, and those only override_host may take (unhealthy,
// other priorities) in brackets.
func (n *Node) ClusterHosts() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, ll := range n.listeners {
		t := ll.proxy.tbl.Load()
		if t == nil {
			continue
		}
		for name, c := range t.clusters {
			if seen[name] {
				continue
			}
			seen[name] = true
			usable := c.health.usable(c.endpoints)
			var others []string
			for m := range c.members {
				if !slices.Contains(usable, m) {
					others = append(others, m)
				}
			}
			slices.Sort(others)
			out = append(out, fmt.Sprintf("%s: %v %v", name, usable, others))
		}
	}
	slices.Sort(out)
	return out
}

// ListenerFilters describes, for diagnostics, the HTTP filters the node
// runs for each listener now (those it reproduces: ext_proc, health
// checks, Istio's metadata exchange; not the router): the listener's
// name, then its filters' names ("disabled" for one a route must enable).
// A route's per-filter override of a filter its listener lacks does
// nothing.
func (n *Node) ListenerFilters() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.listeners))
	for name, ll := range n.listeners {
		t := ll.proxy.tbl.Load()
		if t == nil {
			continue
		}
		fs := []string{}
		for _, f := range t.filters {
			s := f.name
			if f.disabled {
				s += " (disabled)"
			}
			fs = append(fs, s)
		}
		out = append(out, fmt.Sprintf("%s: %v", name, fs))
	}
	slices.Sort(out)
	return out
}

// AssignedHosts describes, for diagnostics, the load assignments the node
// has accepted over ADS, which warming may not have put in use yet: each
// assignment's cluster name, then its endpoints' addresses with their EDS
// health status where one is set.
func (n *Node) AssignedHosts() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.res.endpoints))
	for name, cla := range n.res.endpoints {
		var hosts []string
		for _, lle := range cla.GetEndpoints() {
			for _, le := range lle.GetLbEndpoints() {
				sa := le.GetEndpoint().GetAddress().GetSocketAddress()
				h := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
				if st := le.GetHealthStatus(); st != corev3.HealthStatus_UNKNOWN {
					h += "(" + st.String() + ")"
				}
				hosts = append(hosts, h)
			}
		}
		slices.Sort(hosts)
		out = append(out, fmt.Sprintf("%s: %v", name, hosts))
	}
	slices.Sort(out)
	return out
}

// Apply takes one state-of-the-world update (xdsclient.Handler). The whole
// configuration is rebuilt with it; any error NACKs it and leaves the node
// as it was.
func (n *Node) Apply(_ context.Context, typeURL, version string, rs []*anypb.Any) error {
	if n.client == nil {
		return errors.New("envoysim node: the node serves a static bootstrap and takes no xDS updates")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	next := *n.res
	var err error
	switch typeURL {
	case xdsclient.ListenerType:
		next.listeners, err = decodeAll(rs, func() *listenerv3.Listener { return &listenerv3.Listener{} }, (*listenerv3.Listener).GetName)
	case xdsclient.RouteType:
		var got map[string]*routev3.RouteConfiguration
		got, err = decodeAll(rs, func() *routev3.RouteConfiguration { return &routev3.RouteConfiguration{} }, (*routev3.RouteConfiguration).GetName)
		next.routes = mergeNamed(n.res.routes, got)
	case xdsclient.ClusterType:
		next.clusters, err = decodeAll(rs, func() *clusterv3.Cluster { return &clusterv3.Cluster{} }, (*clusterv3.Cluster).GetName)
		n.cdsSeen = n.cdsSeen || err == nil
	case xdsclient.EndpointType:
		var got map[string]*endpointv3.ClusterLoadAssignment
		got, err = decodeAll(rs, func() *endpointv3.ClusterLoadAssignment { return &endpointv3.ClusterLoadAssignment{} }, (*endpointv3.ClusterLoadAssignment).GetClusterName)
		next.endpoints = mergeNamed(n.res.endpoints, got)
	default:
		err = fmt.Errorf("resource type %s is not implemented by the stand-in", typeURL)
	}
	if err != nil {
		return err
	}
	b, rejected, err := n.rebuildAccepting(&next, typeURL, version)
	if err != nil {
		return err
	}
	// Subscribing to a name set that did not change sends nothing. A
	// route configuration or load assignment no longer subscribed to is
	// forgotten, as Envoy drops a resource it unsubscribes from.
	if n.client != nil {
		n.client.Subscribe(xdsclient.RouteType, b.rds)
		n.client.Subscribe(xdsclient.EndpointType, b.eds)
		n.res.routes = keepNamed(n.res.routes, b.rds)
		n.res.endpoints = keepNamed(n.res.endpoints, b.eds)
	}
	n.syncSide(b.side)
	if rejected != nil {
		n.log.Info("xDS update applied in part", "type", typeURL, "version", version, "rejected", rejected.Error())
		return rejected
	}
	n.log.V(1).Info("xDS update applied", "type", typeURL, "version", version, "resources", len(rs))
	return nil
}

// rebuildAccepting rebuilds with next as Envoy applies a CDS or LDS
// update: a cluster or listener of the update that cannot be built is
// rejected alone, keeping the version the node had of it (or none), and
// the rest is applied; the update is still NACKed, naming each rejected
// resource (Envoy 1.39: source/common/upstream/cds_api_helper.cc
// CdsApiHelper::onConfigUpdate, source/common/listener_manager/lds_api.cc
// LdsApiImpl::onConfigUpdate). rejected is that NACK; err is an update
// rejected whole: any other failure, or one of another type's resources.
// Callers hold n.mu.
func (n *Node) rebuildAccepting(next *resources, typeURL, version string) (b *built, rejected, err error) {
	var errs []error
	for {
		b, err = n.rebuild(next, typeURL, version)
		var re *resourceError
		if err == nil || !errors.As(err, &re) || !n.keepPrevious(next, typeURL, re) {
			break
		}
		errs = append(errs, err)
	}
	if err != nil {
		return nil, nil, err
	}
	return b, errors.Join(errs...), nil
}

// keepPrevious puts back, in next, the version the node has of the
// resource re names, if re is of the kind typeURL carries and next has the
// update's own version of it; false when it is not (the update is then
// rejected whole).
func (n *Node) keepPrevious(next *resources, typeURL string, re *resourceError) bool {
	switch {
	case typeURL == xdsclient.ClusterType && re.kind == clusterKind:
		return keepOne(next.clusters, n.res.clusters, re.name)
	case typeURL == xdsclient.ListenerType && re.kind == listenerKind:
		return keepOne(next.listeners, n.res.listeners, re.name)
	}
	return false
}

// keepOne replaces next's name with held's, or drops it when held has none;
// false when next's version already is held's (nothing left to undo).
func keepOne[T proto.Message](next, held map[string]T, name string) bool {
	cur, ok := next[name]
	if !ok {
		return false
	}
	old, had := held[name]
	if had && proto.Equal(cur, old) {
		return false
	}
	if had {
		next[name] = old
	} else {
		delete(next, name)
	}
	return true
}

// rebuild translates next and, if it is accepted, makes it the node's
// state. Callers hold n.mu.
func (n *Node) rebuild(next *resources, typeURL, version string) (*built, error) {
	env := buildEnv{resolve: n.resolveAll, dns: newDNSSeen(), clientFor: n.conns.client, connFor: n.conns.conn, currentConn: n.conns.current, health: n.health,
		log: n.log, static: n.static != nil, node: n.nodeInfo(), bootstrap: n.bootstrap}
	if n.initialized {
		env.hold = n.holdWarming
	}
	b, err := build(next, env)
	if err == nil {
		n.trimWarming(b.pending)
	}
	if err == nil && !n.initialized && n.clustersWarming(b.pending) {
		// Accepted, but clusters are warming (EDS endpoints or first
		// health checks to come): the tables in use stay until they are
		// done or the fetch times out. The health checks already started
		// go on.
		n.conns.endBuild(false)
		n.health.keep()
		n.res = next
		n.setDNS(env.dns)
		return b, nil
	}
	if err == nil {
		err = n.activate(b.listeners)
	}
	n.conns.endBuild(err == nil)
	n.health.endBuild(err == nil)
	if err == nil {
		n.setDNS(env.dns)
		n.active = b.active
		n.initialized = n.initialized || (n.cdsSeen && n.client != nil)
	}
	if err != nil {
		msg := "xDS update rejected"
		if n.static != nil {
			msg = "bootstrap rejected"
		}
		n.log.Error(err, msg, "type", typeURL, "version", version)
		return nil, err
	}
	n.res = next
	return b, nil
}

// nodeInfo is the local node: the xDS identity, or the bootstrap's node.
func (n *Node) nodeInfo() nodeInfo {
	if n.cfg.Bootstrap != nil {
		return nodeInfo{id: n.cfg.Bootstrap.GetNode().GetId(), metadata: n.cfg.Bootstrap.GetNode().GetMetadata()}
	}
	return nodeInfo{id: n.cfg.XDS.NodeID, metadata: n.cfg.XDS.NodeMetadata}
}

// initialFetchTimeout is ConfigSource.initial_fetch_timeout's default: how
// long Envoy lets a cluster warm waiting for its first EDS answer.
const initialFetchTimeout = 15 * time.Second

// clustersWarming reports whether activation waits for EDS clusters that have not
// had their first load assignment, as Envoy warms such clusters before
// using them (so a listener does not serve with a picker cluster that has
// no host yet). After initialFetchTimeout it goes on without them. Callers
// hold n.mu.
func (n *Node) clustersWarming(pending []string) bool {
	if len(pending) == 0 {
		n.warmSince = time.Time{}
		return false
	}
	if n.warmSince.IsZero() {
		n.warmSince = time.Now()
		time.AfterFunc(initialFetchTimeout, n.warmTimedOut)
		n.log.V(1).Info("clusters warming", "waiting for", pending)
	}
	return time.Since(n.warmSince) < initialFetchTimeout
}

// holdWarming is buildEnv.hold after initialization: a warming cluster
// stays at the version in use, or out if it is new, until it is ready or
// its initial_fetch_timeout has passed (then it is used as it is). Callers
// hold n.mu.
func (n *Node) holdWarming(name string, c *clusterv3.Cluster) (*activeCluster, bool) {
	d := fetchTimeout(c)
	start, ok := n.warmStart[name]
	if !ok {
		start = time.Now()
		n.warmStart[name] = start
		if d > 0 {
			time.AfterFunc(d, n.warmTimedOut)
		}
		n.log.V(1).Info("cluster warming", "cluster", name, "timeout", d)
	}
	if d > 0 && time.Since(start) >= d {
		return nil, false
	}
	if old, ok := n.active[name]; ok {
		return &old, true
	}
	return nil, true
}

// trimWarming forgets the clusters no longer warming. Callers hold n.mu.
func (n *Node) trimWarming(pending []string) {
	for name := range n.warmStart {
		if !slices.Contains(pending, name) {
			delete(n.warmStart, name)
		}
	}
}

// fetchTimeout is how long cluster c may warm: its EDS source's
// initial_fetch_timeout (15 s unset; 0, as Istio sets it, no limit), 15 s
// for a cluster warming on its first health checks (Envoy 1.39:
// source/common/config/utility.cc Utility::configSourceInitialFetchTimeout,
// used by the EDS subscription in source/extensions/clusters/eds/eds.cc).
func fetchTimeout(c *clusterv3.Cluster) time.Duration {
	if c.GetType() != clusterv3.Cluster_EDS {
		return initialFetchTimeout
	}
	t := c.GetEdsClusterConfig().GetEdsConfig().GetInitialFetchTimeout()
	if t == nil {
		return initialFetchTimeout
	}
	return t.AsDuration()
}

// runContext is Run's context, which health check sessions live in.
func (n *Node) runContext() context.Context {
	return n.runCtx // read under n.mu by the callers (build)
}

// healthSettled activates what warming held back once a health-checked
// cluster's hosts have had their first check.
func (n *Node) healthSettled() {
	go func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if (n.warmSince.IsZero() && len(n.warmStart) == 0) || n.runCtx.Err() != nil {
			return
		}
		if _, err := n.rebuild(n.res, "health_check", ""); err != nil {
			n.log.Error(err, "activation after the first health checks")
		}
	}()
}

// warmTimedOut activates what warming held back once the fetch timeout has
// passed.
func (n *Node) warmTimedOut() {
	n.mu.Lock()
	defer n.mu.Unlock()
	initWaits := !n.warmSince.IsZero() && time.Since(n.warmSince) >= initialFetchTimeout
	if (!initWaits && len(n.warmStart) == 0) || n.runCtx.Err() != nil {
		return
	}
	n.log.Info("initial fetch timeout: using clusters without their endpoints")
	if _, err := n.rebuild(n.res, "initial_fetch_timeout", ""); err != nil {
		n.log.Error(err, "activation after the initial fetch timeout")
	}
}

// sideStream is an EDS stream to a server other than ADS (a cluster's
// eds_config api_config_source), as Envoy opens one per such server.
type sideStream struct {
	target grpcTarget
	client *xdsclient.Client
	cancel context.CancelFunc
}

// syncSide opens, updates and closes the EDS streams the clusters need.
// Callers hold n.mu.
func (n *Node) syncSide(want map[string]*sideSource) {
	if n.static != nil {
		// A bootstrap node has no node identity to stream EDS with; the
		// build refuses EDS clusters there, so want is empty.
		if len(want) > 0 {
			n.log.Error(nil, "EDS streams not opened: the node serves a static bootstrap", "sources", len(want))
		}
		return
	}
	for src, ss := range n.side {
		if w, ok := want[src]; !ok || !w.target.same(ss.target) {
			ss.cancel()
			delete(n.side, src)
		}
	}
	for src, w := range want {
		ss := n.side[src]
		if ss == nil {
			cfg := n.cfg.XDS
			// The ADS server's credentials are its own: an EDS cluster has
			// its TLS (below) and no token, as its gRPC service would.
			cfg.Service, cfg.Server, cfg.TLS, cfg.Token = xdsclient.EndpointService, w.target.addr, nil, nil
			// Envoy retries a failed subscription stream after a jittered
			// back-off from 500 ms up to 30 s (source/extensions/
			// config_subscription/grpc/grpc_stream.h, RetryInitialDelayMs,
			// RetryMaxDelayMs), so an EDS server that comes back is used
			// up to 30 s later.
			cfg.BackoffInitial, cfg.BackoffMax = 500*time.Millisecond, 30*time.Second
			switch {
			case w.target.verify:
				// A google_grpc channel: its target resolved here, the
				// server's certificate verified for the target's host.
				tc, addr, err := n.verifyingTarget(w.target)
				if err != nil {
					n.log.Error(err, "EDS stream not opened", "source", src)
					continue
				}
				cfg.Server, cfg.TLS = addr, tc
			case w.target.tls:
				// As for ext_proc clusters: TLS that accepts the server's
				// certificate and presents the cluster's client certificate.
				cfg.TLS = extprocfilter.TLSConfig(w.target.cert)
			default:
				addr, err := n.resolveAddr(w.target.addr)
				if err != nil {
					n.log.Error(err, "EDS stream not opened", "source", src)
					continue
				}
				cfg.Server = addr
			}
			c, err := xdsclient.New(cfg, xdsclient.HandlerFunc(func(_ context.Context, typeURL, version string, rs []*anypb.Any) error {
				return n.applySide(src, typeURL, version, rs)
			}))
			if err != nil {
				n.log.Error(err, "EDS stream not opened", "cluster", src)
				continue
			}
			ctx, cancel := context.WithCancel(n.runCtx)
			ss = &sideStream{target: w.target, client: c, cancel: cancel}
			n.side[src] = ss
			n.sideRuns.Add(1)
			go func() {
				defer n.sideRuns.Done()
				_ = c.Run(ctx)
			}()
		}
		ss.client.Subscribe(xdsclient.EndpointType, w.names)
	}
	// Load assignments no longer subscribed to are forgotten.
	side := make(map[string]map[string]*endpointv3.ClusterLoadAssignment, len(want))
	for src, w := range want {
		side[src] = keepNamed(n.res.side[src], w.names)
	}
	n.res.side = side
}

// applySide takes an update from a side EDS stream.
func (n *Node) applySide(src, typeURL, version string, rs []*anypb.Any) error {
	if typeURL != xdsclient.EndpointType {
		return fmt.Errorf("resource type %s on an EDS stream", typeURL)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.side[src] == nil {
		return nil // the stream was closed while this update was on its way
	}
	cla, err := decodeAll(rs, func() *endpointv3.ClusterLoadAssignment { return &endpointv3.ClusterLoadAssignment{} }, (*endpointv3.ClusterLoadAssignment).GetClusterName)
	if err != nil {
		return err
	}
	next := *n.res
	next.side = maps.Clone(next.side)
	next.side[src] = mergeNamed(next.side[src], cla)
	_, err = n.rebuild(&next, typeURL, version)
	return err
}

// mergeNamed applies a RDS or EDS response to the resources held: in the
// state-of-the-world protocol only Listener and Cluster responses carry the
// whole set; a RouteConfiguration or ClusterLoadAssignment response may
// carry only those that changed (Istio sends only the load assignments of
// the clusters it pushes for), and the others stay as they were (xDS
// protocol, "Grouping resources into responses").
func mergeNamed[T any](held, got map[string]T) map[string]T {
	out := maps.Clone(held)
	if out == nil {
		out = make(map[string]T, len(got))
	}
	maps.Copy(out, got)
	return out
}

// keepNamed drops the resources not among names.
func keepNamed[T any](held map[string]T, names []string) map[string]T {
	out := make(map[string]T, len(names))
	for _, name := range names {
		if r, ok := held[name]; ok {
			out[name] = r
		}
	}
	return out
}

func decodeAll[T proto.Message](rs []*anypb.Any, newT func() T, name func(T) string) (map[string]T, error) {
	out := make(map[string]T, len(rs))
	for i, a := range rs {
		m := newT()
		if err := a.UnmarshalTo(m); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		n := name(m)
		if _, dup := out[n]; dup {
			return nil, fmt.Errorf("resource %q sent twice", n)
		}
		out[n] = m
	}
	return out, nil
}

// resolveAddr resolves the host of host:port (resolve).
func (n *Node) resolveAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	ip, err := n.resolve(host)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(ip, port), nil
}

// verifyingTarget is the TLS of a google_grpc channel with ssl_credentials
// and the address it dials: the server's certificate must chain to the
// target's root certificates (the system's when none) and name its host.
func (n *Node) verifyingTarget(t grpcTarget) (*tls.Config, string, error) {
	addr, err := n.resolveAddr(t.addr)
	if err != nil {
		return nil, "", err
	}
	tc := &tls.Config{ServerName: t.serverName, MinVersion: tls.VersionTLS12}
	if t.roots != "" {
		tc.RootCAs = x509.NewCertPool()
		tc.RootCAs.AppendCertsFromPEM([]byte(t.roots))
	}
	if t.cert != nil {
		cert := t.cert
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return tc, addr, nil
}

// resolve maps a host to one IP address: the first of resolveAll, as
// LOGICAL_DNS and gRPC targets use one.
func (n *Node) resolve(host string) (string, error) {
	ips, err := n.resolveAll(host)
	if err != nil {
		return "", err
	}
	return ips[0], nil
}

// resolveAll maps a cluster host to its IP addresses: as given when it is
// one, else from NodeConfig.Resolve, else NodeConfig.Lookup or the system
// resolver. It never returns an empty list without an error.
func (n *Node) resolveAll(host string) ([]string, error) {
	if ip := net.ParseIP(host); ip != nil {
		return []string{ip.String()}, nil
	}
	if ip, ok := n.cfg.Resolve[host]; ok {
		return []string{ip}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if n.cfg.Lookup != nil {
		ips, err := n.cfg.Lookup(ctx, host)
		if err == nil && len(ips) == 0 {
			err = errors.New("no address")
		}
		if err != nil {
			return nil, fmt.Errorf("resolving %q: %w", host, err)
		}
		return ips, nil
	}
	if n.cfg.ResolveOnly {
		return nil, fmt.Errorf("%q is not in the stand-in's resolve table", host)
	}
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil || len(ips) == 0 {
		return nil, fmt.Errorf("resolving %q: %w (add it to the stand-in's resolve table)", host, err)
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out, nil
}

// activate swaps the built tables into live listeners, binds new ones and
// drains removed ones. Sockets are bound when a listener first appears,
// before any change, as Envoy binds them when it adds a listener: one that
// cannot bind makes the update a NACK and leaves the node as it was. A
// listener waiting for its routes (warming) holds its socket without
// serving; one that had a table keeps serving it. Callers hold n.mu.
func (n *Node) activate(built []*builtListener) error {
	sockets := map[string]net.Listener{}
	for _, bl := range built {
		if ll := n.listeners[bl.name]; ll != nil && ll.xdsPort == bl.port {
			continue
		}
		if w := n.warming[bl.name]; w != nil && w.port == bl.port {
			continue
		}
		port := int(bl.port)
		if n.cfg.FreePorts {
			port = 0
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(n.cfg.Address, strconv.Itoa(port)))
		if err != nil {
			for _, s := range sockets {
				_ = s.Close()
			}
			return &resourceError{kind: listenerKind, name: bl.name, err: fmt.Errorf("binding port %d: %w", port, err)}
		}
		sockets[bl.name] = ln
	}
	keep := map[string]bool{}
	for _, bl := range built {
		keep[bl.name] = true
		ll := n.listeners[bl.name]
		ln, fresh := sockets[bl.name]
		if fresh {
			if w := n.warming[bl.name]; w != nil {
				_ = w.ln.Close() // the port changed while warming
				delete(n.warming, bl.name)
			}
		} else if w := n.warming[bl.name]; w != nil && bl.ready {
			ln, fresh = w.ln, true
			delete(n.warming, bl.name)
		}
		switch {
		case fresh && bl.ready:
			if ll != nil {
				delete(n.listeners, bl.name)
				go n.stopListener(ll)
			}
			n.startListener(bl, ln)
		case fresh:
			n.warming[bl.name] = &warmingListener{port: bl.port, ln: ln}
		case ll != nil && bl.ready:
			ll.proxy.tbl.Store(bl.table)
		}
	}
	for name, ll := range n.listeners {
		if !keep[name] {
			delete(n.listeners, name)
			go n.stopListener(ll)
		}
	}
	for name, w := range n.warming {
		if !keep[name] {
			_ = w.ln.Close()
			delete(n.warming, name)
		}
	}
	return nil
}

// warmingListener is a bound socket whose listener waits for its routes.
type warmingListener struct {
	port uint32
	ln   net.Listener
}

// startListener serves a listener on its bound socket. Callers hold n.mu.
func (n *Node) startListener(bl *builtListener, ln net.Listener) {
	p := newProxy(n.cfg.Timeouts, n.cfg.DebugMetadata, n.log.WithValues("listener", bl.name))
	p.tbl.Store(bl.table)
	ll := &liveListener{
		xdsPort: bl.port, bound: ln.Addr().String(), proxy: p, done: make(chan struct{}),
		srv: &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second},
	}
	n.listeners[bl.name] = ll
	go func() {
		defer close(ll.done)
		if err := ll.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error(err, "listener stopped", "listener", bl.name)
		}
	}()
	n.log.Info("listener serving", "listener", bl.name, "xdsPort", bl.port, "address", ll.bound)
	if n.cfg.OnListener != nil {
		n.cfg.OnListener(bl.name, bl.addr, ll.bound)
	}
}

// stopListener drains a listener: no new connections, in-flight requests
// get Timeouts.Shutdown to finish.
func (n *Node) stopListener(ll *liveListener) {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Timeouts.Shutdown)
	defer cancel()
	if err := ll.srv.Shutdown(ctx); err != nil {
		_ = ll.srv.Close()
	}
	<-ll.done
	_ = ll.proxy.Close()
}

// connPool shares gRPC channels to ext_proc servers between filters, routes
// and updates, as Envoy shares a cluster's connections. A channel no table
// uses any more is closed after a grace period that outlasts any request
// still using it.
type connPool struct {
	grace time.Duration

	mu    sync.Mutex
	conns map[connKey]*pooledConn
	used  map[connKey]bool // referenced by the build in progress
	live  map[connKey]bool // referenced by the tables serving now
}

// connKey tells channels apart: two clusters at one address share a
// channel only if they dial it the same way, with the same client
// certificate (certID).
type connKey struct {
	target   string
	tls      bool
	cert     string
	sockopts extprocfilter.SocketOptions
}

type pooledConn struct {
	conn   *grpc.ClientConn
	retire *time.Timer // non-nil while waiting to close
}

func newConnPool(grace time.Duration) *connPool {
	return &connPool{grace: grace, conns: map[connKey]*pooledConn{}, used: map[connKey]bool{}, live: map[connKey]bool{}}
}

// client makes a client for cfg over the pooled channel to cfg.Target.
func (p *connPool) client(cfg extprocfilter.FilterConfig) (*extprocfilter.Client, error) {
	conn, err := p.conn(cfg.Target, cfg.TLS, cfg.ClientCert, extprocfilter.SocketOptions{})
	if err != nil {
		return nil, err
	}
	return extprocfilter.NewClientConn(cfg, conn)
}

// conn is the pooled channel to target, dialled as tls and cert say.
func (p *connPool) conn(target string, useTLS bool, cert *tls.Certificate, so extprocfilter.SocketOptions) (*grpc.ClientConn, error) {
	k := connKey{target, useTLS, certID(cert), so}
	p.mu.Lock()
	defer p.mu.Unlock()
	pc := p.conns[k]
	if pc != nil && pc.retire != nil && !pc.retire.Stop() {
		pc = nil // closed already
	}
	if pc == nil {
		conn, err := extprocfilter.Dial(target, useTLS, cert, extprocfilter.WithSocketOptions(so))
		if err != nil {
			return nil, err
		}
		pc = &pooledConn{conn: conn}
		p.conns[k] = pc
	}
	pc.retire = nil
	p.used[k] = true
	return pc.conn, nil
}

// current is the channel to target for a stream starting now: the pooled
// one, or a new one if drain took it out. Unlike conn it is not part of a
// build.
func (p *connPool) current(target string, useTLS bool, cert *tls.Certificate, so extprocfilter.SocketOptions) (*grpc.ClientConn, error) {
	k := connKey{target, useTLS, certID(cert), so}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc := p.conns[k]; pc != nil && pc.retire == nil {
		return pc.conn, nil
	}
	conn, err := extprocfilter.Dial(target, useTLS, cert, extprocfilter.WithSocketOptions(so))
	if err != nil {
		return nil, err
	}
	pc := &pooledConn{conn: conn}
	if old := p.conns[k]; old != nil && old.retire != nil {
		// Out of the live set: it retires as the old one would have.
		pc.retire = time.AfterFunc(p.grace, func() { _ = conn.Close() })
	}
	p.conns[k] = pc
	return conn, nil
}

// drain takes the channel to target out of the pool, as Envoy drains a
// host's connection pools when its health check fails: streams on it go
// on, and it closes after the grace period that outlasts them; the next
// stream gets a new channel (current).
func (p *connPool) drain(target string, useTLS bool, cert *tls.Certificate, so extprocfilter.SocketOptions) {
	k := connKey{target, useTLS, certID(cert), so}
	p.mu.Lock()
	defer p.mu.Unlock()
	pc := p.conns[k]
	if pc == nil || pc.retire != nil {
		return
	}
	delete(p.conns, k)
	conn := pc.conn
	time.AfterFunc(p.grace, func() { _ = conn.Close() })
}

// endBuild ends a build: an accepted one's channels become the live set;
// either way, every channel outside the live set is closed after the grace
// period (a rejected build may have opened some).
func (p *connPool) endBuild(accepted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if accepted {
		p.live = p.used
	}
	p.used = map[connKey]bool{}
	for k, pc := range p.conns {
		if p.live[k] || pc.retire != nil {
			continue
		}
		conn := pc.conn
		pc.retire = time.AfterFunc(p.grace, func() { _ = conn.Close() })
	}
}

func (p *connPool) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.conns {
		if pc.retire != nil {
			pc.retire.Stop()
		}
		_ = pc.conn.Close()
	}
	p.conns = map[connKey]*pooledConn{}
}
