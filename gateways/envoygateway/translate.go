package envoygateway

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/gateways/internal/xdsbuild"
	"github.com/infergate/infergate/inference/wire"
)

// Names the extension gives what it adds, so a later translation (and a
// person reading a config dump) can tell them apart from Envoy Gateway's.
const (
	// FilterPrefix starts the name of each pool's ext_proc filter:
	// FilterPrefix + namespace/name.
	FilterPrefix = "envoy.filters.http.ext_proc/infergate/"
	// StripFilterName is the header_mutation filter that removes a client's
	// x-gateway-destination-endpoint before the pools' filters.
	StripFilterName = "envoy.filters.http.header_mutation/infergate"
	// PayloadFilterName and PayloadClusterName are the payload processor's
	// filter and cluster, when the extension adds it.
	PayloadFilterName  = "envoy.filters.http.ext_proc/infergate/payload"
	PayloadClusterName = "infergate/payload"
	// PayloadMetadataNamespace is where the payload processor reports token
	// usage (extproc/payload.MetadataNamespace).
	PayloadMetadataNamespace = "io.infergate.payload"
	// EPPClusterPrefix starts the name of each pool's picker cluster.
	EPPClusterPrefix = "infergate/epp/"
	// MetadataNamespace keys the pool a route serves in the route's
	// metadata, for PostTranslateModify to find.
	MetadataNamespace = "infergate.io/inferencepool"
	// ClusterDomain is the Kubernetes cluster domain of the pickers' Service names.
	ClusterDomain = "cluster.local"
)

// FilterName is the name of pool's ext_proc filter.
func FilterName(p *Pool) string { return FilterPrefix + p.Key() }

// EPPClusterName is the name of pool's picker cluster.
func EPPClusterName(p *Pool) string { return EPPClusterPrefix + p.Key() }

// ModifyRoute enables pool's picker on a route Envoy Gateway rendered for
// an HTTPRoute rule whose backend is the pool, and records the pool in the
// route's metadata. An invalid pool makes the route a 500 that names the
// problem; the rest of the configuration is unaffected.
func ModifyRoute(route *routev3.Route, p *Pool, perr error) (*routev3.Route, error) {
	out := proto.Clone(route).(*routev3.Route)
	if perr != nil {
		out.Action = &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
			Status: 500,
			Body:   &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: perr.Error() + "\n"}},
		}}
		return out, nil
	}
	if out.TypedPerFilterConfig == nil {
		out.TypedPerFilterConfig = map[string]*anypb.Any{}
	}
	out.TypedPerFilterConfig[FilterName(p)] = xdsbuild.Any(xdsbuild.PickerOnRoute(p.ResponseBody))
	poolRouteDefaults(out)
	return out, setRouteMetadata(out, []*Pool{p}, "")
}

// SplitRoute turns the route of an HTTPRoute rule whose backendRefs are
// several InferencePools (Envoy Gateway renders them as one cluster, base)
// into weighted clusters, one per pool (PoolClusterName), each enabling its
// own pool's picker: Envoy picks the cluster when it matches the route, and
// a weighted cluster's per-filter configuration applies to the requests
// that take it, so a pool's picker only ever chooses among its own pods.
// weights[i] is pools[i]'s; a pool of weight 0 gets no traffic, and a rule
// whose weights are all 0 answers 500, as Gateway API asks.
func SplitRoute(route *routev3.Route, pools []*Pool, weights []uint32) (*routev3.Route, error) {
	base := route.GetRoute().GetCluster()
	if base == "" {
		return nil, fmt.Errorf("route %q splits between pools but does not name one cluster", route.GetName())
	}
	var wcs []*routev3.WeightedCluster_ClusterWeight
	for i, p := range pools {
		if weights[i] == 0 {
			continue
		}
		wcs = append(wcs, &routev3.WeightedCluster_ClusterWeight{
			Name: PoolClusterName(base, p), Weight: wrapperspb.UInt32(weights[i]),
			TypedPerFilterConfig: map[string]*anypb.Any{FilterName(p): xdsbuild.Any(xdsbuild.PickerOnRoute(p.ResponseBody))},
		})
	}
	if len(wcs) == 0 {
		return ModifyRoute(route, nil, fmt.Errorf("%w: every backendRef of the rule has weight 0", ErrInvalidPool))
	}
	out := proto.Clone(route).(*routev3.Route)
	out.GetRoute().ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: wcs}}
	poolRouteDefaults(out)
	return out, setRouteMetadata(out, pools, base)
}

