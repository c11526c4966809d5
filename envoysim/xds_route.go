package envoysim

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// hcmBuild is what building one connection manager's routes needs.
type hcmBuild struct {
	procs       []extProcFilter
	passThrough map[string]bool // names of pass-through HTTP filters
	table       *table
	targets     map[string]grpcTarget
	env         buildEnv
}

func (hb *hcmBuild) routes(rc *routev3.RouteConfiguration) (*routeConfig, error) {
	if err := checkFields("route configuration", rc); err != nil {
		return nil, err
	}
	out := &routeConfig{name: rc.GetName(), ignorePort: rc.GetIgnorePortInHostMatching()}
	domains := map[string]string{} // domain → virtual host
	for i, vh := range rc.GetVirtualHosts() {
		where := fmt.Sprintf("virtual_hosts[%d] %q", i, vh.GetName())
		if err := checkFields(where, vh); err != nil {
			return nil, err
		}
		ovh := &virtualHost{name: vh.GetName()}
		var vhRetry *retryPolicy
		if rp := vh.GetRetryPolicy(); rp != nil {
			var err error
			if vhRetry, err = buildRetryPolicy(where+".retry_policy", rp); err != nil {
				return nil, err
			}
		}
		for _, d := range vh.GetDomains() {
			d = strings.ToLower(d)
			if other, dup := domains[d]; dup {
				// Envoy rejects a route configuration that lists a domain twice.
				return nil, fmt.Errorf("%s: domain %q is also in virtual host %q", where, d, other)
			}
			domains[d] = vh.GetName()
			ovh.domains = append(ovh.domains, d)
		}
		for j, r := range vh.GetRoutes() {
			rwhere := fmt.Sprintf("%s.routes[%d] %q", where, j, r.GetName())
			or, err := hb.route(rwhere, r, vh, rc)
			if err != nil {
				return nil, err
			}
			if or.retry == nil {
				// A route without its own policy takes its virtual host's.
				or.retry = vhRetry
			}
			or.attemptCount = vh.GetIncludeRequestAttemptCount()
			ovh.routes = append(ovh.routes, or)
		}
		out.vhosts = append(out.vhosts, ovh)
	}
	return out, nil
}

func (hb *hcmBuild) route(where string, r *routev3.Route, vh *routev3.VirtualHost, rc *routev3.RouteConfiguration) (*route, error) {
	if err := checkFields(where, r); err != nil {
		return nil, err
	}
	out := &route{name: r.GetName()}
	m, err := buildMatch(where+".match", r.GetMatch())
	if err != nil {
		return nil, err
	}
	out.match = m
	switch a := r.GetAction().(type) {
	case *routev3.Route_Route:
		if err := buildAction(where+".route", a.Route, out, hb.table); err != nil {
			return nil, err
		}
		if b := r.GetPerRequestBufferLimitBytes(); b != nil {
			out.bufferLimit = int(b.GetValue())
		}
	case *routev3.Route_DirectResponse:
		dr := a.DirectResponse
		if err := checkFields(where+".direct_response", dr); err != nil {
			return nil, err
		}
		body, err := dataSource(where+".direct_response.body", dr.GetBody())
		if err != nil {
			return nil, err
		}
		out.direct = &directResponse{status: int(dr.GetStatus()), body: string(body)}
	default:
		return nil, fmt.Errorf("%s: only route and direct_response actions are implemented by the stand-in", where)
	}
	// Envoy's header changes: the route's, then its virtual host's, then its
	// route configuration's.
	out.removeHeaders = append(out.removeHeaders, r.GetRequestHeadersToRemove()...)
	out.removeHeaders = append(out.removeHeaders, vh.GetRequestHeadersToRemove()...)
	out.removeHeaders = append(out.removeHeaders, rc.GetRequestHeadersToRemove()...)
	levels := []map[string]*anypb.Any{rc.GetTypedPerFilterConfig(), vh.GetTypedPerFilterConfig(), r.GetTypedPerFilterConfig()}
	if out.chain, out.filters, err = hb.routeFilters(where, levels); err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(out.clusters, func(c weightedCluster) bool { return len(c.perFilter) > 0 }) {
		return out, nil
	}
	// A weighted cluster's typed_per_filter_config is the most specific
	// level for the requests that take it; which filters are in the chain
	// is still the route's (WeightedClusterEntry leaves filterDisabled to
	// its route).
	for i, c := range out.clusters {
		v := *out
		v.clusters = []weightedCluster{c}
		cwhere := fmt.Sprintf("%s.route.weighted_clusters.clusters[%d]", where, i)
		for name, cfg := range c.perFilter {
			if cfg.GetTypeUrl() == filterConfigType {
				// Whether Envoy lets a weighted cluster take a filter in or
				// out of the chain is not reproduced.
				return nil, fmt.Errorf("%s.typed_per_filter_config[%q]: a FilterConfig on a weighted cluster is not implemented by the stand-in", cwhere, name)
			}
		}
		if _, v.filters, err = hb.routeFilters(cwhere, append(slices.Clone(levels), c.perFilter)); err != nil {
			return nil, err
		}
		out.variants = append(out.variants, &v)
	}
	return out, nil
}

