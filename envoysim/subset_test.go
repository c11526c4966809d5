package envoysim

import (
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	headertometadatav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/envoysim/xdstest"
	"github.com/infergate/infergate/inference/wire"
)

// subsetCluster is a STATIC cluster whose hosts carry envoy.lb metadata
// (hosts[i] gets md[i]), with lb_subset_config sc; round robin starts at
// the first host.
func subsetCluster(t *testing.T, sc *clusterv3.Cluster_LbSubsetConfig, hosts []string, md []map[string]*structpb.Value, health []corev3.HealthStatus) *cluster {
	t.Helper()
	var eps []*endpointv3.LbEndpoint
	for i, h := range hosts {
		le := xdstest.Assignment("x", h).Endpoints[0].LbEndpoints[0]
		if md[i] != nil {
			le.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{lbNamespace: {Fields: md[i]}}}
		}
		if health != nil {
			le.HealthStatus = health[i]
		}
		eps = append(eps, le)
	}
	cl, _, _, err := buildCluster(&clusterv3.Cluster{
		Name: "pool", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}, LbSubsetConfig: sc,
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: "pool", Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: eps}}},
	}, &resources{}, xbEnv(t, xbResolve))
	if err != nil {
		t.Fatal(err)
	}
	cl.next.Store(0)
	return cl
}

func str(s string) *structpb.Value { return structpb.NewStringValue(s) }

// TestSubsetLoadBalancer: Envoy's subset load balancer
// (source/extensions/load_balancing_policies/subset/subset_lb.cc) as
// kgateway's pool cluster uses it and around it: the criteria must name a
// selector's keys exactly and every value must equal a host's (a comma list
// matches nothing); a subset is chosen whatever its hosts' health; else the
// selector's fallback when it has one, else the cluster's.
func TestSubsetLoadBalancer(t *testing.T) {
	const (
		a, b, c = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
		key     = wire.DestinationEndpointKey
	)
	byAddr := []map[string]*structpb.Value{{key: str(a)}, {key: str(b)}, {key: str(c)}}
	selector := func(fallback clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_LbSubsetSelectorFallbackPolicy, keys ...string) *clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector {
		return &clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{Keys: keys, FallbackPolicy: fallback}
	}
	kgateway := &clusterv3.Cluster_LbSubsetConfig{FallbackPolicy: clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT,
		SubsetSelectors: []*clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{selector(0, key)}}
	noFallback := &clusterv3.Cluster_LbSubsetConfig{SubsetSelectors: kgateway.SubsetSelectors}
	selectorNoFallback := &clusterv3.Cluster_LbSubsetConfig{FallbackPolicy: clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT,
		SubsetSelectors: []*clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{selector(clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NO_FALLBACK, key)}}
	// Envoy keeps selectors as a tree of sorted keys: [k, z] made first
	// leaves the node [k] without the fallback of the selector [k] after it.
	shadowed := &clusterv3.Cluster_LbSubsetConfig{FallbackPolicy: clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT,
		SubsetSelectors: []*clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{
			selector(clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NO_FALLBACK, "z", key),
			selector(clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NO_FALLBACK, key),
		}}
	twoKeys := &clusterv3.Cluster_LbSubsetConfig{SubsetSelectors: []*clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{selector(0, "zone", "model")}}
	zoned := []map[string]*structpb.Value{{"zone": str("x"), "model": str("m")}, {"zone": str("x"), "model": str("m")}, {"zone": str("y"), "model": str("m")}}

	unhealthyB := []corev3.HealthStatus{corev3.HealthStatus_HEALTHY, corev3.HealthStatus_UNHEALTHY, corev3.HealthStatus_HEALTHY}
	crit := func(kv ...any) map[string]*structpb.Value {
		out := map[string]*structpb.Value{}
		for i := 0; i+1 < len(kv); i += 2 {
			switch v := kv[i+1].(type) {
			case string:
				out[kv[i].(string)] = str(v)
			case float64:
				out[kv[i].(string)] = structpb.NewNumberValue(v)
			}
		}
		return out
	}
	cases := []struct {
		name     string
		sc       *clusterv3.Cluster_LbSubsetConfig
		md       []map[string]*structpb.Value
		health   []corev3.HealthStatus
		criteria map[string]*structpb.Value
		want     []string // successive picks; nil: no host
	}{
		{"the subset of the value", kgateway, byAddr, nil, crit(key, b), []string{b, b, b}},
		{"a value no host has: any endpoint", kgateway, byAddr, nil, crit(key, "10.9.9.9:8000"), []string{a, b, c, a}},
		{"a comma list matches no subset: any endpoint", kgateway, byAddr, nil, crit(key, c+","+b), []string{a, b, c}},
		{"no criteria: any endpoint", kgateway, byAddr, nil, nil, []string{a, b}},
		{"a key beside the selector's: any endpoint", kgateway, byAddr, nil, crit(key, b, "other", "x"), []string{a, b}},
		{"a number does not equal a string", kgateway, []map[string]*structpb.Value{{key: str("1")}, {key: str("2")}, {key: str("3")}}, nil, crit(key, 2.0), []string{a, b}},
		{"an EDS-unhealthy host alone in its subset is still chosen", kgateway, byAddr, unhealthyB, crit(key, b), []string{b, b}},
		{"no match, NO_FALLBACK", noFallback, byAddr, nil, crit(key, "10.9.9.9:8000"), nil},
		{"no criteria, NO_FALLBACK", noFallback, byAddr, nil, nil, nil},
		{"the selector's NO_FALLBACK over the cluster's ANY_ENDPOINT", selectorNoFallback, byAddr, nil, crit(key, "10.9.9.9:8000"), nil},
		{"other keys: the cluster's fallback", selectorNoFallback, byAddr, nil, crit("other", "x"), []string{a, b}},
		{"a selector shadowed by a longer one made first", shadowed, byAddr, nil, crit(key, "10.9.9.9:8000"), []string{a, b}},
		{"two keys: round robin within the subset", twoKeys, zoned, nil, crit("model", "m", "zone", "x"), []string{a, b, a}},
		{"two keys, one named: no subset", twoKeys, zoned, nil, crit("model", "m"), nil},
		{"hosts without the keys join no subset", kgateway, []map[string]*structpb.Value{nil, {key: str(b)}, {"other": str(c)}}, nil, crit(key, c), []string{a, b, c}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cl := subsetCluster(t, tc.sc, []string{a, b, c}, tc.md, tc.health)
			hp := newHostPicker(cl, nil, nil, tc.criteria)
			if tc.want == nil {
				if h, err := hp.pick(nil, false); !errors.Is(err, errNoHealthyUpstream) {
					t.Fatalf("picked %q, %v; want no healthy upstream", h, err)
				}
				return
			}
			var got []string
			for range tc.want {
				h, err := hp.pick(nil, false)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, h)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("picks %q, want %q", got, tc.want)
			}
		})
	}
}