// poolRouteDefaults gives a pool's route what Envoy Gateway leaves unset
// when nothing asks for it: xdsbuild.FallbackRetries, so that Envoy walks
// the picker's fallback list, and a route timeout for generations,
// xdsbuild.RouteTimeout, instead of Envoy's 15 s. Envoy Gateway renders
// RouteAction.timeout only from the HTTPRoute rule's timeouts.request or a
// BackendTrafficPolicy's timeout.http.requestTimeout
// (internal/xds/translator/route.go getEffectiveRequestTimeout), and a
// retry policy only from a BackendTrafficPolicy: either, when set, decides.
//
// The route's idle_timeout, unless set, equals its timeout: Envoy
// Gateway's connection manager has stream_idle_timeout 300 s, which would
// end a generation that sends nothing for 5 minutes (a non-streamed answer
// sends nothing until it is done) before the route's own timeout; a
// route's idle_timeout overrides it (RouteAction.idle_timeout;
// source/common/router/router.cc Filter::decodeHeaders, which sets the
// stream's idle timeout from the route entry). A route without a timeout
// (0) keeps the connection manager's.
func poolRouteDefaults(r *routev3.Route) {
	ra := r.GetRoute()
	if ra == nil {
		return
	}
	if ra.RetryPolicy == nil {
		ra.RetryPolicy = xdsbuild.FallbackRetries()
	}
	if ra.Timeout == nil {
		ra.Timeout = durationpb.New(xdsbuild.RouteTimeout)
	}
	if ra.IdleTimeout == nil && ra.Timeout.AsDuration() > 0 {
		ra.IdleTimeout = durationpb.New(ra.Timeout.AsDuration())
	}
}

// PoolClusterName is pool p's share of a route split between pools whose
// rule Envoy Gateway rendered as the cluster base.
func PoolClusterName(base string, p *Pool) string { return base + "/inferencepool/" + p.Key() }

// setRouteMetadata records the pools a route serves (and, for a split
// route, the cluster Envoy Gateway rendered) for PostTranslateModify.
func setRouteMetadata(r *routev3.Route, pools []*Pool, split string) error {
	list := make([]any, len(pools))
	for i, p := range pools {
		list[i] = poolFields(p)
	}
	fields := map[string]any{"pools": list}
	if split != "" {
		fields["split"] = split
	}
	md, err := structpb.NewStruct(fields)
	if err != nil {
		return err
	}
	if r.Metadata == nil {
		r.Metadata = &corev3.Metadata{}
	}
	if r.Metadata.FilterMetadata == nil {
		r.Metadata.FilterMetadata = map[string]*structpb.Struct{}
	}
	r.Metadata.FilterMetadata[MetadataNamespace] = md
	return nil
}

// poolFields carry the pool into the route, so that PostTranslateModify
// renders the picker's filter and cluster from the same pool the route saw.
func poolFields(p *Pool) map[string]any {
	ports := make([]any, len(p.TargetPorts))
	for i, tp := range p.TargetPorts {
		ports[i] = float64(tp)
	}
	return map[string]any{
		"namespace": p.Namespace, "name": p.Name, "targetPorts": ports,
		"eppService": p.EPPService, "eppPort": float64(p.EPPPort),
		"failOpen": p.FailOpen, "responseBody": p.ResponseBody, "plaintext": p.Plaintext,
	}
}

func poolFromMetadata(s *structpb.Struct) *Pool {
	f := s.GetFields()
	p := &Pool{
		Namespace: f["namespace"].GetStringValue(), Name: f["name"].GetStringValue(),
		EPPService: f["eppService"].GetStringValue(), EPPPort: uint32(f["eppPort"].GetNumberValue()),
		FailOpen: f["failOpen"].GetBoolValue(), ResponseBody: f["responseBody"].GetBoolValue(), Plaintext: f["plaintext"].GetBoolValue(),
	}
	for _, v := range f["targetPorts"].GetListValue().GetValues() {
		p.TargetPorts = append(p.TargetPorts, int32(v.GetNumberValue()))
	}
	return p
}

