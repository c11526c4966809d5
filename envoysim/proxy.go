package envoysim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/inference/wire"
)

// Response headers the stand-in adds; Envoy has neither.
const (
	// UpstreamHeader names the endpoint that served, on every proxied response.
	UpstreamHeader = "x-infergate-upstream"
	// DebugMetadataHeader carries, when Config.DebugMetadata is set, the
	// envoy.lb dynamic metadata the filters emitted, as JSON.
	DebugMetadataHeader = "x-infergate-debug-envoy-lb"
)

// Timeouts bound the proxy's work so that no request can hang.
type Timeouts struct {
	// Route bounds a whole request: ext_proc streams, upstream, response
	// streaming. Default 60s. A route's own timeout (xDS) can only shorten it.
	Route time.Duration
	// Connect bounds an upstream connect, like a cluster's connect_timeout. Default 5s.
	Connect time.Duration
	// Shutdown is the grace period for in-flight requests when Serve stops. Default 5s.
	Shutdown time.Duration
}

func (t *Timeouts) setDefaults() {
	setDefault(&t.Route, 60*time.Second)
	setDefault(&t.Connect, 5*time.Second)
	setDefault(&t.Shutdown, 5*time.Second)
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// Config configures a Proxy from flags: one filter chain, every request
// routed to one cluster.
type Config struct {
	// Filters run in order on the request path and in reverse order on the
	// response path, as an Envoy HTTP filter chain does.
	Filters []extprocfilter.FilterConfig
	// FilterHosts lists, by filter name, every host of a filter's
	// processor cluster when it has more than its Target (replicas).
	FilterHosts map[string][]string
	// Routing defaults to RoutingOverrideHost.
	Routing RoutingMode
	// FallbackEndpoints (ip:port) are used round robin when no filter picked
	// an endpoint, like the cluster's normal load balancing.
	FallbackEndpoints []string
	Timeouts          Timeouts
	// DebugMetadata adds DebugMetadataHeader to responses so a developer
	// (or the demo) can see what the picker said, scores included.
	DebugMetadata bool
	// KeepClientDestination keeps a client's own x-gateway-destination-endpoint
	// headers. By default they are removed before the first filter, as the
	// gateway integrations do: otherwise, with the picker failing open, the
	// client would choose its upstream. Keep them only to test Envoy's
	// handling of the header itself.
	KeepClientDestination bool
	Logger                logr.Logger
}

// Proxy is a loopback HTTP/1.1 reverse proxy that runs its requests through
// ext_proc filters the way Envoy does: one listener's HTTP connection
// manager. It is an http.Handler.
type Proxy struct {
	tbl        atomic.Pointer[table]
	timeouts   Timeouts
	debug      bool
	transport  *http.Transport
	log        logr.Logger
	owned      []*extprocfilter.Client // the clients whose channels to close
	ownedConns []*grpc.ClientConn      // flag mode: the processors' channels
	health     *healthChecks           // flag mode: the processors' health checks
	closers    sync.WaitGroup
	closeOnce  sync.Once
}

// clientDestinationHeaders are the routing headers a client may not send.
var clientDestinationHeaders = []string{wire.DestinationEndpointKey, wire.SubsetKey, wire.ServedEndpointKey}

// flagCluster names the one cluster of a flag-configured proxy.
const flagCluster = "envoysim"

// New builds a flag-configured proxy: the filters in order, then one route
// for every request to a cluster that honours the picker per cfg.Routing.
func New(cfg Config) (*Proxy, error) {
	cl := &cluster{name: flagCluster, anyHost: true, walkList: true}
	switch cfg.Routing {
	case "", RoutingOverrideHost:
		cl.override = &overrideHost{sources: []hostSource{
			{md: &metadataKey{namespace: wire.LBNamespace, path: []string{wire.DestinationEndpointKey}}},
			{header: wire.DestinationEndpointKey},
		}}
	case RoutingOriginalDstHeader:
		cl.originalDst = &originalDst{header: wire.DestinationEndpointKey}
	default:
		return nil, fmt.Errorf("routing %q: want %s or %s", cfg.Routing, RoutingOverrideHost, RoutingOriginalDstHeader)
	}
	for _, s := range cfg.FallbackEndpoints {
		ep, err := ParseEndpoint(s)
		if err != nil {
			return nil, fmt.Errorf("fallback endpoints: %w", err)
		}
		cl.endpoints = append(cl.endpoints, ep)
	}
	p := newProxy(cfg.Timeouts, cfg.DebugMetadata, cfg.Logger)
	cl.connectTimeout = p.timeouts.Connect
	t := &table{clusters: map[string]*cluster{flagCluster: cl}, streamIdle: defaultStreamIdleTimeout}
	var clients []*extprocfilter.Client
	if !cfg.KeepClientDestination {
		t.filters = append(t.filters, &httpFilter{name: "strip-client-destination", removeRequestHeaders: clientDestinationHeaders})
		clients = append(clients, nil)
	}
	p.health = newHealthChecks(context.Background, func() {}, nil)
	for _, fc := range cfg.Filters {
		hosts := cfg.FilterHosts[fc.Name]
		if len(hosts) == 0 {
			hosts = []string{fc.Target}
		}
		c, conns, err := flagFilterClient(fc, hosts, p.health)
		if err != nil {
			_ = p.Close()
			return nil, err
		}
		p.ownedConns = append(p.ownedConns, conns...)
		clients = append(clients, c)
		t.filters = append(t.filters, &httpFilter{name: fc.Name, client: c})
	}
	prefix := "/"
	t.routes = &routeConfig{name: flagCluster, vhosts: []*virtualHost{{name: flagCluster, domains: []string{"*"}, routes: []*route{{
		name: flagCluster, match: routeMatch{prefix: &prefix}, filters: clients,
		clusters: []weightedCluster{{name: flagCluster, weight: 1}},
	}}}}}
	p.tbl.Store(t)
	return p, nil
}

// newProxy makes a proxy with no table yet; the caller stores one.
func newProxy(timeouts Timeouts, debug bool, log logr.Logger) *Proxy {
	timeouts.setDefaults()
	p := &Proxy{timeouts: timeouts, debug: debug, log: log}
	p.transport = &http.Transport{
		Proxy:               nil, // never an HTTP(S)_PROXY from the environment
		DialContext:         p.dial,
		DisableCompression:  true, // pass bodies through byte for byte
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     60 * time.Second,
	}
	return p
}

type connectTimeoutKey struct{}

// dial applies the chosen cluster's connect_timeout.
func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	timeout := p.timeouts.Connect
	if d, ok := ctx.Value(connectTimeoutKey{}).(time.Duration); ok && d > 0 {
		timeout = d
	}
	return (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext(ctx, network, addr)
}

// Serve serves on ln until ctx ends, then drains in-flight requests for up to
// Timeouts.Shutdown and closes the proxy.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeouts.Shutdown)
		if serr := srv.Shutdown(sctx); serr != nil {
			_ = srv.Close()
		}
		cancel()
		err = <-errc
	}
	_ = p.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close waits for background stream closes and releases the gRPC channels
