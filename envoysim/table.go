package envoysim

import (
	"net"
	"regexp"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// table is everything one listener routes by: its HTTP filter chain, its
// route configuration and the clusters the routes name. It is built whole
// (from flags, or from xDS resources) and never changed afterwards; an
// update swaps in a new table, so a request in flight keeps the one it
// started with, as Envoy drains a listener's old configuration.
type table struct {
	filters  []*httpFilter
	routes   *routeConfig // nil: every request gets the router's 404
	clusters map[string]*cluster
	// proxy100Continue is HttpConnectionManager.proxy_100_continue: without
	// it, Envoy answers "Expect: 100-continue" itself and removes the
	// header before the filters.
	proxy100Continue bool
	// keepXFCC is HttpConnectionManager.forward_client_cert_details
	// ALWAYS_FORWARD_ONLY: under any other value Envoy removes a client's
	// x-forwarded-client-cert from a connection without a client
	// certificate, as all the stand-in's are (mutateXfccRequestHeader).
	keepXFCC bool
	// streamIdle is HttpConnectionManager.stream_idle_timeout (Envoy's
	// default, 300 s, when unset; 0 none).
	streamIdle time.Duration
	// bufferLimit is Listener.per_connection_buffer_limit_bytes (default
	// 1 MiB): how much request body a retry may replay, unless the route
	// sets its own limit.
	bufferLimit int
}

// httpFilter is one envoy.filters.http.ext_proc entry of
// HttpConnectionManager.http_filters.
type httpFilter struct {
	name string
	// client is the listener-level config.
	client *extprocfilter.Client
	// disabled is HttpFilter.disabled: the filter is in a request's chain
	// only if the route the request starts on enables it.
	disabled bool
	// rematch is whether a clear_route_cache answer makes the route be
	// matched again (ExternalProcessor.route_cache_action DEFAULT or CLEAR,
	// not disable_clear_route_cache).
	rematch bool
	// alwaysRematch is route_cache_action CLEAR: re-match after every
	// request-headers answer, whatever it says.
	alwaysRematch bool
	// healthCheck, when set, makes this entry envoy.filters.http.health_check
	// (non-pass-through): a request matching every header is answered 200.
	healthCheck []headerMatch
	// removeRequestHeaders, when set, makes this entry
	// envoy.filters.http.header_mutation removing those request headers.
	removeRequestHeaders []string
	// peer, when set, makes this entry Istio's istio.metadata_exchange.
	peer *peerMetadataFilter
	// headerRules, when set, makes this entry
	// envoy.filters.http.header_to_metadata.
	headerRules []headerRule
}

// routeConfig is a RouteConfiguration.
type routeConfig struct {
	name       string
	vhosts     []*virtualHost
	ignorePort bool
}

// virtualHost is a VirtualHost: the routes for a set of authorities.
type virtualHost struct {
	name    string
	domains []string // lower case, as Envoy matches them
	routes  []*route
}

// route is one Route with everything the proxy needs precomputed.
type route struct {
	name  string
	match routeMatch
	// chain[i] is what this route's typed_per_filter_config says of
	// table.filters[i] being in the chain of a request that starts here.
	chain []chainState
	// filters[i] is the client of table.filters[i] on this route, with the
	// typed_per_filter_config of every level merged in; nil means
	// ExtProcPerRoute.disabled.
	filters []*extprocfilter.Client
	// removeHeaders is request_headers_to_remove of the route, its virtual
	// host and its route configuration.
	removeHeaders []string
	// hostRewrite is RouteAction.host_rewrite_literal.
	hostRewrite string
	// prefixRewrite is RouteAction.prefix_rewrite.
	prefixRewrite string
	// timeout is RouteAction.timeout (0: none).
	timeout time.Duration
	// idleTimeout is RouteAction.idle_timeout (nil: the connection
	// manager's stream_idle_timeout; 0: none).
	idleTimeout *time.Duration
	// maxGrpcTimeout is RouteAction.max_grpc_timeout (nil: unset): a gRPC
	// request's timeout is then its grpc-timeout header (none: no
	// timeout), capped at this unless it is 0.
	maxGrpcTimeout *time.Duration
	// clusterNotFound is the status of the local reply when the cluster
	// does not exist (RouteAction.cluster_not_found_response_code).
	clusterNotFound int
	// retry is the route's retry policy, or its virtual host's (nil: none).
	retry *retryPolicy
	// attemptCount is VirtualHost.include_request_attempt_count: each
	// attempt carries x-envoy-attempt-count.
	attemptCount bool
	// bufferLimit is Route.per_request_buffer_limit_bytes (0: the
	// listener's): how much request body a retry may replay.
	bufferLimit int
	clusters    []weightedCluster
	// variants, when a weighted cluster carries typed_per_filter_config,
	// are this route once per cluster (in clusters' order), each with that
	// cluster alone and its configuration merged in.
	variants []*route
	direct   *directResponse
}

type weightedCluster struct {
	name   string
	weight uint32
	// perFilter is ClusterWeight.typed_per_filter_config, the most
	// specific level of a request that takes this cluster.
	perFilter map[string]*anypb.Any
	// lbMatch is the route's metadata_match criteria (envoy.lb), the
	// cluster's own merged over the route action's (nil: none).
	lbMatch map[string]*structpb.Value
}

// directResponse is Route.direct_response.
type directResponse struct {
	status int
	body   string
}

// pickCluster chooses among weighted_clusters by weight with the
// request's random value, as Envoy does when it resolves the route
// (WeightedClusterUtil::pickCluster with the stream id): a request re-matched
// after clear_route_cache takes the same cluster.
func (r *route) pickCluster(rv uint64) int {
	if len(r.clusters) == 1 {
		return 0
	}
	var total uint64
	for _, c := range r.clusters {
		total += uint64(c.weight)
	}
	if total == 0 {
		return 0
	}
	n := rv % total
	for i, c := range r.clusters {
		if n < uint64(c.weight) {
			return i
		}
		n -= uint64(c.weight)
	}
	return len(r.clusters) - 1
}

// cluster is the name of the cluster the request with random value rv
// takes on r.
func (r *route) cluster(rv uint64) string { return r.clusters[r.pickCluster(rv)].name }

// resolve is the route a request with random value rv takes: r itself, or,
// when r's weighted clusters carry filter configuration, the variant of the
// cluster picked, whose filters see that configuration as Envoy's
// WeightedClusterEntry makes them see it.
func (r *route) resolve(rv uint64) *route {
	if r == nil || len(r.variants) == 0 {
		return r
	}
	return r.variants[r.pickCluster(rv)]
}

// chainState is a route's word on one filter's place in the chain.
type chainState uint8

const (
	chainDefault  chainState = iota // no entry: HttpFilter.disabled decides
	chainEnabled                    // an entry other than a disabled FilterConfig
	chainDisabled                   // FilterConfig.disabled
)

// inChain says whether filter i is in the chain of a request that started
// on route rt. Envoy builds the filter chain once, from the first route
// matched; a later re-match changes filter configs, not the chain.
func (t *table) inChain(rt *route, i int) bool {
	if rt == nil || rt.chain == nil {
		return !t.filters[i].disabled
	}
	switch rt.chain[i] {
	case chainEnabled:
		return true
	case chainDisabled:
		return false
	}
	return !t.filters[i].disabled
}

// clientFor returns the client filter i runs with on rt (nil: skipped).
func (t *table) clientFor(rt *route, i int) *extprocfilter.Client {
	if rt == nil {
		return t.filters[i].client
	}
	return rt.filters[i]
}

// match finds the route for a request's current headers: the virtual host
// by :authority, then the first route whose match holds. nil means no route
// (Envoy answers 404 at the router).
//
// rv is the request's random value (Envoy's stream id), the same at every
// match: it draws runtime_fraction and picks a weighted cluster.
func (t *table) match(h extprocfilter.Headers, rv uint64) *route {
	if t.routes == nil {
		return nil
	}
	vh := t.routes.virtualHost(h.Get(":authority"))
	if vh == nil {
		return nil
	}
	for _, r := range vh.routes {
		if r.match.matches(h, rv) {
			return r.resolve(rv)
		}
	}
	return nil
}

// virtualHost picks by VirtualHost.domains with Envoy's precedence: an exact
// name, then the longest suffix wildcard ("*.example.com"), then the longest
// prefix wildcard ("example.*"), then "*". The authority is matched as sent,
// port included, unless RouteConfiguration.ignore_port_in_host_matching.
func (rc *routeConfig) virtualHost(authority string) *virtualHost {
	host := strings.ToLower(authority)
	if rc.ignorePort {
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
	}
	return rc.bestDomain(host)
}

func (rc *routeConfig) bestDomain(host string) *virtualHost {
	var (
		best     *virtualHost
		bestRank = -1
		bestLen  = -1
	)
	for _, vh := range rc.vhosts {
		for _, d := range vh.domains {
			rank, ok := domainRank(d, host)
			if !ok {
				continue
			}
			if rank > bestRank || (rank == bestRank && len(d) > bestLen) {
				best, bestRank, bestLen = vh, rank, len(d)
			}
		}
	}
	return best
}

// domainRank says whether domain d matches host and how strongly: exact 3,
// suffix wildcard 2, prefix wildcard 1, "*" 0.
func domainRank(d, host string) (int, bool) {
	switch {
	case d == "*":
		return 0, true
	case d == host:
		return 3, true
	case strings.HasPrefix(d, "*"):
		return 2, len(host) >= len(d) && strings.HasSuffix(host, d[1:])
	case strings.HasSuffix(d, "*"):
		return 1, len(host) >= len(d) && strings.HasPrefix(host, d[:len(d)-1])
	}
	return 0, false
}

// routeMatch is a RouteMatch: one path specifier plus header matchers.
type routeMatch struct {
	prefix          *string
	path            *string
	separated       *string // path_separated_prefix
	regex           *regexp.Regexp
	caseInsensitive bool // RouteMatch.case_sensitive false
	headers         []headerMatch
	// fraction, when set, is runtime_fraction's default value: the route
	// matches that share of the requests it would otherwise match, drawn
	// from the request's random value (the same at every match). Splitting one rule's traffic between routes by weight
	// this way (the first route takes w1/Σw, the next w2 of the rest...)
	// lets each share carry its own per-route filter configuration.
	fraction *fraction
}

// fraction is numerator/denominator.
type fraction struct{ numerator, denominator uint64 }

func (m *routeMatch) matches(h extprocfilter.Headers, rv uint64) bool {
	p := h.Get(":path")
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i] // Envoy matches the path without the query string
	}
	eq, hasPrefix := func(a, b string) bool { return a == b }, strings.HasPrefix
	if m.caseInsensitive {
		eq = strings.EqualFold
		hasPrefix = func(s, pre string) bool { return len(s) >= len(pre) && strings.EqualFold(s[:len(pre)], pre) }
	}
	switch {
	case m.prefix != nil && !hasPrefix(p, *m.prefix):
		return false
	case m.path != nil && !eq(p, *m.path):
		return false
	case m.separated != nil:
		// Matches the prefix exactly, or followed by "/".
		if !hasPrefix(p, *m.separated) || (len(p) > len(*m.separated) && p[len(*m.separated)] != '/') {
			return false
		}
	case m.regex != nil && !m.regex.MatchString(p):
		return false
	}
	for _, hm := range m.headers {
		if !hm.matches(h) {
			return false
		}
	}
	// Envoy's featureEnabled: random_value % denominator < numerator.
	if f := m.fraction; f != nil && rv%f.denominator >= f.numerator {
		return false
	}
	return true
}