// ModifyCluster turns the cluster Envoy Gateway rendered for the pool
// backend into the pool's endpoints behind the override_host policy: the
// host is the one the picker wrote in envoy.lb metadata (a client cannot
// write it, unlike a header), hosts outside the pool are never used, the
// host that served is reported back to the picker in envoy.lb, and without
// a pick (the picker failed open) Envoy balances over the pool round robin.
// With eds set, the endpoints come from the extension's EDS service
// (EDSName), so that pods coming and going reach Envoy without a
// translation; otherwise endpoints (ready pods × targetPorts, ip:port) are
// written into the cluster.
func ModifyCluster(c *clusterv3.Cluster, p *Pool, endpoints []string, eds *EDSServer) (*clusterv3.Cluster, error) {
	out := proto.Clone(c).(*clusterv3.Cluster)
	out.LbConfig = nil
	out.LbPolicy = clusterv3.Cluster_ROUND_ROBIN
	out.LoadAssignment, out.EdsClusterConfig = nil, nil
	if eds != nil {
		out.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
		out.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{ServiceName: EDSName(p), EdsConfig: eds.configSource()}
	} else {
		cla, err := loadAssignment(c.GetName(), endpoints)
		if err != nil {
			return nil, err
		}
		out.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}
		out.LoadAssignment = cla
	}
	out.LoadBalancingPolicy = &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
		TypedExtensionConfig: &corev3.TypedExtensionConfig{
			Name: "envoy.load_balancing_policies.override_host",
			TypedConfig: xdsbuild.Any(&overridehostv3.OverrideHost{
				OverrideHostSources: []*overridehostv3.OverrideHost_OverrideHostSource{{Metadata: lbKey(wire.DestinationEndpointKey)}},
				SelectedHostKey:     lbKey(wire.ServedEndpointKey),
				FallbackPolicy: &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
					TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "envoy.load_balancing_policies.round_robin", TypedConfig: xdsbuild.Any(&roundrobinv3.RoundRobin{})},
				}}},
			}),
		},
	}}}
	return out, nil
}

// hostPort is an ip:port as an Envoy socket address.
func hostPort(ep string) (*corev3.Address, error) {
	host, port, err := xdsbuild.HostPort(ep)
	if err != nil {
		return nil, fmt.Errorf("endpoint %q: %w", ep, err)
	}
	return xdsbuild.SocketAddress(host, port), nil
}

// Config is what the extension adds to a translation besides the pools'
// pickers. The zero Config adds nothing else.
type Config struct {
	// EDS, when set, serves the pools' endpoints (see EDSServer).
	EDS *EDSServer
	// Payload, when set, runs before the pickers on every listener that
	// serves a pool.
	Payload *Payload
	// ClientCert, when set, is presented to the pickers and the payload
	// processor over TLS, for processors that require client certificates
	// (--client-ca-file).
	ClientCert *ClientCert
}

// ClientCert is a PEM certificate chain and its private key, presented to
// processors that require client certificates.
type ClientCert = xdsbuild.ClientCert