// the proxy owns.
func (p *Proxy) Close() error {
	var errs []error
	p.closeOnce.Do(func() {
		p.closers.Wait()
		for _, c := range p.owned {
			errs = append(errs, c.Close())
		}
		for _, c := range p.ownedConns {
			errs = append(errs, c.Close())
		}
		if p.health != nil {
			p.health.closeAll()
		}
		if p.transport != nil {
			p.transport.CloseIdleConnections()
		}
	})
	return errors.Join(errs...)
}

var errTimeout = errors.New("timeout")

// exchange is one filter's stream for one request, with the client (and so
// the config) it was opened with.
type exchange struct {
	*extprocfilter.Exchange
	client *extprocfilter.Client
}

// request is the state of one request as it crosses the filter chain.
type request struct {
	exs []exchange
	// steps are the filters that act on the response, in request order.
	steps []respStep
	// t is the table the request started with; rt the route the router
	// took (nil before the router, or none).
	t  *table
	rt *route
	// rv is the request's random value (Envoy's stream id): route matches
	// and the weighted cluster pick draw from it.
	rv uint64
	// router is the metadata the router writes (override_host's
	// selected_host_key).
	router map[string]*structpb.Struct
	// sources are the filters that set dynamic metadata, in filter order.
	sources []metadataSource
	// md caches the stream's dynamic metadata: what the filters set (an
	// ext_proc filter: what its server sent), merged by namespace in filter
	// order, then the router's. stale marks it out of date after a filter
	// could have added to it.
	md    map[string]*structpb.Struct
	stale bool
}

