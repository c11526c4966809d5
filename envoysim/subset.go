package envoysim

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// lbNamespace is the filter metadata namespace the subset load balancer
// reads, of hosts and of the request (Envoy's MetadataFilters ENVOY_LB).
const lbNamespace = "envoy.lb"

// subsetLB is Cluster.lb_subset_config: the hosts are grouped by the
// values of each selector's keys in their envoy.lb metadata, and a request
// goes to the group its metadata match criteria name exactly, else to the
// fallback.
type subsetLB struct {
	// selectors are the subset_selectors' keys, each sorted, with their
	// own fallback policy.
	selectors []subsetSelector
	// anyEndpoint is fallback_policy ANY_ENDPOINT (else NO_FALLBACK).
	anyEndpoint bool
	// subsets are the groups by criteria (subsetKey), built from every host
	// of the assignment whatever its health or priority.
	subsets map[string]*subset
}

type subsetSelector struct {
	keys []string
	// fallback is the selector's fallback_policy; NOT_DEFINED defers to
	// the cluster's.
	fallback clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_LbSubsetSelectorFallbackPolicy
}

// subset is one group: its hosts in assignment order with their
// priorities and EDS health, and its own round robin.
type subset struct {
	hosts []subsetHost
	next  atomic.Uint64
}

type subsetHost struct {
	addr     string
	priority uint32
	healthy  bool // EDS health status: not UNHEALTHY, DRAINING or TIMEOUT
}

// buildSubsetLB reads lb_subset_config. It NACKs what the stand-in does not
// reproduce: default subsets, keys-subset fallbacks, metadata fallback
// lists, list_as_any, single-host subsets, locality weights and
// panic_mode_any.
func buildSubsetLB(where string, sc *clusterv3.Cluster_LbSubsetConfig) (*subsetLB, error) {
	if err := checkFields(where, sc); err != nil {
		return nil, err
	}
	out := &subsetLB{subsets: map[string]*subset{}}
	switch sc.GetFallbackPolicy() {
	case clusterv3.Cluster_LbSubsetConfig_NO_FALLBACK:
	case clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT:
		out.anyEndpoint = true
	default:
		return nil, fmt.Errorf("%s.fallback_policy %s is not implemented by the stand-in", where, sc.GetFallbackPolicy())
	}
	if sc.GetMetadataFallbackPolicy() != clusterv3.Cluster_LbSubsetConfig_METADATA_NO_FALLBACK {
		return nil, fmt.Errorf("%s.metadata_fallback_policy %s is not implemented by the stand-in", where, sc.GetMetadataFallbackPolicy())
	}
	for i, s := range sc.GetSubsetSelectors() {
		sw := fmt.Sprintf("%s.subset_selectors[%d]", where, i)
		if err := checkFields(sw, s); err != nil {
			return nil, err
		}
		switch s.GetFallbackPolicy() {
		case clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NOT_DEFINED, clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NO_FALLBACK,
			clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_ANY_ENDPOINT:
		default:
			return nil, fmt.Errorf("%s.fallback_policy %s is not implemented by the stand-in", sw, s.GetFallbackPolicy())
		}
		if len(s.GetKeys()) == 0 {
			// Envoy: "all keys of a subset selector must be unique" and at
			// least one (SubsetSelectorImpl, cluster.proto validation).
			return nil, fmt.Errorf("%s: a selector needs at least one key", sw)
		}
		keys := slices.Clone(s.GetKeys())
		slices.Sort(keys)
		if len(slices.Compact(slices.Clone(keys))) != len(keys) {
			return nil, fmt.Errorf("%s: keys %q repeat a key", sw, s.GetKeys())
		}
		out.selectors = append(out.selectors, subsetSelector{keys: keys, fallback: s.GetFallbackPolicy()})
	}
	return out, nil
}