// ModifyTranslation adds, for every pool some route serves, the picker's
// cluster and its ext_proc filter: disabled on the listener and enabled
// only by the pool's routes (ModifyRoute), inserted just before the router
// so that every other filter, the payload processor's included, runs first.
// A route split between pools (SplitRoute) gets one cluster per pool, made
// from the cluster Envoy Gateway rendered for the rule; without cfg.EDS
// their endpoints are read from endpoints.
func ModifyTranslation(ctx context.Context, clusters []*clusterv3.Cluster, listeners []*listenerv3.Listener, routes []*routev3.RouteConfiguration, cfg Config, endpoints Endpoints) ([]*clusterv3.Cluster, []*listenerv3.Listener, error) {
	eds, payload := cfg.EDS, cfg.Payload
	// Pools by route configuration.
	byRC := map[string][]*Pool{}
	pools := map[string]*Pool{}
	fields := map[string]*structpb.Value{}
	splits := map[string]splitShare{} // by cluster name
	for _, rc := range routes {
		seen := map[string]bool{}
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				md := r.GetMetadata().GetFilterMetadata()[MetadataNamespace]
				if md == nil {
					continue
				}
				base := md.GetFields()["split"].GetStringValue()
				for _, v := range md.GetFields()["pools"].GetListValue().GetValues() {
					p := poolFromMetadata(v.GetStructValue())
					if prev, ok := fields[p.Key()]; ok && !proto.Equal(prev, v) {
						return nil, nil, fmt.Errorf("pool %s rendered twice with different settings in one translation", p.Key())
					}
					fields[p.Key()], pools[p.Key()] = v, p
					if base != "" {
						splits[PoolClusterName(base, p)] = splitShare{base: base, pool: p}
					}
					if !seen[p.Key()] {
						seen[p.Key()] = true
						byRC[rc.GetName()] = append(byRC[rc.GetName()], p)
					}
				}
			}
		}
	}
	if len(pools) == 0 {
		return clusters, listeners, nil
	}
	outClusters := slices.Clone(clusters)
	for _, name := range slices.Sorted(maps.Keys(splits)) {
		c, err := splitCluster(ctx, clusters, name, splits[name], eds, endpoints)
		if err != nil {
			return nil, nil, err
		}
		outClusters = append(outClusters, c)
	}
	for _, k := range slices.Sorted(maps.Keys(pools)) {
		outClusters = append(outClusters, eppCluster(pools[k], cfg.ClientCert, eds))
	}
	if payload != nil {
		c, err := serverCluster(PayloadClusterName, payload.Address, payload.TLS, cfg.ClientCert)
		if err != nil {
			return nil, nil, err
		}
		outClusters = append(outClusters, c)
	}
	outListeners := make([]*listenerv3.Listener, len(listeners))
	for i, l := range listeners {
		nl, err := addFilters(l, byRC, payload)
		if err != nil {
			return nil, nil, fmt.Errorf("listener %q: %w", l.GetName(), err)
		}
		outListeners[i] = nl
	}
	return outClusters, outListeners, nil
}

// splitShare is one pool's cluster of a route split between pools.
type splitShare struct {
	base string // the cluster Envoy Gateway rendered for the rule
	pool *Pool
}

// splitCluster is the cluster name of a split route: the rule's cluster
// with the pool's endpoints (ModifyCluster).
func splitCluster(ctx context.Context, clusters []*clusterv3.Cluster, name string, sh splitShare, eds *EDSServer, endpoints Endpoints) (*clusterv3.Cluster, error) {
	i := slices.IndexFunc(clusters, func(c *clusterv3.Cluster) bool { return c.GetName() == sh.base })
	if i < 0 {
		return nil, fmt.Errorf("cluster %q of a route split between pools is not in the translation", sh.base)
	}
	c := proto.Clone(clusters[i]).(*clusterv3.Cluster)
	c.Name = name
	var eps []string
	if eds == nil {
		if endpoints == nil {
			return nil, fmt.Errorf("cluster %q: no endpoint source", name)
		}
		var err error
		if eps, err = endpoints.Endpoints(ctx, sh.pool); err != nil {
			return nil, fmt.Errorf("endpoints of pool %s: %w", sh.pool.Key(), err)
		}
	}
	return ModifyCluster(c, sh.pool, eps, eds)
}

// addFilters inserts the pools' filters into every HTTP connection manager
// of l whose routes (RDS or inline) serve a pool.
func addFilters(l *listenerv3.Listener, byRC map[string][]*Pool, payload *Payload) (*listenerv3.Listener, error) {
	out := proto.Clone(l).(*listenerv3.Listener)
	chains := slices.Clone(out.GetFilterChains())
	if out.GetDefaultFilterChain() != nil {
		chains = append(chains, out.GetDefaultFilterChain())
	}
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			if f.GetTypedConfig().GetTypeUrl() != "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager" {
				continue
			}
			hcm := &hcmv3.HttpConnectionManager{}
			if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
				return nil, err
			}
			rc := hcm.GetRds().GetRouteConfigName()
			if hcm.GetRouteConfig() != nil {
				rc = hcm.GetRouteConfig().GetName()
			}
			pools := byRC[rc]
			if len(pools) == 0 {
				continue
			}
			hcm.HttpFilters = insertBeforeRouter(hcm.GetHttpFilters(), pools, payload)
			a, err := anypb.New(hcm)
			if err != nil {
				return nil, err
			}
			f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
		}
	}
	return out, nil
}