// metadataSource is one filter's dynamic metadata: an ext_proc exchange's,
// which grows as its server answers, or what a filter set once.
type metadataSource struct {
	ex  *exchange
	set map[string]*structpb.Struct
}

// respStep is one filter on the response path: an ext_proc exchange, or
// istio.metadata_exchange with what it saw of the request.
type respStep struct {
	ex   *exchange
	peer *peerMetadataFilter
	pc   peerCtx
}

// metadata returns the stream's dynamic metadata, rebuilt only when an
// exchange may have changed it since.
func (rq *request) metadata() map[string]*structpb.Struct {
	if rq.md == nil || rq.stale {
		md := make(map[string]*structpb.Struct, len(rq.sources)+len(rq.router))
		for _, src := range rq.sources {
			if src.ex != nil {
				mergeMetadata(md, src.ex.DynamicMetadata())
			} else {
				mergeMetadata(md, src.set)
			}
		}
		mergeMetadata(md, rq.router)
		rq.md, rq.stale = md, false
	}
	return rq.md
}

func mergeMetadata(dst, src map[string]*structpb.Struct) {
	for ns, s := range src {
		cur := dst[ns]
		if cur == nil {
			cur = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			dst[ns] = cur
		}
		for k, v := range s.GetFields() {
			cur.Fields[k] = v
		}
	}
}

// forwarded selects metadata_options.forwarding_namespaces from the stream's metadata.
func (rq *request) forwarded(names []string) map[string]*structpb.Struct {
	out := make(map[string]*structpb.Struct, len(names))
	for _, ns := range names {
		if s := rq.metadata()[ns]; s != nil {
			out[ns] = proto.Clone(s).(*structpb.Struct)
		}
	}
	return out
}