// TestMatchCriteria: the router's criteria are the route's metadata_match
// (envoy.lb only; a weighted cluster's over the action's) with the
// request's envoy.lb dynamic metadata over them (router.h
// Filter::metadataMatchCriteria, config_impl.cc WeightedClusterEntry).
func TestMatchCriteria(t *testing.T) {
	md := func(ns string, kv ...string) *corev3.Metadata {
		s := &structpb.Struct{Fields: map[string]*structpb.Value{}}
		for i := 0; i+1 < len(kv); i += 2 {
			s.Fields[kv[i]] = str(kv[i+1])
		}
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{ns: s}}
	}
	request := func(kv ...string) map[string]*structpb.Struct {
		return md(lbNamespace, kv...).GetFilterMetadata()
	}
	flat := func(m map[string]*structpb.Value) map[string]string {
		if m == nil {
			return nil
		}
		out := map[string]string{}
		for k, v := range m {
			out[k] = v.GetStringValue()
		}
		return out
	}
	cases := []struct {
		name           string
		route, cluster *corev3.Metadata
		request        map[string]*structpb.Struct
		want           map[string]string
	}{
		{"nothing", nil, nil, nil, nil},
		{"another namespace is not criteria", md(xdstest.KgwSubsetHint, "k", "v"), nil, nil, nil},
		{"the route's", md(lbNamespace, "k", "r"), nil, nil, map[string]string{"k": "r"}},
		{"the cluster's over the route's", md(lbNamespace, "k", "r", "j", "r"), md(lbNamespace, "k", "c"), nil, map[string]string{"k": "c", "j": "r"}},
		{"the request's over the route's", md(lbNamespace, "k", "r", "j", "r"), nil, request("k", "q"), map[string]string{"k": "q", "j": "r"}},
		{"the request's alone", nil, nil, request("k", "q"), map[string]string{"k": "q"}},
		{"another request namespace is not criteria", nil, nil, md("other", "k", "q").GetFilterMetadata(), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := flat(matchCriteria(lbCriteria(tc.route, tc.cluster), tc.request))
			if !maps.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
				t.Fatalf("criteria %v, want %v", got, tc.want)
			}
		})
	}
}