func buildMatch(where string, m *routev3.RouteMatch) (routeMatch, error) {
	var out routeMatch
	if err := checkFields(where, m); err != nil {
		return out, err
	}
	switch ps := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		out.prefix = &ps.Prefix
	case *routev3.RouteMatch_Path:
		out.path = &ps.Path
	case *routev3.RouteMatch_PathSeparatedPrefix:
		out.separated = &ps.PathSeparatedPrefix
	case *routev3.RouteMatch_SafeRegex:
		re, err := compileRegex(where+".safe_regex", ps.SafeRegex, true)
		if err != nil {
			return out, err
		}
		out.regex = re
	default:
		return out, fmt.Errorf("%s: path specifier %T is not implemented by the stand-in", where, ps)
	}
	if cs := m.GetCaseSensitive(); cs != nil && !cs.GetValue() {
		out.caseInsensitive = true
	}
	for i, h := range m.GetHeaders() {
		hm, err := buildHeaderMatch(fmt.Sprintf("%s.headers[%d]", where, i), h)
		if err != nil {
			return out, err
		}
		out.headers = append(out.headers, hm)
	}
	if rf := m.GetRuntimeFraction(); rf != nil {
		if err := checkAll(where+".runtime_fraction", rf, rf.GetDefaultValue()); err != nil {
			return out, err
		}
		den, ok := map[typev3.FractionalPercent_DenominatorType]uint64{
			typev3.FractionalPercent_HUNDRED: 100, typev3.FractionalPercent_TEN_THOUSAND: 10_000, typev3.FractionalPercent_MILLION: 1_000_000,
		}[rf.GetDefaultValue().GetDenominator()]
		if !ok {
			return out, fmt.Errorf("%s.runtime_fraction: denominator %v is not one Envoy knows", where, rf.GetDefaultValue().GetDenominator())
		}
		out.fraction = &fraction{numerator: min(uint64(rf.GetDefaultValue().GetNumerator()), den), denominator: den}
	}
	return out, nil
}

// compileRegex compiles an RE2 regex; anchored makes it match the whole
// value, as Envoy's safe_regex route and header matches do.
func compileRegex(where string, rm *matcherv3.RegexMatcher, anchored bool) (*regexp.Regexp, error) {
	if err := checkFields(where, rm); err != nil {
		return nil, err
	}
	expr := rm.GetRegex()
	if anchored {
		expr = `^(?:` + expr + `)$`
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return re, nil
}

func buildHeaderMatch(where string, h *routev3.HeaderMatcher) (headerMatch, error) {
	out := headerMatch{name: strings.ToLower(h.GetName()), invert: h.GetInvertMatch()}
	if err := checkFields(where, h); err != nil {
		return out, err
	}
	// The deprecated specifiers are StringMatchers by another name.
	var sm *matcherv3.StringMatcher
	switch s := h.GetHeaderMatchSpecifier().(type) {
	case nil:
		// No specifier: the header must be present.
		present := true
		out.present = &present
		return out, nil
	case *routev3.HeaderMatcher_PresentMatch:
		out.present = &s.PresentMatch
		return out, nil
	case *routev3.HeaderMatcher_ExactMatch:
		sm = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s.ExactMatch}}
	case *routev3.HeaderMatcher_PrefixMatch:
		sm = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: s.PrefixMatch}}
	case *routev3.HeaderMatcher_SuffixMatch:
		sm = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: s.SuffixMatch}}
	case *routev3.HeaderMatcher_ContainsMatch:
		sm = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Contains{Contains: s.ContainsMatch}}
	case *routev3.HeaderMatcher_SafeRegexMatch:
		sm = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: s.SafeRegexMatch}}
		where += ".safe_regex_match"
	case *routev3.HeaderMatcher_StringMatch:
		sm = s.StringMatch
		where += ".string_match"
	default:
		return out, fmt.Errorf("%s: %T is not implemented by the stand-in", where, s)
	}
	str, err := buildStringMatch(where, sm)
	out.str = str
	return out, err
}