// ServeHTTP proxies one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t := p.tbl.Load()
	ctx, cancel := context.WithTimeoutCause(r.Context(), p.timeouts.Route, errTimeout)
	defer cancel()
	idleCtx, idleCancel := context.WithCancelCause(ctx)
	defer idleCancel(nil)
	if idle := newIdleStream(w, r, t.streamIdle, idleCancel); idle != nil {
		ctx, w = idleCtx, idle
		r.Body = idle.body(r.Body)
		defer idle.finish()
	}
	// The streams get their own context so that, when the request ends
	// normally, they can be half-closed gracefully after the handler returns;
	// a client that leaves or a route timeout still cancels them at once.
	exCtx, exCancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, exCancel)
	rq := &request{router: map[string]*structpb.Struct{}, t: t, rv: rand.Uint64()} //nolint:gosec // Envoy's stream id: load spreading, not security
	defer func() {
		stop()
		p.closers.Add(1)
		go func() {
			defer p.closers.Done()
			for _, ex := range rq.exs {
				_ = ex.Close()
				if err := ex.FailedOpen(); err != nil {
					// Envoy counts these (ext_proc stat failure_mode_allowed,
					// ext_proc.cc Filter::logFailOpen); the stand-in names
					// them, as a request that skipped its picker went
					// wherever the fallback sent it.
					p.log.Info("ext_proc failed open", "filter", ex.client.Config().Name, "path", r.URL.Path, "reason", err.Error())
				}
			}
			exCancel()
		}()
	}()

	hdrs := requestHeaders(r)
	if !t.proxy100Continue && strings.EqualFold(hdrs.Get("expect"), "100-continue") {
		// Envoy answers 100 Continue itself and removes the header before
		// the filters (ActiveStream::decodeHeaders); Go's server sends the
		// 100 when the body is first read.
		hdrs.Del("expect")
	}
	if !t.keepXFCC {
		// The connection has no client certificate: a client's XFCC is
		// removed before the filters (mutateXfccRequestHeader).
		hdrs.Del("x-forwarded-client-cert")
	}
	var body extprocfilter.Body
	if r.ContentLength != 0 {
		body = extprocfilter.BodyFromReader(r.Body, r.ContentLength)
	}
	// Envoy matches the route when a filter first asks for it and keeps it
	// until a filter clears the route cache.
	rv := rq.rv
	rt := t.match(hdrs, rv)
	routeIdle(w, rt)
	first := rt
	for i, f := range t.filters {
		if !t.inChain(first, i) {
			continue
		}
		if f.removeRequestHeaders != nil {
			hdrs = hdrs.Clone()
			for _, name := range f.removeRequestHeaders {
				hdrs.Del(name)
			}
			continue
		}
		if f.headerRules != nil {
			var md map[string]*structpb.Struct
			hdrs, md = applyHeaderRules(f.headerRules, hdrs)
			rq.sources = append(rq.sources, metadataSource{set: md})
			rq.stale = true
			continue
		}
		if f.peer != nil {
			var pc peerCtx
			name, c := t.routeCluster(rt, rv)
			hdrs, pc = f.peer.onRequest(hdrs, name, c)
			rq.steps = append(rq.steps, respStep{peer: f.peer, pc: pc})
			continue
		}
		if f.healthCheck != nil {
			if matchesAll(f.healthCheck, hdrs) {
				closeBody(body)
				p.localReply(ctx, w, rq, http.StatusOK, "")
				return
			}
			continue
		}
		c := t.clientFor(rt, i)
		if c == nil {
			continue
		}
		ex := exchange{Exchange: c.Open(exCtx), client: c}
		rq.exs = append(rq.exs, ex)
		rq.sources = append(rq.sources, metadataSource{ex: &ex})
		rq.steps = append(rq.steps, respStep{ex: &ex})
		var err error
		if mo := c.Config().MetadataOptions; mo != nil {
			hdrs, body, err = ex.RequestWithMetadata(hdrs, body, rq.forwarded(mo.Forwarding))
		} else {
			hdrs, body, err = ex.Request(hdrs, body)
		}
		if err != nil {
			p.requestFailed(ctx, w, rq, err)
			return
		}
		rq.stale = true
		if (f.alwaysRematch && ex.HeaderMutated()) || (f.rematch && ex.ClearRouteCache()) {
			rt = t.match(hdrs, rv)
		}
	}
	p.route(ctx, w, t, rt, rq, hdrs, body)
}

func matchesAll(ms []headerMatch, h extprocfilter.Headers) bool {
	for _, m := range ms {
		if !m.matches(h) {
			return false
		}
	}
	return true
}

// routeCluster is the cluster a request with random value rv goes to on
// rt, as filters see it (Envoy's upstream cluster info, fixed when the route
// is matched): "" and nil without one.
func (t *table) routeCluster(rt *route, rv uint64) (string, *cluster) {
	if rt == nil || len(rt.clusters) == 0 {
		return "", nil
	}
	name := rt.cluster(rv)
	return name, t.clusters[name]
}

// route is the router filter: the route's action, the cluster's host
// choice, the upstream request (with the route's retries) and the
// response path.
func (p *Proxy) route(ctx context.Context, w http.ResponseWriter, t *table, rt *route, rq *request, hdrs extprocfilter.Headers, body extprocfilter.Body) {
	rq.rt = rt
	routeIdle(w, rt)
	if rt == nil {
		closeBody(body)
		// Envoy's router answers a request no route matches with an empty 404.
		p.localReply(ctx, w, rq, http.StatusNotFound, "")
		return
	}
	if rt.direct != nil {
		closeBody(body)
		p.localReply(ctx, w, rq, rt.direct.status, rt.direct.body)
		return
	}
	timeout := rt.timeout
	if rt.maxGrpcTimeout != nil && isGrpcRequest(hdrs) {
		// FilterUtility::finalTimeout: the grpc-timeout header (none:
		// infinity), capped at max_grpc_timeout unless that is 0.
		gt, _ := grpcTimeout(hdrs)
		if m := *rt.maxGrpcTimeout; m != 0 && (gt == 0 || gt > m) {
			gt = m
		}
		timeout = gt
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, timeout, errTimeout)
		defer cancel()
	}
	// A resolved route has one cluster, or weighted ones without filter
	// configuration: any is the one picked at the first match.
	cl := t.clusters[rt.cluster(rq.rv)]
	if cl == nil {
		closeBody(body)
		// cluster_not_found: an empty local reply, 503 unless the route
		// says otherwise.
		status := rt.clusterNotFound
		if status == 0 {
			status = http.StatusServiceUnavailable
		}
		p.localReply(ctx, w, rq, status, "")
		return
	}
	if cl.walkList {
		p.routeList(ctx, w, rt, cl, rq, hdrs, body)
		return
	}
	p.attempts(ctx, w, t, rt, cl, rq, hdrs, body)
}