// headerMatch is a HeaderMatcher. Envoy joins repeated headers with "," before
// matching a value.
type headerMatch struct {
	name    string
	invert  bool
	present *bool
	str     *stringMatch // nil with present: presence only
}

func (hm headerMatch) matches(h extprocfilter.Headers) bool {
	vals := h.Values(hm.name)
	var ok bool
	switch {
	case hm.present != nil:
		ok = (len(vals) > 0) == *hm.present
	case len(vals) == 0:
		// An absent header fails a value match, even inverted (Envoy's
		// treat_missing_header_as_empty is false by default).
		return false
	default:
		ok = hm.str.matches(strings.Join(vals, ","))
	}
	return ok != hm.invert
}

// stringMatch is a StringMatcher.
type stringMatch struct {
	exact, prefix, suffix, contains *string
	regex                           *regexp.Regexp
	ignoreCase                      bool
}

func (s *stringMatch) matches(v string) bool {
	cmp := v
	lower := func(x string) string { return x }
	if s.ignoreCase {
		lower = strings.ToLower
		cmp = strings.ToLower(v)
	}
	switch {
	case s.exact != nil:
		return cmp == lower(*s.exact)
	case s.prefix != nil:
		return strings.HasPrefix(cmp, lower(*s.prefix))
	case s.suffix != nil:
		return strings.HasSuffix(cmp, lower(*s.suffix))
	case s.contains != nil:
		return strings.Contains(cmp, lower(*s.contains))
	case s.regex != nil:
		return s.regex.MatchString(v)
	}
	return false
}