// buildStringMatch reads a StringMatcher; safe_regex matches the whole value.
func buildStringMatch(where string, m *matcherv3.StringMatcher) (*stringMatch, error) {
	if err := checkFields(where, m); err != nil {
		return nil, err
	}
	out := &stringMatch{ignoreCase: m.GetIgnoreCase()}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		out.exact = &p.Exact
	case *matcherv3.StringMatcher_Prefix:
		out.prefix = &p.Prefix
	case *matcherv3.StringMatcher_Suffix:
		out.suffix = &p.Suffix
	case *matcherv3.StringMatcher_Contains:
		out.contains = &p.Contains
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := compileRegex(where+".safe_regex", p.SafeRegex, true)
		if err != nil {
			return nil, err
		}
		out.regex = re
	default:
		return nil, fmt.Errorf("%s: %T is not implemented by the stand-in", where, p)
	}
	return out, nil
}

func buildAction(where string, a *routev3.RouteAction, out *route, t *table) error {
	if err := checkFields(where, a); err != nil {
		return err
	}
	if a.GetAutoHostRewrite().GetValue() {
		return fmt.Errorf("%s: auto_host_rewrite is not implemented by the stand-in", where)
	}
	if a.GetIncludeVhRateLimits().GetValue() {
		return fmt.Errorf("%s: include_vh_rate_limits is not implemented by the stand-in (no rate limits)", where)
	}
	switch cs := a.GetClusterSpecifier().(type) {
	case *routev3.RouteAction_Cluster:
		out.clusters = []weightedCluster{{name: cs.Cluster, weight: 1}}
	case *routev3.RouteAction_WeightedClusters:
		if err := checkFields(where+".weighted_clusters", cs.WeightedClusters); err != nil {
			return err
		}
		for i, c := range cs.WeightedClusters.GetClusters() {
			if err := checkFields(fmt.Sprintf("%s.weighted_clusters.clusters[%d]", where, i), c); err != nil {
				return err
			}
			out.clusters = append(out.clusters, weightedCluster{name: c.GetName(), weight: c.GetWeight().GetValue(), perFilter: c.GetTypedPerFilterConfig()})
		}
		if len(out.clusters) == 0 {
			return fmt.Errorf("%s: weighted_clusters without clusters", where)
		}
	default:
		return fmt.Errorf("%s: cluster specifier %T is not implemented by the stand-in", where, cs)
	}
	// metadata_match: only its envoy.lb namespace is criteria; a weighted
	// cluster's merge over the action's (RouteEntryImplBase,
	// WeightedClusterEntry in config_impl.cc).
	for i := range out.clusters {
		var own *corev3.Metadata
		if wc := a.GetWeightedClusters(); wc != nil {
			own = wc.GetClusters()[i].GetMetadataMatch()
		}
		out.clusters[i].lbMatch = lbCriteria(a.GetMetadataMatch(), own)
	}
	for _, wc := range out.clusters {
		if cl := t.clusters[wc.name]; cl != nil {
			if host := cl.routedTLS(); host != "" {
				return fmt.Errorf("%s: cluster %q reaches %s over TLS; upstream TLS to model servers is not implemented by the stand-in", where, wc.name, host)
			}
		}
	}
	// RouteAction.timeout: Envoy's default is 15s; 0 disables it.
	out.timeout = 15 * time.Second
	if d := a.GetTimeout(); d != nil {
		out.timeout = d.AsDuration()
	}
	if d := a.GetIdleTimeout(); d != nil {
		v := d.AsDuration()
		out.idleTimeout = &v
	}
	if d := a.GetMaxGrpcTimeout(); d != nil {
		v := d.AsDuration()
		out.maxGrpcTimeout = &v
	}
	switch a.GetClusterNotFoundResponseCode() {
	case routev3.RouteAction_SERVICE_UNAVAILABLE:
		out.clusterNotFound = http.StatusServiceUnavailable
	case routev3.RouteAction_NOT_FOUND:
		out.clusterNotFound = http.StatusNotFound
	case routev3.RouteAction_INTERNAL_SERVER_ERROR:
		out.clusterNotFound = http.StatusInternalServerError
	default:
		return fmt.Errorf("%s: cluster_not_found_response_code %s is not implemented by the stand-in", where, a.GetClusterNotFoundResponseCode())
	}
	if rp := a.GetRetryPolicy(); rp != nil {
		p, err := buildRetryPolicy(where+".retry_policy", rp)
		if err != nil {
			return err
		}
		out.retry = p
	}
	out.hostRewrite = a.GetHostRewriteLiteral()
	out.prefixRewrite = a.GetPrefixRewrite()
	return nil
}

// lbCriteria merges the envoy.lb filter metadata of route's and then
// cluster's metadata_match into criteria, nil when neither has any.
func lbCriteria(route, cluster *corev3.Metadata) map[string]*structpb.Value {
	var out map[string]*structpb.Value
	for _, md := range []*corev3.Metadata{route, cluster} {
		lb, ok := md.GetFilterMetadata()[lbNamespace]
		if !ok {
			continue
		}
		if out == nil {
			out = map[string]*structpb.Value{}
		}
		for k, v := range lb.GetFields() {
			out[k] = v
		}
	}
	return out
}