// selectHost writes override_host's selected_host_key, as Envoy does each
// time the policy chooses a host.
func selectHost(cl *cluster, rq *request, host string) {
	if cl.override != nil && cl.override.selected != nil {
		cl.override.selected.set(rq.router, host)
		rq.stale = true
	}
}

// attempts sends the request to the cluster's host, and again to the host
// the cluster chooses next as long as the route's retry policy says so:
// after a connection failure or reset, or response headers it retries,
// waiting Envoy's jittered back-off between attempts, while the body sent
// so far fits the retry buffer. The last attempt's response, or its
// failure, is the answer.
func (p *Proxy) attempts(ctx context.Context, w http.ResponseWriter, t *table, rt *route, cl *cluster, rq *request, hdrs extprocfilter.Headers, body extprocfilter.Body) {
	rp := rt.retry
	// Envoy's router applies the route's header changes before it chooses
	// the host (router.cc Filter::decodeHeaders: finalizeRequestHeaders,
	// then chooseHost and createConnPool, since Envoy 1.35), so a header
	// the route removes is gone for the load balancer too.
	hdrs = rt.finalizeHeaders(hdrs)
	hp := newHostPicker(cl, hdrs, rq.metadata(), rt.clusters[rt.pickCluster(rq.rv)].lbMatch)
	host, err := hp.pick(rp, false)
	if err != nil {
		closeBody(body)
		p.log.Info("no upstream", "path", hdrs.Get(":path"), "cluster", cl.name, "reason", err.Error())
		p.routerReply(ctx, w, rq, err, false)
		return
	}
	if len(hp.notMembers) > 0 {
		// Envoy says this at trace level only (override_host
		// load_balancer.cc LoadBalancerImpl::getEndpoint); here it names a
		// picker's choice that the cluster's endpoints lack.
		p.log.Info("override host not in the cluster: fallback policy", "cluster", cl.name, "hosts", hp.notMembers, "chosen", host)
	}
	selectHost(cl, rq, host)
	var (
		br *extprocfilter.BodyReader
		rb *replayBody
	)
	if body != nil {
		br = extprocfilter.NewBodyReader(ctx, body)
		defer br.Close()
		limit := t.bufferLimit
		if rt.bufferLimit > 0 {
			limit = rt.bufferLimit
		}
		if limit <= 0 {
			limit = defaultBufferLimit
		}
		rb = newReplayBody(br, limit)
	}
	var retriesLeft uint32
	if rp != nil {
		retriesLeft = rp.numRetries
	}
	cctx := context.WithValue(ctx, connectTimeoutKey{}, cl.connectTimeout)
	for attempt := 1; ; attempt++ {
		ah := hdrs
		if rt.attemptCount {
			ah = hdrs.Clone()
			ah.Set("x-envoy-attempt-count", strconv.Itoa(attempt))
		}
		var reqBody io.ReadCloser
		if rb != nil {
			reqBody = rb.attempt()
		}
		resp, err := p.send(cctx, cl, host, ah, reqBody)
		var lr *extprocfilter.LocalReply
		bodyFailed := br != nil && errors.As(br.Err(), &lr)
		retry := false
		if rp != nil && retriesLeft > 0 && !bodyFailed && (rb == nil || rb.replayable()) && ctx.Err() == nil {
			if err != nil {
				retry = rp.retriesReset(isConnectFailure(err))
			} else {
				retry = rp.retriesResponse(resp.Header, resp.StatusCode)
			}
		}
		if retry {
			if resp != nil {
				_ = resp.Body.Close()
			}
			retriesLeft--
			// Envoy counts these (upstream_rq_retry); named here, as a retry
			// moves the request off the host the picker chose.
			status := 0
			if resp != nil {
				status = resp.StatusCode
			}
			p.log.Info("retrying", "endpoint", host, "cluster", cl.name, "attempt", attempt, "status", status, "error", fmt.Sprint(err))
			if !sleepCtx(ctx, rp.backoff(attempt)) {
				err = errTimeout
			} else if host, err = hp.pick(rp, true); err == nil {
				selectHost(cl, rq, host)
				continue
			}
		}
		if rb != nil {
			rb.seal()
		}
		if err != nil {
			closeBody(body)
			if bodyFailed {
				// A filter ended the request while its body was streaming upstream.
				writeLocalReply(w, lr)
				return
			}
			if context.Cause(ctx) == errTimeout {
				err = errTimeout
			}
			p.log.Error(err, "upstream failed", "endpoint", host, "cluster", cl.name, "attempts", attempt)
			p.routerReply(ctx, w, rq, err, attempt > 1)
			return
		}
		defer resp.Body.Close()
		var respBody extprocfilter.Body
		if resp.Body != http.NoBody {
			respBody = extprocfilter.BodyFromReader(resp.Body, resp.ContentLength)
		}
		p.respond(ctx, w, rq, responseHeaders(resp), respBody, host)
		return
	}
}