// add puts a host in the subset of each selector whose every key its
// envoy.lb metadata has (SubsetLoadBalancer::processSubsets,
// extractSubsetMetadata).
func (s *subsetLB) add(h subsetHost, lb *structpb.Struct) {
	for _, sel := range s.selectors {
		vals := make([]*structpb.Value, len(sel.keys))
		ok := true
		for i, k := range sel.keys {
			if vals[i], ok = lb.GetFields()[k]; !ok {
				break
			}
		}
		if !ok {
			continue
		}
		key := subsetKey(sel.keys, vals)
		g := s.subsets[key]
		if g == nil {
			g = &subset{}
			s.subsets[key] = g
		}
		if !slices.ContainsFunc(g.hosts, func(o subsetHost) bool { return o.addr == h.addr }) {
			g.hosts = append(g.hosts, h)
		}
	}
}

// subsetKey names a group by its sorted keys and their values. Values
// compare as Envoy's HashedValue does: by their protobuf encoding, so the
// string "1" and the number 1 differ.
func subsetKey(keys []string, vals []*structpb.Value) string {
	var b strings.Builder
	for i, k := range keys {
		v, _ := protojson.MarshalOptions{}.Marshal(vals[i]) // a Value always marshals
		fmt.Fprintf(&b, "%q=%s;", k, v)
	}
	return b.String()
}

// errNoSubset is the request matching no subset with the fallback
// NO_FALLBACK: Envoy's router then answers "no healthy upstream".
var errNoSubset = errors.New("no subset matches the request's metadata and the fallback policy is NO_FALLBACK")

// choose is SubsetLoadBalancer::chooseHostIteration for the criteria (the
// route's metadata_match with the request's envoy.lb metadata over it;
// nil: none): the subset whose keys are exactly the criteria's names and
// whose values are theirs, if it has hosts (health aside); else the
// selector's fallback, else the cluster's. ANY_ENDPOINT is the cluster's
// ordinary balancing over all its hosts.
func (s *subsetLB) choose(c *cluster, criteria map[string]*structpb.Value) ([]string, error) {
	if len(criteria) > 0 {
		keys := make([]string, 0, len(criteria))
		for k := range criteria {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		vals := make([]*structpb.Value, len(keys))
		for i, k := range keys {
			vals[i] = criteria[k]
		}
		if g := s.subsets[subsetKey(keys, vals)]; g != nil && len(g.hosts) > 0 {
			return g.choose(c)
		}
		switch s.selectorFallback(keys) {
		case clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NO_FALLBACK:
			return nil, fmt.Errorf("%w: %w", errNoHealthyUpstream, errNoSubset)
		case clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_ANY_ENDPOINT:
			return c.roundRobin()
		}
	}
	if !s.anyEndpoint {
		return nil, fmt.Errorf("%w: %w", errNoHealthyUpstream, errNoSubset)
	}
	return c.roundRobin()
}

// selectorFallback is the fallback policy tryFindSelectorFallbackParams
// finds for criteria named keys (sorted). Envoy keeps the selectors as a
// tree of their sorted keys, each node made by the first selector that
// passes through it and given a fallback only when that selector ends
// there: so the policy is that of the first selector whose keys start with
// keys, if its keys are exactly keys; otherwise NOT_DEFINED.
func (s *subsetLB) selectorFallback(keys []string) clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_LbSubsetSelectorFallbackPolicy {
	for _, sel := range s.selectors {
		if len(sel.keys) >= len(keys) && slices.Equal(sel.keys[:len(keys)], keys) {
			if len(sel.keys) == len(keys) {
				return sel.fallback
			}
			break
		}
	}
	return clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NOT_DEFINED
}

// choose takes the next host round robin among the subset's hosts at its
// best priority that has hosts EDS calls healthy, less those failing the
// cluster's health checks (unless too few pass: the panic threshold); with
// no EDS-healthy host, among all of them (Envoy's panic mode, which picks
// a host of a subset even if none is healthy).
func (g *subset) choose(c *cluster) ([]string, error) {
	best, found := uint32(0), false
	for _, h := range g.hosts {
		if h.healthy && (!found || h.priority < best) {
			best, found = h.priority, true
		}
	}
	var hosts []string
	for _, h := range g.hosts {
		if !found || (h.healthy && h.priority == best) {
			hosts = append(hosts, h.addr)
		}
	}
	hosts = c.health.usable(hosts)
	if len(hosts) == 0 {
		return nil, errNoHealthyUpstream
	}
	i := g.next.Add(1) - 1
	return []string{hosts[i%uint64(len(hosts))]}, nil
}
