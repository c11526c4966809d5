package envoysim

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// cluster is an upstream cluster reduced to how it picks a host.
type cluster struct {
	name string
	// keepalive is upstream_connection_options.tcp_keepalive (Enable
	// false: none, Envoy's default).
	sockopts extprocfilter.SocketOptions
	// endpoints are the hosts the normal load balancer takes round robin:
	// the healthy hosts of the lowest priority level of a STATIC or
	// STRICT_DNS load_assignment, or of the EDS ClusterLoadAssignment.
	endpoints []string
	// members are all the cluster's hosts, every priority and health
	// state: override_host may pick any of them.
	members map[string]bool
	// originalDst is set for an ORIGINAL_DST cluster: the host comes from
	// the request (original_dst_lb_config), never from endpoints.
	originalDst *originalDst
	// override is the override_host load-balancing policy: the host comes
	// from the first source that names a usable one, else from the
	// fallback policy (round robin over endpoints).
	override *overrideHost
	// subsets is lb_subset_config (nil: none): the host comes from the
	// subset the request's metadata match criteria name, else from the
	// fallback policy.
	subsets *subsetLB
	// anyHost lets override_host pick a host outside endpoints. Envoy skips
	// such hosts; flag mode has no endpoint set to check against.
	anyHost bool
	// walkList tries the next host of an override list when a connection is
	// refused. Envoy does that only through a route's retry policy; flag
	// mode always did it.
	walkList bool
	// transports is each member's transport socket (transport_socket_matches
	// by its metadata, else transport_socket); unlisted is the socket of a
	// host outside members (ORIGINAL_DST, flag mode): the choice for a host
	// without metadata. ownTLS is the cluster's transport_socket being TLS
	// with no transport_socket_matches, which every host would use.
	transports map[string]hostTransport
	unlisted   hostTransport
	ownTLS     bool
	// istioDisableMX and istioExternal are filter_metadata istio.disable_mx
	// and istio.external, read by istio.metadata_exchange.
	istioDisableMX, istioExternal bool
	// health is the hosts' active health checking (nil: none, every host
	// healthy).
	health *clusterHealth
	// connectTimeout is Cluster.connect_timeout (default 5s in Envoy).
	connectTimeout time.Duration
	next           atomic.Uint64 // round-robin position
}

// assignment is a load assignment read for routing: the hosts the normal
// load balancer takes, every host (members, and in assignment order with
// what the subset load balancer reads of it) and each host's transport
// socket.
type assignment struct {
	endpoints  []string
	members    map[string]bool
	transports map[string]hostTransport
	hosts      []assignedHost
}

// assignedHost is a host of an assignment with its envoy.lb filter
// metadata (nil: none).
type assignedHost struct {
	subsetHost
	lb *structpb.Struct
}

// transportFor returns the transport socket of connections to host.
func (c *cluster) transportFor(host string) hostTransport {
	if t, ok := c.transports[host]; ok {
		return t
	}
	return c.unlisted
}

// routedTLS names a host of the cluster a route would reach over TLS
// (the stand-in speaks plaintext HTTP/1.1 to routed hosts), or "".
func (c *cluster) routedTLS() string {
	if c.ownTLS || (c.originalDst != nil && c.unlisted.kind == acceptAnyTLS) {
		return "every host (" + c.unlisted.name + ")"
	}
	var hosts []string
	for host, t := range c.transports {
		if t.kind == acceptAnyTLS {
			hosts = append(hosts, host+" ("+t.name+")")
		}
	}
	if len(hosts) == 0 {
		return ""
	}
	slices.Sort(hosts)
	return hosts[0]
}

// hostSource is one override_host_sources entry: a request header or a key
// of the stream's dynamic metadata (MetadataKey: namespace and path).
type hostSource struct {
	header string
	md     *metadataKey
}

// originalDst is Cluster.original_dst_lb_config: metadata_key is read
// first, then (with use_http_header) the header.
type originalDst struct {
	md     *metadataKey
	header string // "" without use_http_header
}

// metadataKey is an envoy.type.metadata.v3.MetadataKey.
type metadataKey struct {
	namespace string
	path      []string
}