// TestHeaderToMetadataRules: the filter's decodeHeaders as
// header_to_metadata_filter.cc writeHeaderToMetadata and filter_config.cc
// HeaderValueSelector::extract do it.
func TestHeaderToMetadataRules(t *testing.T) {
	rule := func(header, ns, key, value string, remove bool) headerRule {
		return headerRule{header: header, remove: remove, present: &metadataWrite{namespace: ns, key: key, value: value}}
	}
	missing := func(header, ns, key, value string) headerRule {
		return headerRule{header: header, missing: &metadataWrite{namespace: ns, key: key, value: value}}
	}
	dst := wire.DestinationEndpointKey
	long := strings.Repeat("x", maxMetadataValue)
	cases := []struct {
		name     string
		rules    []headerRule
		h        []string
		want     map[string]map[string]string
		wantHdrs []string // the header's values after the filter
	}{
		{"the header's value", []headerRule{rule(dst, lbNamespace, dst, "", false)}, []string{dst, "10.0.0.1:8000"},
			map[string]map[string]string{lbNamespace: {dst: "10.0.0.1:8000"}}, []string{"10.0.0.1:8000"}},
		{"every instance joined with a comma", []headerRule{rule(dst, lbNamespace, dst, "", false)}, []string{dst, "a", dst, "b"},
			map[string]map[string]string{lbNamespace: {dst: "a,b"}}, []string{"a", "b"}},
		{"removed after reading", []headerRule{rule(dst, lbNamespace, dst, "", true)}, []string{dst, "a"},
			map[string]map[string]string{lbNamespace: {dst: "a"}}, nil},
		{"a fixed value", []headerRule{rule(dst, lbNamespace, "seen", "yes", false)}, []string{dst, "a"},
			map[string]map[string]string{lbNamespace: {"seen": "yes"}}, []string{"a"}},
		{"an empty header writes nothing", []headerRule{rule(dst, lbNamespace, dst, "", false)}, []string{dst, ""}, map[string]map[string]string{}, []string{""}},
		{"8 KiB or more is not written", []headerRule{rule(dst, lbNamespace, dst, "", false)}, []string{dst, long}, map[string]map[string]string{}, []string{long}},
		{"the filter's own namespace by default", []headerRule{rule(dst, headerToMetadataNamespace, dst, "", false)}, []string{dst, "a"},
			map[string]map[string]string{headerToMetadataNamespace: {dst: "a"}}, []string{"a"}},
		{"missing: the fixed value", []headerRule{missing(dst, lbNamespace, "none", "1")}, nil, map[string]map[string]string{lbNamespace: {"none": "1"}}, nil},
		{"present: on_header_missing not applied", []headerRule{missing(dst, lbNamespace, "none", "1")}, []string{dst, "a"}, map[string]map[string]string{}, []string{"a"}},
		{"a later rule does not see a header an earlier one removed", []headerRule{rule(dst, lbNamespace, "first", "", true), missing(dst, lbNamespace, "second", "gone")},
			[]string{dst, "a"}, map[string]map[string]string{lbNamespace: {"first": "a", "second": "gone"}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := xbHeaders("gw", "/", tc.h...)
			before := h.Clone()
			out, md := applyHeaderRules(tc.rules, h)
			got := map[string]map[string]string{}
			for ns, s := range md {
				got[ns] = map[string]string{}
				for k, v := range s.GetFields() {
					got[ns][k] = v.GetStringValue()
				}
			}
			if !maps.EqualFunc(got, tc.want, maps.Equal) {
				t.Errorf("metadata %v, want %v", got, tc.want)
			}
			if vals := out.Values(dst); !slices.Equal(vals, tc.wantHdrs) {
				t.Errorf("header after %q, want %q", vals, tc.wantHdrs)
			}
			if !slices.Equal(h, before) {
				t.Error("the filter changed the headers it was given in place")
			}
		})
	}
}