func insertBeforeRouter(filters []*hcmv3.HttpFilter, pools []*Pool, payload *Payload) []*hcmv3.HttpFilter {
	at := len(filters)
	for i, f := range filters {
		if f.GetName() == "envoy.filters.http.router" {
			at = i
			break
		}
	}
	var add []*hcmv3.HttpFilter
	has := func(name string) bool {
		return slices.ContainsFunc(filters, func(f *hcmv3.HttpFilter) bool { return f.GetName() == name })
	}
	if payload != nil && !has(PayloadFilterName) {
		// On every route of the listener, not only the pools': the route
		// is chosen again once the processor has set the model headers, so
		// the first match may well be another route.
		add = append(add, xdsbuild.Filter(PayloadFilterName, xdsbuild.PayloadProcessor(PayloadClusterName, payload.FailOpen)))
	}
	if !has(StripFilterName) {
		// A client's own x-gateway-destination-endpoint never reaches the
		// picker or a model server (override_host does not read the header,
		// but an ORIGINAL_DST setup beside it would).
		add = append(add, xdsbuild.Filter(StripFilterName, xdsbuild.StripSteering()))
	}
	for _, p := range pools {
		if has(FilterName(p)) {
			continue
		}
		add = append(add, xdsbuild.Filter(FilterName(p), xdsbuild.IdlePicker(EPPClusterName(p), eppHost(p)+":"+strconv.Itoa(int(p.EPPPort)), p.FailOpen)))
	}
	return slices.Insert(slices.Clone(filters), at, add...)
}

func eppHost(p *Pool) string {
	return strings.Join([]string{p.EPPService, p.Namespace, "svc", ClusterDomain}, ".")
}

// serverCluster reaches a gRPC server of the extension's setup (the
// payload processor) at host:port over HTTP/2.
func serverCluster(name, addr string, useTLS bool, cert *ClientCert) (*clusterv3.Cluster, error) {
	host, port, err := xdsbuild.HostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%s address %q: %w", name, addr, err)
	}
	var tls *xdsbuild.TLS
	if useTLS {
		tls = &xdsbuild.TLS{SNI: host, ClientCert: cert}
	}
	return xdsbuild.GRPCCluster(name, host, port, tls), nil
}

// Payload is the payload processor the extension puts in front of the
// pools' pickers.
type Payload struct {
	Address  string // host:port, e.g. its Service
	TLS      bool   // TLS that accepts its self-signed certificate
	FailOpen bool
}

// eppCluster reaches the picker over HTTP/2, with TLS that accepts its
// self-signed certificate unless the pool says plaintext. With eds set its
// hosts are the ready addresses of the picker's Service, from the
// extension's EDS service (PickerEDSName): one host per replica, each
// health checked, so a rollout or a lost replica moves streams to the
// others. Without it the cluster resolves the Service's DNS name
// (STRICT_DNS): a cluster IP is one host, a headless Service one per pod.
func eppCluster(p *Pool, cert *ClientCert, eds *EDSServer) *clusterv3.Cluster {
	var tls *xdsbuild.TLS
	if !p.Plaintext {
		tls = &xdsbuild.TLS{SNI: eppHost(p), ClientCert: cert}
	}
	c := xdsbuild.GRPCCluster(EPPClusterName(p), eppHost(p), p.EPPPort, tls)
	if hc, err := xdsbuild.ProcessorHealthOf(p.HealthCheck); err == nil {
		c.HealthChecks = []*corev3.HealthCheck{hc} // poolOf admits no other value
	}
	if eds != nil {
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
		c.LoadAssignment = nil
		c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{ServiceName: PickerEDSName(p), EdsConfig: eds.configSource()}
	}
	return c
}

func lbKey(key string) *metadatav3.MetadataKey {
	return &metadatav3.MetadataKey{Key: wire.LBNamespace, Path: []*metadatav3.MetadataKey_PathSegment{
		{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: key}},
	}}
}