// sleepCtx waits d, or until ctx ends (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// send is one attempt to host through its transport socket.
func (p *Proxy) send(ctx context.Context, cl *cluster, host string, hdrs extprocfilter.Headers, body io.ReadCloser) (*http.Response, error) {
	if cl.transportFor(host).kind == secretNotSupplied {
		// Envoy's NotReadySslSocket: the connection fails as it is made.
		if body != nil {
			_ = body.Close()
		}
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errSecretNotSupplied}
	}
	req, err := upstreamRequest(ctx, host, hdrs, body)
	if err != nil {
		return nil, err
	}
	return p.transport.RoundTrip(req)
}

// routeList is flag mode's router: the hosts of an override list tried in
// turn while connections are refused, with no retry policy.
func (p *Proxy) routeList(ctx context.Context, w http.ResponseWriter, rt *route, cl *cluster, rq *request, hdrs extprocfilter.Headers, body extprocfilter.Body) {
	hdrs = rt.finalizeHeaders(hdrs)
	targets, err := cl.targets(hdrs, rq.metadata())
	if err != nil {
		closeBody(body)
		p.log.Info("no upstream", "path", hdrs.Get(":path"), "cluster", cl.name, "reason", err.Error())
		p.routerReply(ctx, w, rq, err, false)
		return
	}
	var br *extprocfilter.BodyReader
	if body != nil {
		br = extprocfilter.NewBodyReader(ctx, body)
		defer br.Close()
	}
	resp, served, err := p.forward(context.WithValue(ctx, connectTimeoutKey{}, cl.connectTimeout), cl, hdrs, br, targets)
	if err != nil {
		closeBody(body)
		var lr *extprocfilter.LocalReply
		if br != nil && errors.As(br.Err(), &lr) {
			// A filter ended the request while its body was streaming upstream.
			writeLocalReply(w, lr)
			return
		}
		if context.Cause(ctx) == errTimeout {
			err = errTimeout
		}
		p.log.Error(err, "upstream failed", "endpoint", served, "cluster", cl.name)
		p.routerReply(ctx, w, rq, err, false)
		return
	}
	defer resp.Body.Close()
	selectHost(cl, rq, served)
	var rb extprocfilter.Body
	if resp.Body != http.NoBody {
		rb = extprocfilter.BodyFromReader(resp.Body, resp.ContentLength)
	}
	p.respond(ctx, w, rq, responseHeaders(resp), rb, served)
}