// overrideHost is envoy.load_balancing_policies.override_host.
type overrideHost struct {
	sources []hostSource
	// selected is selected_host_key: where the chosen host is written in
	// the stream's dynamic metadata, for filters to read on the response.
	selected *metadataKey
}

// targets returns the hosts to try for one request, in order.
func (c *cluster) targets(h extprocfilter.Headers, md map[string]*structpb.Struct) ([]string, error) {
	if c.originalDst != nil {
		v, ok := c.originalDst.host(h, md)
		if !ok {
			// Without the header (or metadata) ORIGINAL_DST falls back to
			// the connection's restored destination, which a proxy that
			// did not restore one lacks: no host.
			return c.roundRobin()
		}
		ep, err := ParseEndpoint(v)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errNoHealthyUpstream, err)
		}
		return []string{ep}, nil
	}
	if c.override != nil {
		for _, src := range c.override.sources {
			list := c.usable(parseList(src.value(h, md)))
			if len(list) == 0 {
				continue
			}
			if !c.walkList {
				list = list[:1]
			}
			return list, nil
		}
	}
	return c.roundRobin()
}

// usable drops the hosts override_host may not pick: those outside the
// cluster's endpoint set.
func (c *cluster) usable(list []string) []string {
	if c.anyHost {
		return list
	}
	list = slices.DeleteFunc(list, func(ep string) bool { return !c.members[ep] })
	// Hosts failing their health checks are skipped too (override_host
	// takes only hosts of override_host_status, healthy by default).
	return c.health.healthyOf(list)
}

func (c *cluster) roundRobin() ([]string, error) {
	eps := c.health.usable(c.endpoints)
	if n := len(eps); n > 0 {
		i := c.next.Add(1) - 1
		return []string{eps[i%uint64(n)]}, nil
	}
	return nil, errNoHealthyUpstream
}

// host is what ORIGINAL_DST connects to: the metadata value (the first
// element of a list), else the first instance of the header.
func (o *originalDst) host(h extprocfilter.Headers, md map[string]*structpb.Struct) (string, bool) {
	if o.md != nil {
		v := o.md.value(md)
		if lv := v.GetListValue(); lv != nil && len(lv.GetValues()) > 0 {
			return lv.GetValues()[0].GetStringValue(), true
		}
		if s := v.GetStringValue(); s != "" {
			return s, true
		}
	}
	if o.header == "" {
		return "", false
	}
	vals := h.Values(o.header)
	if len(vals) == 0 {
		return "", false
	}
	return vals[0], true
}

// value is what override_host reads from a source: a metadata string, or
// the first instance of the header; either may be a comma list.
func (s hostSource) value(h extprocfilter.Headers, md map[string]*structpb.Struct) string {
	if s.md != nil {
		return s.md.value(md).GetStringValue()
	}
	if vals := h.Values(s.header); len(vals) > 0 {
		return vals[0]
	}
	return ""
}

// value returns the value at the key, or nil.
func (k *metadataKey) value(md map[string]*structpb.Struct) *structpb.Value {
	s := md[k.namespace]
	var v *structpb.Value
	for i, seg := range k.path {
		v = s.GetFields()[seg]
		if i < len(k.path)-1 {
			s = v.GetStructValue()
		}
	}
	return v
}

// set writes value at the key, creating the namespace and nested structs.
func (k *metadataKey) set(md map[string]*structpb.Struct, value string) {
	s := md[k.namespace]
	if s == nil {
		s = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		md[k.namespace] = s
	}
	for _, seg := range k.path[:len(k.path)-1] {
		next := s.GetFields()[seg].GetStructValue()
		if next == nil {
			next = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			s.Fields[seg] = structpb.NewStructValue(next)
		}
		s = next
	}
	s.Fields[k.path[len(k.path)-1]] = structpb.NewStringValue(value)
}

// target is how a gRPC client reaches host: its transport socket and the
// cluster's connection options.
func (c *cluster) target(host string) grpcTarget {
	t := targetOf(host, c.transportFor(host))
	t.sockopts = c.sockopts
	return t
}