// TestKgatewayShapeBuildsAndNACKs: kgateway's shape builds; what Envoy
// rejects of header_to_metadata and subsets, and what the stand-in does
// not reproduce, is NACKed naming it.
func TestKgatewayShapeBuildsAndNACKs(t *testing.T) {
	env := xbEnv(t, xbResolve)
	kgw := xdstest.Kgateway(xbPool)
	b, err := build(xbResources(t, kgw...), env)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	tb := b.listeners[0].table
	if len(tb.filters) != 2 || tb.filters[1].headerRules == nil || tb.clusters[xdstest.KgwPoolCluster].subsets == nil {
		t.Fatalf("filters %+v, pool cluster %+v", tb.filters, tb.clusters[xdstest.KgwPoolCluster])
	}
	// rule edits the header_to_metadata rule.
	rule := func(edit func(*headertometadatav3.Config_Rule)) func(r *resources) {
		return func(r *resources) {
			editKgwHeader(t, r, func(c *headertometadatav3.Config) { edit(c.GetRequestRules()[0]) })
		}
	}
	type h2mRule = headertometadatav3.Config_Rule
	subsets := func(r *resources) *clusterv3.Cluster_LbSubsetConfig {
		return r.clusters[xdstest.KgwPoolCluster].GetLbSubsetConfig()
	}
	cases := []struct {
		name   string
		mutate func(r *resources)
		want   string
	}{
		{"header_to_metadata cookie", rule(func(r *h2mRule) { r.Header, r.Cookie = "", "c" }), "cookie rules are not implemented"},
		{"header_to_metadata header and cookie", rule(func(r *h2mRule) { r.Cookie = "c" }), "Cannot specify both header and cookie"},
		{"header_to_metadata no header", rule(func(r *h2mRule) { r.Header = "" }), "One of Cookie or Header"},
		{"header_to_metadata neither present nor missing", rule(func(r *h2mRule) { r.OnHeaderPresent = nil }), "neither `on_header_present` nor `on_header_missing`"},
		{"header_to_metadata missing without value", rule(func(r *h2mRule) { r.OnHeaderMissing = &headertometadatav3.Config_KeyValuePair{Key: "k"} }), "on_header_missing rule with an empty value"},
		{"header_to_metadata NUMBER", rule(func(r *h2mRule) { r.OnHeaderPresent.Type = headertometadatav3.Config_NUMBER }), "type NUMBER is not implemented"},
		{"header_to_metadata BASE64", rule(func(r *h2mRule) { r.OnHeaderPresent.Encode = headertometadatav3.Config_BASE64 }), "encode BASE64 is not implemented"},
		{"header_to_metadata regex rewrite", rule(func(r *h2mRule) {
			r.OnHeaderPresent.RegexValueRewrite = &matcherv3.RegexMatchAndSubstitute{Pattern: &matcherv3.RegexMatcher{Regex: "a"}}
		}), "regex_value_rewrite is not implemented"},
		{"header_to_metadata response rules", func(r *resources) {
			editKgwHeader(t, r, func(c *headertometadatav3.Config) { c.ResponseRules = c.RequestRules })
		}, "response_rules are not implemented"},
		{"header_to_metadata per route", func(r *resources) {
			r.routes[xdstest.KgwRoutes].VirtualHosts[0].Routes[0].TypedPerFilterConfig[xdstest.KgwHeaderFilter] = xdstest.Any(&headertometadatav3.Config{})
		}, "per-route config of this filter is not implemented"},
		{"subset DEFAULT_SUBSET", func(r *resources) { subsets(r).FallbackPolicy = clusterv3.Cluster_LbSubsetConfig_DEFAULT_SUBSET }, "fallback_policy DEFAULT_SUBSET is not implemented"},
		{"subset selector KEYS_SUBSET", func(r *resources) {
			subsets(r).SubsetSelectors[0].FallbackPolicy = clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_KEYS_SUBSET
		}, "fallback_policy KEYS_SUBSET is not implemented"},
		{"subset FALLBACK_LIST", func(r *resources) {
			subsets(r).MetadataFallbackPolicy = clusterv3.Cluster_LbSubsetConfig_FALLBACK_LIST
		}, "metadata_fallback_policy FALLBACK_LIST is not implemented"},
		{"subset list_as_any", func(r *resources) { subsets(r).ListAsAny = true }, "list_as_any"},
		{"subset panic_mode_any", func(r *resources) { subsets(r).PanicModeAny = true }, "panic_mode_any"},
		{"subset single_host_per_subset", func(r *resources) { subsets(r).SubsetSelectors[0].SingleHostPerSubset = true }, "single_host_per_subset"},
		{"subset selector without keys", func(r *resources) { subsets(r).SubsetSelectors[0].Keys = nil }, "a selector needs at least one key"},
		{"subset on ORIGINAL_DST", func(r *resources) {
			c := r.clusters[xdstest.KgwPoolCluster]
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
			c.LbPolicy, c.LoadAssignment = clusterv3.Cluster_CLUSTER_PROVIDED, nil
		}, "lb_subset_config on an ORIGINAL_DST cluster"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := xbResources(t, kgw...)
			tc.mutate(r)
			_, err := build(r, env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("build: %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

// editKgwHeader rewrites the kgateway shape's header_to_metadata config.
func editKgwHeader(t *testing.T, r *resources, edit func(*headertometadatav3.Config)) {
	t.Helper()
	xbEditHCM(t, r.listeners[xdstest.KgwListener], func(hcm *hcmv3.HttpConnectionManager) {
		hf := hcm.GetHttpFilters()[1]
		c := &headertometadatav3.Config{}
		if err := hf.GetTypedConfig().UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		edit(c)
		hf.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: xdstest.Any(c)}
	})
}

// TestTrafficInTheKgatewayShape: requests through a node configured as
// kgateway configures a Gateway's Envoy. The picker's header reaches the
// subset load balancer through header_to_metadata, and so does its envoy.lb
// metadata, which the listener's filter receives; a comma list matches no
// subset and falls back to any endpoint. kgateway removes no client
// x-gateway-destination-endpoint header: with the picker down and the pool
// failing open, the client's header chooses the endpoint. (Those requests
// have no body: once body data has reached a FULL_DUPLEX_STREAMED filter it
// can no longer fail open, TestFailOpenNeedsNoBodyYet.)
func TestTrafficInTheKgatewayShape(t *testing.T) {
	a, b := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	cases := []struct {
		name     string
		epp      fakeproc.EPPOpts
		down     bool // the picker unreachable
		failOpen bool
		client   string // the client's own x-gateway-destination-endpoint
		want     []string
		status   int
	}{
		{name: "the picker's header", epp: fakeproc.EPPOpts{HeaderDest: b.Addr}, want: []string{b.Addr}, status: 200},
		{name: "the picker's envoy.lb metadata", epp: fakeproc.EPPOpts{MetadataDest: b.Addr}, want: []string{b.Addr}, status: 200},
		{name: "the picker's header over the client's", epp: fakeproc.EPPOpts{HeaderDest: b.Addr}, client: a.Addr, want: []string{b.Addr}, status: 200},
		{name: "a comma list: any endpoint", epp: fakeproc.EPPOpts{HeaderDest: b.Addr + "," + a.Addr}, want: []string{a.Addr, b.Addr}, status: 200},
		{name: "picker down, FailOpen: the client's header", down: true, failOpen: true, client: a.Addr, want: []string{a.Addr}, status: 200},
		{name: "picker down, FailClose", down: true, client: a.Addr, status: 500},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eppAddr := fakeproc.ClosedAddr(t)
			if !tc.down {
				eppAddr = fakeproc.Start(t, fakeproc.EPPHandler(tc.epp)).Addr
			}
			srv := xdstest.Start(t)
			srv.Set(t, "1", xdstest.Kgateway(xdstest.Pool{Endpoints: []string{a.Addr, b.Addr}, EPP: eppAddr, FailOpen: tc.failOpen, ListenerPort: 80})...)
			n := testNode(t, srv)
			url := listenerURL(t, n, xdstest.KgwListener) + "/v1/completions"
			var kv []string
			if tc.client != "" {
				kv = []string{wire.DestinationEndpointKey, tc.client}
			}
			seen := map[string]bool{}
			for range 6 {
				var resp *http.Response
				var body string
				if tc.down {
					resp, body = send(t, http.MethodGet, url, nil, kv...)
				} else {
					resp, body = get(t, url, kv...)
				}
				if resp.StatusCode != tc.status {
					t.Fatalf("%d %q, want %d", resp.StatusCode, body, tc.status)
				}
				if tc.status == 200 {
					seen[resp.Header.Get(UpstreamHeader)] = true
				}
			}
			if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, slices.Sorted(slices.Values(tc.want))) {
				t.Fatalf("served by %q, want %q", got, tc.want)
			}
		})
	}
}