// finalizeHeaders applies the route's header changes on the way upstream.
func (rt *route) finalizeHeaders(h extprocfilter.Headers) extprocfilter.Headers {
	if len(rt.removeHeaders) == 0 && rt.hostRewrite == "" && rt.prefixRewrite == "" {
		return h
	}
	h = h.Clone()
	for _, name := range rt.removeHeaders {
		h.Del(name)
	}
	if rt.hostRewrite != "" {
		h.Set(":authority", rt.hostRewrite)
	}
	if rt.prefixRewrite != "" && rt.match.prefix != nil {
		h.Set(":path", rt.prefixRewrite+strings.TrimPrefix(h.Get(":path"), *rt.match.prefix))
	}
	return h
}

// closeBody drops a request body nobody will send upstream, so that filters
// still streaming it back do not block the response path behind it.
func closeBody(b extprocfilter.Body) {
	if b != nil {
		_ = b.Close()
	}
}

func (p *Proxy) requestFailed(ctx context.Context, w http.ResponseWriter, rq *request, err error) {
	var lr *extprocfilter.LocalReply
	switch {
	case errors.As(err, &lr):
		if lr.Err != nil {
			p.log.Info("ext_proc local reply", "status", lr.Status, "details", lr.Details)
		}
		writeLocalReply(w, lr)
	case context.Cause(ctx) == errTimeout:
		writeTimeout(w)
	default:
		// The client went away; nobody is left to answer.
		p.log.V(1).Info("request abandoned", "error", err.Error())
	}
}

// routerReply answers an upstream failure with the router's local reply;
// retried says the request was retried.
func (p *Proxy) routerReply(ctx context.Context, w http.ResponseWriter, rq *request, err error, retried bool) {
	status, msg := upstreamError(err, retried)
	p.localReply(ctx, w, rq, status, msg)
}

// localReply answers with a local reply of the router itself, which, unlike
// an ext_proc reply, passes through the filters' response path, unless the
// request's time is already up.
func (p *Proxy) localReply(ctx context.Context, w http.ResponseWriter, rq *request, status int, msg string) {
	if ctx.Err() != nil {
		writeLocalReply(w, &extprocfilter.LocalReply{Status: status, Body: []byte(msg)})
		return
	}
	h, b := routerReply(status, msg)
	p.respond(ctx, w, rq, h, b, "")
}

func writeTimeout(w http.ResponseWriter) {
	writeLocalReply(w, &extprocfilter.LocalReply{Status: http.StatusGatewayTimeout, Body: []byte("request timeout")})
}

// forward sends the request to the first target that accepts a connection.
// Walking to the next target is only safe while the body has not been read,
// since the proxy keeps no copy of it.
func (p *Proxy) forward(ctx context.Context, cl *cluster, hdrs extprocfilter.Headers, br *extprocfilter.BodyReader, targets []string) (*http.Response, string, error) {
	for i, target := range targets {
		var body io.ReadCloser
		if br != nil {
			body = attemptBody{br}
		}
		resp, err := p.send(ctx, cl, target, hdrs, body)
		if err == nil {
			return resp, target, nil
		}
		if isConnectFailure(err) && (br == nil || !br.Touched()) && i+1 < len(targets) {
			p.log.V(1).Info("endpoint refused, trying the next", "endpoint", target, "error", err.Error())
			continue
		}
		return nil, target, err
	}
	return nil, "", errNoHealthyUpstream
}

// respond runs the response path through the filters in reverse order and
// streams the result to the client, flushing every chunk so server-sent
// events arrive as they are produced. served is the endpoint that answered
// ("" for a local reply).
func (p *Proxy) respond(ctx context.Context, w http.ResponseWriter, rq *request, h extprocfilter.Headers, b extprocfilter.Body, served string) {
	for i := len(rq.steps) - 1; i >= 0; i-- {
		st := rq.steps[i]
		if st.peer != nil {
			name, c := rq.t.routeCluster(rq.rt, rq.rv)
			h = st.peer.onResponse(h, st.pc, name, c)
			continue
		}
		ex := *st.ex
		var err error
		if mo := ex.client.Config().MetadataOptions; mo != nil {
			h, b, err = ex.ResponseWithMetadata(h, b, rq.forwarded(mo.Forwarding))
		} else {
			h, b, err = ex.Response(h, b, served)
		}
		rq.stale = true
		if err != nil {
			var lr *extprocfilter.LocalReply
			switch {
			case errors.As(err, &lr):
				writeLocalReply(w, lr)
			case context.Cause(ctx) == errTimeout:
				writeTimeout(w)
			}
			return
		}
	}
	status, err := strconv.Atoi(h.Get(":status"))
	if err != nil {
		status = http.StatusBadGateway
	}
	out := w.Header()
	for _, kv := range h {
		if !strings.HasPrefix(kv.Key, ":") && !hopByHop(kv.Key) {
			out.Add(kv.Key, kv.Value)
		}
	}
	if served != "" {
		out.Set(UpstreamHeader, served)
	}
	if p.debug {
		if lb := rq.metadata()[wire.LBNamespace]; lb != nil {
			if js, err := protojson.Marshal(lb); err == nil {
				out.Set(DebugMetadataHeader, string(js))
			}
		}
	}
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	if b == nil {
		return
	}
	defer b.Close()
	for {
		c, err := b.Next(ctx)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			// The response has started, so Envoy can only reset the stream.
			p.log.Error(err, "response aborted")
			panic(http.ErrAbortHandler)
		}
		if len(c.Data) > 0 {
			if _, err := w.Write(c.Data); err != nil {
				return
			}
			_ = rc.Flush()
		}
		if c.EndOfStream {
			return
		}
	}
}

// attemptBody keeps the request body open when the transport gives up on a
// connection before reading it, so the next endpoint can still be tried.
type attemptBody struct{ *extprocfilter.BodyReader }

func (b attemptBody) Close() error {
	if b.Touched() {
		return b.BodyReader.Close()
	}
	return nil
}

// upstreamRequest builds the request to target; body nil means none.
func upstreamRequest(ctx context.Context, target string, hdrs extprocfilter.Headers, body io.ReadCloser) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, hdrs.Get(":method"), "http://"+target+hdrs.Get(":path"), body)
	if err != nil {
		return nil, fmt.Errorf("building upstream request: %w", err)
	}
	req.Host = hdrs.Get(":authority")
	req.ContentLength = 0
	if body != nil {
		req.ContentLength = -1
	}
	for _, kv := range hdrs {
		switch {
		case strings.HasPrefix(kv.Key, ":"), hopByHop(kv.Key):
		case kv.Key == "content-length":
			if n, err := strconv.ParseInt(kv.Value, 10, 64); err == nil && body != nil {
				req.ContentLength = n
			}
		default:
			req.Header.Add(kv.Key, kv.Value)
		}
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = nil // Go would add its own; Envoy adds none
	}
	return req, nil
}

func writeLocalReply(w http.ResponseWriter, lr *extprocfilter.LocalReply) {
	out := w.Header()
	for _, kv := range lr.Headers {
		if !strings.HasPrefix(kv.Key, ":") && !hopByHop(kv.Key) {
			out.Add(kv.Key, kv.Value)
		}
	}
	if len(lr.Body) > 0 && out.Get("Content-Type") == "" {
		out.Set("Content-Type", "text/plain")
	}
	out.Set("Content-Length", strconv.Itoa(len(lr.Body)))
	w.WriteHeader(lr.Status)
	_, _ = w.Write(lr.Body)
}

// requestHeaders builds the header map Envoy's HTTP/1 codec would: pseudo
// headers first, names lower case, hop-by-hop headers dropped. Go does not
// keep the arrival order, so regular headers are sorted.
func requestHeaders(r *http.Request) extprocfilter.Headers {
	h := extprocfilter.Headers{{Key: ":authority", Value: r.Host}, {Key: ":path", Value: r.RequestURI}, {Key: ":method", Value: r.Method}, {Key: ":scheme", Value: "http"}}
	return appendHeaders(h, r.Header)
}

func responseHeaders(resp *http.Response) extprocfilter.Headers {
	return appendHeaders(extprocfilter.Headers{{Key: ":status", Value: strconv.Itoa(resp.StatusCode)}}, resp.Header)
}

func appendHeaders(h extprocfilter.Headers, hdr http.Header) extprocfilter.Headers {
	keys := make([]string, 0, len(hdr))
	for k := range hdr {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		if hopByHop(lk) || lk == "host" {
			continue
		}
		for _, v := range hdr[k] {
			h.Add(lk, v)
		}
	}
	return h
}
