package envoysim

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	healthcheckv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/health_check/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	leastrequestv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	randomv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/random/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// Names of the listener filters and HTTP filters by typed_config type.
const (
	httpConnectionManagerType = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
	extProcType               = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
	extProcPerRouteType       = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
	routerType                = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
	filterConfigType          = "type.googleapis.com/envoy.config.route.v3.FilterConfig"
	healthCheckType           = "type.googleapis.com/envoy.extensions.filters.http.health_check.v3.HealthCheck"
	headerMutationType        = "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
	upstreamTLSType           = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
)

// passThroughListenerFilters are listener filters that only inspect the
// connection for filter_chain_match, which the stand-in restricts to one
// plaintext HTTP chain.
var passThroughListenerFilters = map[string]string{
	"type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector":   "reads the TLS ClientHello for filter chain matching",
	"type.googleapis.com/envoy.extensions.filters.listener.http_inspector.v3.HttpInspector": "detects the HTTP version for filter chain matching",
}

// resources is one accepted state of the four xDS types, by resource name
// (endpoints by ClusterLoadAssignment.cluster_name).
type resources struct {
	listeners map[string]*listenerv3.Listener
	routes    map[string]*routev3.RouteConfiguration
	clusters  map[string]*clusterv3.Cluster
	endpoints map[string]*endpointv3.ClusterLoadAssignment
	// side holds load assignments from EDS servers other than ADS, by the
	// cluster that reaches the server, then by name.
	side map[string]map[string]*endpointv3.ClusterLoadAssignment
}

// builtListener is a listener ready to serve, or waiting for its route
// configuration (Envoy keeps such a listener warming).
type builtListener struct {
	name  string
	addr  string // the address the control plane gave it
	port  uint32
	table *table
	rds   string // route_config_name, "" when inline
	ready bool
}

// buildEnv is what translation needs beyond the resources.
type buildEnv struct {
	resolve func(host string) (string, error)
	log     logr.Logger
	// clientFor makes a client over a shared channel for cfg, whose Target
	// is the cluster's address and TLS its transport socket.
	clientFor func(cfg extprocfilter.FilterConfig) (*extprocfilter.Client, error)
	// static is set when the resources come from a bootstrap's
	// static_resources: there is no ADS stream to fetch EDS endpoints or
	// RDS routes from, so clusters and listeners that need one are errors.
	static bool
	// node is the local node (Envoy's LocalInfo).
	node nodeInfo
	// health runs the clusters' active health checks.
	health *healthChecks
	// connFor is the shared channel to a processor host (connPool.conn).
	connFor func(target string, tls bool, cert *tls.Certificate) (*grpc.ClientConn, error)
	// bootstrap are the clusters of the node's bootstrap (static_resources)
	// beside those CDS sends. Only its non-EDS ones may back an
	// api_config_source (Envoy's primary clusters).
	bootstrap map[string]*clusterv3.Cluster
	// hold, once the node has initialized, decides for a warming cluster
	// whether it is held back (held) and what serves meanwhile: the
	// version in use (old), or nothing (a new cluster: its routes find no
	// cluster). nil: every cluster is used as built (initialization, whose
	// warming holds the whole update back instead).
	hold func(name string, c *clusterv3.Cluster) (old *activeCluster, held bool)
}

// built is a translated state: the listeners, and the names the node must
// subscribe to next.
type built struct {
	listeners []*builtListener
	// rds and eds are the route configurations and (ADS) load assignments
	// the listeners and clusters name.
	rds, eds []string
	// side are the load assignments to fetch from other EDS servers, by
	// the cluster that reaches the server (EdsClusterConfig.eds_config
	// api_config_source).
	side map[string]*sideSource
	// pending are the EDS clusters whose first load assignment has not
	// arrived, and the health-checked ones whose hosts have not had their
	// first check (Envoy keeps them warming).
	pending []string
	// active are the clusters the listeners were built with.
	active map[string]activeCluster
}

func hasAssignment(res *resources, eds edsRef) bool {
	if eds.source == "" {
		return res.endpoints[eds.name] != nil
	}
	return res.side[eds.source][eds.name] != nil
}

// sideSource is one EDS server besides ADS and the names asked of it.
type sideSource struct {
	target grpcTarget
	names  []string
}

// build translates the whole state. Any error is a NACK of the update that
// produced this state.
func build(res *resources, env buildEnv) (*built, error) {
	clusters := make(map[string]*cluster, len(res.clusters)+len(env.bootstrap))
	grpcTargets := make(map[string]grpcTarget, len(res.clusters)+len(env.bootstrap))
	out := &built{side: map[string]*sideSource{}}
	all := maps.Clone(res.clusters)
	for name, c := range env.bootstrap {
		// A static cluster cannot be replaced over CDS (Envoy's
		// ClusterManagerImpl::addOrUpdateCluster refuses it).
		all[name] = c
	}
	for name, c := range all {
		cl, tgt, eds, err := buildCluster(c, res, env)
		if err != nil {
			return nil, &resourceError{kind: clusterKind, name: name, err: err}
		}
		warming := (eds.name != "" && !hasAssignment(res, eds)) || cl.health.warming()
		if warming {
			out.pending = append(out.pending, name)
		}
		// A warming cluster is held back cluster by cluster once the node
		// has initialized: the version in use serves on, a new one is not
		// there yet (ClusterManagerImpl::addOrUpdateCluster keeps it in
		// warming_clusters_ until its init completes).
		if warming && env.hold != nil {
			if old, held := env.hold(name, c); held {
				cl = nil
				if old != nil {
					clusters[name], grpcTargets[name] = old.cl, old.tgt
					env.health.reuse(old.cl.health)
				}
			}
		}
		if cl != nil {
			clusters[name], grpcTargets[name] = cl, tgt
		}
		switch {
		case eds.name == "":
		case eds.source == "":
			out.eds = append(out.eds, eds.name)
		default:
			s := out.side[eds.source]
			if s == nil {
				s = &sideSource{target: eds.target}
				out.side[eds.source] = s
			}
			s.names = append(s.names, eds.name)
		}
	}
	for src, s := range out.side {
		if s.target.addr != "" {
			continue // google_grpc: the target is the source's own
		}
		tgt, ok := grpcTargets[src]
		if !ok || tgt.addr == "" {
			return nil, fmt.Errorf("eds_config names cluster %q, which has no endpoint", src)
		}
		s.target = tgt
	}
	out.active = make(map[string]activeCluster, len(clusters))
	for name, cl := range clusters {
		out.active[name] = activeCluster{cl: cl, tgt: grpcTargets[name]}
	}
	for name, l := range res.listeners {
		bl, err := buildListener(l, res, clusters, grpcTargets, env)
		if err != nil {
			return nil, &resourceError{kind: listenerKind, name: name, err: err}
		}
		if bl.rds != "" {
			out.rds = append(out.rds, bl.rds)
		}
		out.listeners = append(out.listeners, bl)
	}
	return out, nil
}

// Kinds of resourceError.
const (
	clusterKind  = "cluster"
	listenerKind = "listener"
)

// resourceError is a cluster or listener that cannot be built (or bound).
// Envoy rejects such a resource alone and applies the rest of its update
// (Node.Apply).
type resourceError struct {
	kind, name string
	err        error
}

func (e *resourceError) Error() string { return fmt.Sprintf("%s %q: %v", e.kind, e.name, e.err) }
func (e *resourceError) Unwrap() error { return e.err }

// grpcTarget is where an ext_proc filter (or an EDS stream) naming a
// cluster connects, and how.
type grpcTarget struct {
	addr string // "" when the cluster has no endpoint
	tls  bool
	// verify checks the server's certificate against roots (PEM; empty:
	// the system's) for serverName, as a google_grpc channel with
	// ssl_credentials does; an envoy_grpc cluster here accepts any.
	verify     bool
	roots      string
	serverName string
	// cert is the client certificate of the cluster's tls_certificates
	// (nil: none), certID its certID.
	cert   *tls.Certificate
	certID string
	// cl is the cluster when its hosts are health checked: a stream then
	// starts on its first usable host, chosen when it starts.
	cl *cluster
}

// same reports whether t and o connect the same way: the same address,
// transport and client certificate (each build parses certificates anew).
func (t grpcTarget) same(o grpcTarget) bool {
	return t.addr == o.addr && t.tls == o.tls && t.certID == o.certID &&
		t.verify == o.verify && t.roots == o.roots && t.serverName == o.serverName
}

// certID identifies a client certificate by the SHA-256 of its chain (the
// leaf's DER first); "" for none.
func certID(c *tls.Certificate) string {
	if c == nil {
		return ""
	}
	h := sha256.New()
	for _, der := range c.Certificate {
		_ = binary.Write(h, binary.BigEndian, uint32(len(der)))
		h.Write(der)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func buildListener(l *listenerv3.Listener, res *resources, clusters map[string]*cluster, targets map[string]grpcTarget, env buildEnv) (*builtListener, error) {
	if err := checkFields("listener", l); err != nil {
		return nil, err
	}
	sa := l.GetAddress().GetSocketAddress()
	if err := checkAll("address", l.GetAddress(), sa); err != nil {
		return nil, err
	}
	if sa == nil || sa.GetProtocol() != corev3.SocketAddress_TCP {
		return nil, errors.New("address: want a TCP socket_address")
	}
	for i, lf := range l.GetListenerFilters() {
		if err := checkFields(fmt.Sprintf("listener_filters[%d]", i), lf); err != nil {
			return nil, err
		}
		if _, ok := passThroughListenerFilters[lf.GetTypedConfig().GetTypeUrl()]; !ok {
			return nil, fmt.Errorf("listener_filters[%d] %q (%s) is not implemented by the stand-in", i, lf.GetName(), lf.GetTypedConfig().GetTypeUrl())
		}
	}
	// One plaintext HTTP chain: filter_chains[0], or default_filter_chain
	// alone (what Envoy Gateway renders), which then takes every connection.
	fc, where := l.GetDefaultFilterChain(), "default_filter_chain"
	switch n := len(l.GetFilterChains()); {
	case n == 1 && fc == nil:
		fc, where = l.GetFilterChains()[0], "filter_chains[0]"
	case n != 0 || fc == nil:
		return nil, fmt.Errorf("filter_chains: the stand-in serves one plaintext HTTP filter chain (filter_chains[0] or default_filter_chain), got %d and a default: %t", n, fc != nil)
	}
	if err := checkAll(where, fc, fc.GetFilterChainMatch()); err != nil {
		return nil, err
	}
	if tp := fc.GetFilterChainMatch().GetTransportProtocol(); tp != "" && tp != "raw_buffer" {
		return nil, fmt.Errorf("%s.filter_chain_match.transport_protocol %q: the stand-in serves plaintext only", where, tp)
	}
	if len(fc.GetFilters()) != 1 || fc.GetFilters()[0].GetTypedConfig().GetTypeUrl() != httpConnectionManagerType {
		return nil, fmt.Errorf("%s.filters: want exactly one envoy.filters.network.http_connection_manager", where)
	}
	nf := fc.GetFilters()[0]
	if err := checkFields(where+".filters[0]", nf); err != nil {
		return nil, err
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := nf.GetTypedConfig().UnmarshalTo(hcm); err != nil {
		return nil, fmt.Errorf("http_connection_manager: %w", err)
	}
	bl := &builtListener{name: l.GetName(), port: sa.GetPortValue(),
		addr: net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))}
	bufferLimit := defaultBufferLimit
	if b := l.GetPerConnectionBufferLimitBytes(); b != nil {
		bufferLimit = int(b.GetValue())
	}
	t, rds, ready, err := buildHCM(hcm, res, clusters, targets, env, bufferLimit)
	if err != nil {
		return nil, fmt.Errorf("http_connection_manager: %w", err)
	}
	bl.table, bl.rds, bl.ready = t, rds, ready
	return bl, nil
}

// checkAll runs checkFields on each non-nil message.
func checkAll(where string, ms ...proto.Message) error {
	for _, m := range ms {
		if m == nil || !m.ProtoReflect().IsValid() {
			continue
		}
		if err := checkFields(where, m); err != nil {
			return err
		}
	}
	return nil
}

// extProcFilter is one ext_proc filter's listener-level config, or (proto
// nil) a health check, header mutation or Istio metadata exchange filter.
type extProcFilter struct {
	name                 string
	disabled             bool // HttpFilter.disabled
	proto                *extprocfilterv3.ExternalProcessor
	healthCheck          []headerMatch
	removeRequestHeaders []string
	peer                 *peerMetadataFilter
}

// headerMutationFilter reads envoy.filters.http.header_mutation when all
// it does is remove request headers (what the Envoy Gateway extension uses
// to drop a client's x-gateway-destination-endpoint before the picker).
func headerMutationFilter(where string, hf *hcmv3.HttpFilter) (extProcFilter, error) {
	hm := &headermutationv3.HeaderMutation{}
	if err := hf.GetTypedConfig().UnmarshalTo(hm); err != nil {
		return extProcFilter{}, fmt.Errorf("%s: %w", where, err)
	}
	if err := checkAll(where, hm, hm.GetMutations()); err != nil {
		return extProcFilter{}, err
	}
	out := extProcFilter{name: hf.GetName(), disabled: hf.GetDisabled()}
	for i, m := range hm.GetMutations().GetRequestMutations() {
		if err := checkFields(fmt.Sprintf("%s.mutations.request_mutations[%d]", where, i), m); err != nil {
			return extProcFilter{}, err
		}
		out.removeRequestHeaders = append(out.removeRequestHeaders, strings.ToLower(m.GetRemove()))
	}
	return out, nil
}

// healthCheckFilter reads envoy.filters.http.health_check in
// non-pass-through mode: a request matching every header is answered 200 by
// the filter itself (Envoy Gateway's readiness listener uses it).
func healthCheckFilter(where string, hf *hcmv3.HttpFilter) (extProcFilter, error) {
	hc := &healthcheckv3.HealthCheck{}
	if err := hf.GetTypedConfig().UnmarshalTo(hc); err != nil {
		return extProcFilter{}, fmt.Errorf("%s: %w", where, err)
	}
	if err := checkFields(where, hc); err != nil {
		return extProcFilter{}, err
	}
	if hc.GetPassThroughMode().GetValue() {
		return extProcFilter{}, fmt.Errorf("%s: pass_through_mode is not implemented by the stand-in", where)
	}
	if len(hc.GetHeaders()) == 0 {
		return extProcFilter{}, fmt.Errorf("%s: a health check without headers would answer every request", where)
	}
	out := extProcFilter{name: hf.GetName(), disabled: hf.GetDisabled()}
	for i, h := range hc.GetHeaders() {
		hm, err := buildHeaderMatch(fmt.Sprintf("%s.headers[%d]", where, i), h)
		if err != nil {
			return extProcFilter{}, err
		}
		out.healthCheck = append(out.healthCheck, hm)
	}
	return out, nil
}

func buildHCM(hcm *hcmv3.HttpConnectionManager, res *resources, clusters map[string]*cluster, targets map[string]grpcTarget, env buildEnv, bufferLimit int) (*table, string, bool, error) {
	if err := checkFields("http_connection_manager", hcm); err != nil {
		return nil, "", false, err
	}
	switch hcm.GetCodecType() {
	case hcmv3.HttpConnectionManager_AUTO, hcmv3.HttpConnectionManager_HTTP1:
	default:
		return nil, "", false, fmt.Errorf("codec_type %s: the stand-in serves HTTP/1.1", hcm.GetCodecType())
	}
	var procs []extProcFilter
	passThrough := map[string]bool{}
	routerSeen := false
	for i, hf := range hcm.GetHttpFilters() {
		where := fmt.Sprintf("http_filters[%d] %q", i, hf.GetName())
		if err := checkFields(where, hf); err != nil {
			return nil, "", false, err
		}
		if routerSeen {
			return nil, "", false, fmt.Errorf("%s: after the router, which must be the last filter", where)
		}
		tc := hf.GetTypedConfig()
		// Istio sends its own filters' configs in TypedStructs.
		inner, tsValue, err := typedStruct(where, tc)
		if err != nil {
			return nil, "", false, err
		}
		switch url := tc.GetTypeUrl(); {
		case inner == peerMetadataType:
			if tsValue == nil {
				return nil, "", false, fmt.Errorf("%s: %s is read from a TypedStruct only", where, peerMetadataType)
			}
			pm, err := peerMetadataConfig(where, tsValue, env.node)
			if err != nil {
				return nil, "", false, err
			}
			procs = append(procs, extProcFilter{name: hf.GetName(), disabled: hf.GetDisabled(), peer: pm})
		case passThroughHTTPFilters[inner].reason != "":
			if err := checkPassThrough(where, passThroughHTTPFilters[inner], tc, tsValue); err != nil {
				return nil, "", false, err
			}
			passThrough[hf.GetName()] = true
		case tsValue != nil:
			return nil, "", false, fmt.Errorf("%s: filter type %s is not implemented by the stand-in", where, typeURLOf(tc, inner))
		case url == routerType:
			r := &routerv3.Router{}
			if err := tc.UnmarshalTo(r); err != nil {
				return nil, "", false, fmt.Errorf("%s: %w", where, err)
			}
			if err := checkFields(where, r); err != nil {
				return nil, "", false, err
			}
			routerSeen = true
		case url == extProcType:
			ep := &extprocfilterv3.ExternalProcessor{}
			if err := tc.UnmarshalTo(ep); err != nil {
				return nil, "", false, fmt.Errorf("%s: %w", where, err)
			}
			if err := checkExtProc(where, ep); err != nil {
				return nil, "", false, err
			}
			procs = append(procs, extProcFilter{name: hf.GetName(), disabled: hf.GetDisabled(), proto: ep})
		case url == headerMutationType:
			hm, err := headerMutationFilter(where, hf)
			if err != nil {
				return nil, "", false, err
			}
			procs = append(procs, hm)
		case url == healthCheckType:
			hc, err := healthCheckFilter(where, hf)
			if err != nil {
				return nil, "", false, err
			}
			procs = append(procs, hc)
		default:
			return nil, "", false, fmt.Errorf("%s: filter type %s is not implemented by the stand-in", where, url)
		}
	}
	if !routerSeen {
		return nil, "", false, errors.New("http_filters: no envoy.filters.http.router")
	}
	streamIdle := defaultStreamIdleTimeout
	if d := hcm.GetStreamIdleTimeout(); d != nil {
		streamIdle = d.AsDuration()
	}
	t := &table{clusters: clusters, proxy100Continue: hcm.GetProxy_100Continue(), bufferLimit: bufferLimit, streamIdle: streamIdle,
		keepXFCC: hcm.GetForwardClientCertDetails() == hcmv3.HttpConnectionManager_ALWAYS_FORWARD_ONLY}
	for _, p := range procs {
		if p.proto == nil {
			t.filters = append(t.filters, &httpFilter{name: p.name, healthCheck: p.healthCheck, removeRequestHeaders: p.removeRequestHeaders,
				peer: p.peer, disabled: p.disabled})
			continue
		}
		f := &httpFilter{name: p.name, rematch: true}
		switch {
		case p.proto.GetDisableClearRouteCache():
			f.rematch = false
		case p.proto.GetRouteCacheAction() == extprocfilterv3.ExternalProcessor_RETAIN:
			f.rematch = false
		case p.proto.GetRouteCacheAction() == extprocfilterv3.ExternalProcessor_CLEAR:
			f.alwaysRematch = true
		}
		c, err := extProcClient(p, nil, targets, env)
		if err != nil {
			return nil, "", false, err
		}
		f.client, f.disabled = c, p.disabled
		t.filters = append(t.filters, f)
	}
	var rc *routev3.RouteConfiguration
	rds := ""
	switch {
	case hcm.GetRouteConfig() != nil:
		rc = hcm.GetRouteConfig()
	case hcm.GetRds() != nil:
		if err := checkFields("rds", hcm.GetRds()); err != nil {
			return nil, "", false, err
		}
		if env.static {
			return nil, "", false, errors.New("rds: a static bootstrap has no ADS stream to fetch routes from; inline the route configuration as route_config, or take the configuration over xDS (--xds-server)")
		}
		if src, _, err := configSource("rds.config_source", hcm.GetRds().GetConfigSource(), env); err != nil || src != "" {
			return nil, "", false, fmt.Errorf("rds.config_source: only ADS is implemented by the stand-in for routes (%v)", err)
		}
		rds = hcm.GetRds().GetRouteConfigName()
		rc = res.routes[rds]
		if rc == nil {
			return t, rds, false, nil // warming until RDS delivers it
		}
	default:
		return nil, "", false, errors.New("neither route_config nor rds")
	}
	hb := &hcmBuild{procs: procs, passThrough: passThrough, table: t, targets: targets, env: env}
	routes, err := hb.routes(rc)
	if err != nil {
		return nil, "", false, fmt.Errorf("route configuration %q: %w", rc.GetName(), err)
	}
	t.routes = routes
	return t, rds, true, nil
}

// checkExtProc NACKs ExternalProcessor settings the stand-in does not reproduce.
func checkExtProc(where string, ep *extprocfilterv3.ExternalProcessor) error {
	if err := checkAll(where, ep, ep.GetGrpcService(), ep.GetGrpcService().GetEnvoyGrpc(), ep.GetProcessingMode(),
		ep.GetMetadataOptions(), ep.GetMetadataOptions().GetForwardingNamespaces(), ep.GetMetadataOptions().GetReceivingNamespaces(),
		ep.GetMutationRules()); err != nil {
		return err
	}
	if ep.GetGrpcService().GetEnvoyGrpc() == nil {
		return fmt.Errorf("%s: grpc_service.envoy_grpc is required (google_grpc and http_service are not implemented)", where)
	}
	if ep.GetDisableClearRouteCache() && ep.GetRouteCacheAction() != extprocfilterv3.ExternalProcessor_DEFAULT {
		// Envoy rejects the pair.
		return fmt.Errorf("%s: only one of disable_clear_route_cache and route_cache_action may be set", where)
	}
	mr := ep.GetMutationRules()
	if mr.GetAllowAllRouting().GetValue() || mr.GetAllowEnvoy().GetValue() || mr.GetDisallowSystem().GetValue() ||
		mr.GetDisallowAll().GetValue() || mr.GetDisallowIsError().GetValue() {
		return fmt.Errorf("%s: mutation_rules other than Envoy's defaults are not implemented by the stand-in", where)
	}
	if ep.GetAllowModeOverride() {
		m := ep.GetProcessingMode()
		if m.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED || m.GetResponseBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			// Envoy ignores mode overrides in FULL_DUPLEX_STREAMED; elsewhere they change the exchange.
			return fmt.Errorf("%s: allow_mode_override is implemented only where Envoy ignores it (both bodies FULL_DUPLEX_STREAMED)", where)
		}
	}
	return nil
}

// routeOverrides is ExtProcPerRoute merged over the levels that carry one
// (route configuration, virtual host, route), as Envoy's ext_proc merges
// them: disabled from the most specific level, every other setting from the
// most specific level that sets it.
type routeOverrides struct {
	disabled   bool
	mode       *extprocfilterv3.ProcessingMode
	grpc       *corev3.GrpcService
	forwarding *extprocfilterv3.MetadataOptions_MetadataNamespaces
	receiving  *extprocfilterv3.MetadataOptions_MetadataNamespaces
	failOpen   *bool
}

// merge applies a more specific level.
func (o *routeOverrides) merge(pr *extprocfilterv3.ExtProcPerRoute) {
	o.disabled = pr.GetDisabled()
	ov := pr.GetOverrides()
	if ov.GetProcessingMode() != nil {
		o.mode = ov.GetProcessingMode()
	}
	if ov.GetGrpcService() != nil {
		o.grpc = ov.GetGrpcService()
	}
	if mo := ov.GetMetadataOptions(); mo != nil {
		if mo.GetForwardingNamespaces() != nil {
			o.forwarding = mo.GetForwardingNamespaces()
		}
		if mo.GetReceivingNamespaces() != nil {
			o.receiving = mo.GetReceivingNamespaces()
		}
	}
	if fo := ov.GetFailureModeAllow(); fo != nil {
		v := fo.GetValue()
		o.failOpen = &v
	}
}

// extProcClient makes the client for filter p on one route: the listener's
// config with the route's merged overrides applied (nil: none).
func extProcClient(p extProcFilter, ov *routeOverrides, targets map[string]grpcTarget, env buildEnv) (*extprocfilter.Client, error) {
	ep := p.proto
	mode, gs, failOpen := ep.GetProcessingMode(), ep.GetGrpcService(), ep.GetFailureModeAllow()
	fwd, rcv := ep.GetMetadataOptions().GetForwardingNamespaces(), ep.GetMetadataOptions().GetReceivingNamespaces()
	if ov != nil {
		if ov.mode != nil {
			mode = ov.mode
		}
		if ov.grpc != nil {
			gs = ov.grpc
		}
		if ov.forwarding != nil {
			fwd = ov.forwarding
		}
		if ov.receiving != nil {
			rcv = ov.receiving
		}
		if ov.failOpen != nil {
			failOpen = *ov.failOpen
		}
	}
	if mode == nil {
		// ProcessingMode's own defaults: headers SEND, bodies NONE, trailers SKIP.
		mode = &extprocfilterv3.ProcessingMode{}
	}
	cfg := extprocfilter.FilterConfig{
		Name:             p.name,
		FailureModeAllow: failOpen,
		ProcessingMode:   mode,
		MetadataOptions:  &extprocfilter.MetadataOptions{Forwarding: fwd.GetUntyped(), Receiving: rcv.GetUntyped()},
		StatusOnError:    int(ep.GetStatusOnError().GetCode()),
		// Not in ExtProcOverrides: always the listener filter's.
		DisableImmediateResponse: ep.GetDisableImmediateResponse(),
	}
	if d := ep.GetMessageTimeout(); d != nil {
		cfg.MessageTimeout = d.AsDuration()
	}
	cluster := gs.GetEnvoyGrpc().GetClusterName()
	tgt, ok := targets[cluster]
	if !ok || tgt.addr == "" {
		// Envoy's stream start fails at once, before the request reaches
		// the filter, so the filter's failure mode decides even with a
		// body (async_client_impl.cc AsyncStreamImpl::initialize: no
		// thread-local cluster, or the router's "no healthy upstream"
		// reset inside sendHeaders).
		why := fmt.Errorf("cluster %q has no healthy host", cluster)
		if !ok {
			why = fmt.Errorf("cluster %q not found", cluster)
		}
		cfg.Target = "cluster:" + cluster
		return extprocfilter.NewClientStarting(cfg, func() (*grpc.ClientConn, error) { return nil, why })
	}
	cfg.Target, cfg.TLS, cfg.ClientCert = tgt.addr, tgt.tls, tgt.cert
	if tgt.cl != nil {
		return healthAwareClient(cfg, cluster, tgt.cl, env)
	}
	c, err := env.clientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("ext_proc filter %q (cluster %q): %w", p.name, cluster, err)
	}
	return c, nil
}

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

// routeFilters is the chain state and ext_proc client of every filter on a
// route whose typed_per_filter_config levels (least specific first) are
// levels.
func (hb *hcmBuild) routeFilters(where string, levels []map[string]*anypb.Any) ([]chainState, []*extprocfilter.Client, error) {
	for _, level := range levels {
		for name := range level {
			if hb.passThrough[name] {
				return nil, nil, fmt.Errorf("%s: typed_per_filter_config[%q]: per-route config of a pass-through filter is not implemented by the stand-in", where, name)
			}
		}
	}
	var chain []chainState
	var filters []*extprocfilter.Client
	for i, p := range hb.procs {
		if p.proto == nil {
			for _, level := range levels {
				if _, ok := level[p.name]; ok {
					return nil, nil, fmt.Errorf("%s: typed_per_filter_config[%q]: per-route config of this filter is not implemented by the stand-in", where, p.name)
				}
			}
			chain = append(chain, chainDefault)
			filters = append(filters, nil)
			continue
		}
		state, c, err := routeFilter(where, p, hb.table.filters[i].client, levels, hb.targets, hb.env)
		if err != nil {
			return nil, nil, err
		}
		chain = append(chain, state)
		filters = append(filters, c)
	}
	return chain, filters, nil
}

// routeFilter reads the typed_per_filter_config entries for filter p on a
// route, least specific first (route configuration, virtual host, route).
// It returns whether the most specific entry puts the filter in the chain
// (Envoy decides the chain from the route a request starts on: any entry
// enables a filter HttpFilter.disabled left out, FilterConfig.disabled
// removes it), and the ext_proc client for the route (nil when
// ExtProcPerRoute.disabled).
func routeFilter(where string, p extProcFilter, listenerClient *extprocfilter.Client, levels []map[string]*anypb.Any, targets map[string]grpcTarget, env buildEnv) (chainState, *extprocfilter.Client, error) {
	where = fmt.Sprintf("%s.typed_per_filter_config[%q]", where, p.name)
	state := chainDefault
	var ov *routeOverrides
	for _, level := range levels {
		cfg, ok := level[p.name]
		if !ok {
			continue
		}
		if cfg.GetTypeUrl() == filterConfigType {
			fc := &routev3.FilterConfig{}
			if err := cfg.UnmarshalTo(fc); err != nil {
				return 0, nil, fmt.Errorf("%s: %w", where, err)
			}
			if err := checkFields(where, fc); err != nil {
				return 0, nil, err
			}
			switch {
			case fc.GetDisabled():
				state = chainDisabled
				continue
			case fc.GetConfig() == nil:
				return 0, nil, fmt.Errorf("%s: empty FilterConfig (Envoy rejects an empty per filter configuration)", where)
			case fc.GetConfig().GetTypeUrl() == "":
				// An empty config enables the filter with its listener config.
				state = chainEnabled
				continue
			}
			cfg = fc.GetConfig()
		}
		if cfg.GetTypeUrl() != extProcPerRouteType {
			return 0, nil, fmt.Errorf("%s: type %s is not implemented by the stand-in", where, cfg.GetTypeUrl())
		}
		pr := &extprocfilterv3.ExtProcPerRoute{}
		if err := cfg.UnmarshalTo(pr); err != nil {
			return 0, nil, fmt.Errorf("%s: %w", where, err)
		}
		o := pr.GetOverrides()
		if err := checkAll(where, pr, o, o.GetProcessingMode(), o.GetGrpcService(), o.GetGrpcService().GetEnvoyGrpc(),
			o.GetMetadataOptions(), o.GetMetadataOptions().GetForwardingNamespaces(), o.GetMetadataOptions().GetReceivingNamespaces()); err != nil {
			return 0, nil, err
		}
		if !pr.GetDisabled() && o == nil {
			return 0, nil, fmt.Errorf("%s: ExtProcPerRoute needs disabled: true or overrides", where)
		}
		if o.GetGrpcService() != nil && o.GetGrpcService().GetEnvoyGrpc() == nil {
			return 0, nil, fmt.Errorf("%s: overrides.grpc_service.envoy_grpc is required (google_grpc and http_service are not implemented for ext_proc)", where)
		}
		if ov == nil {
			ov = &routeOverrides{}
		}
		ov.merge(pr)
		state = chainEnabled
	}
	switch {
	case ov == nil:
		return state, listenerClient, nil
	case ov.disabled:
		return state, nil, nil
	}
	c, err := extProcClient(p, ov, targets, env)
	return state, c, err
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

// edsRef is the load assignment an EDS cluster needs: its name, and the
// cluster that reaches its EDS server ("" for ADS).
type edsRef struct {
	name, source string
	// target is where a google_grpc source connects; empty for a cluster
	// (the cluster's first host).
	target grpcTarget
}

// buildCluster translates a Cluster. It returns the cluster, where an
// ext_proc filter naming it connects, and the load assignment it needs
// (empty when it is not an EDS cluster).
func buildCluster(c *clusterv3.Cluster, res *resources, env buildEnv) (*cluster, grpcTarget, edsRef, error) {
	var tgt grpcTarget
	if err := checkFields("cluster", c); err != nil {
		return nil, tgt, edsRef{}, err
	}
	out := &cluster{name: c.GetName(), connectTimeout: 5 * time.Second}
	// Round robin starts at a random host of a new cluster, so proxies (and
	// rebuilds) do not all send their first request to the same host:
	// RoundRobinLoadBalancer::refreshHostSource starts each host source's
	// index at seed_, which the EdfLoadBalancerBase constructor draws from
	// the random generator (Envoy 1.39, source/extensions/
	// load_balancing_policies/round_robin/round_robin_lb.h, common/
	// load_balancer_impl.cc). The stand-in builds every cluster anew on
	// each update, so without it a fallback would always take the first
	// endpoint.
	out.next.Store(rand.Uint64())
	if d := c.GetConnectTimeout(); d != nil {
		out.connectTimeout = d.AsDuration()
	}
	sel, err := clusterTransports(c)
	if err != nil {
		return nil, tgt, edsRef{}, err
	}
	out.unlisted = sel.pick(nil, nil)
	out.ownTLS = len(sel.matches) == 0 && sel.def.kind == acceptAnyTLS
	if err := clusterFilters(c.GetFilters()); err != nil {
		return nil, tgt, edsRef{}, err
	}
	istio := c.GetMetadata().GetFilterMetadata()["istio"].GetFields()
	out.istioDisableMX, out.istioExternal = istio["disable_mx"].GetBoolValue(), istio["external"].GetBoolValue()
	var eds edsRef
	var cla *endpointv3.ClusterLoadAssignment
	switch c.GetType() {
	case clusterv3.Cluster_STATIC, clusterv3.Cluster_STRICT_DNS, clusterv3.Cluster_LOGICAL_DNS:
		cla = c.GetLoadAssignment()
	case clusterv3.Cluster_EDS:
		if env.static {
			return nil, tgt, edsRef{}, errors.New("type EDS: a static bootstrap has no ADS stream to fetch endpoints from; give the cluster a load_assignment (STATIC, STRICT_DNS or LOGICAL_DNS), or take the configuration over xDS (--xds-server)")
		}
		ec := c.GetEdsClusterConfig()
		if err := checkFields("eds_cluster_config", ec); err != nil {
			return nil, tgt, edsRef{}, err
		}
		src, srcTarget, err := configSource("eds_cluster_config.eds_config", ec.GetEdsConfig(), env)
		if err != nil {
			return nil, tgt, edsRef{}, err
		}
		eds = edsRef{name: ec.GetServiceName(), source: src, target: srcTarget}
		if eds.name == "" {
			eds.name = c.GetName()
		}
		if src == "" {
			cla = res.endpoints[eds.name]
		} else {
			cla = res.side[src][eds.name]
		}
	case clusterv3.Cluster_ORIGINAL_DST:
		if c.GetLoadAssignment() != nil {
			return nil, tgt, edsRef{}, errors.New("ORIGINAL_DST clusters take no load_assignment")
		}
		if c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
			return nil, tgt, edsRef{}, errors.New("ORIGINAL_DST needs lb_policy CLUSTER_PROVIDED")
		}
		od, err := originalDstSource(c.GetOriginalDstLbConfig())
		if err != nil {
			return nil, tgt, edsRef{}, err
		}
		out.originalDst = od
	default:
		return nil, tgt, edsRef{}, fmt.Errorf("type %s is not implemented by the stand-in", c.GetType())
	}
	// With load_balancing_policy set, Envoy ignores lb_policy (Istio sets
	// CLUSTER_PROVIDED beside override_host).
	if c.GetType() != clusterv3.Cluster_ORIGINAL_DST && c.GetLoadBalancingPolicy() == nil {
		switch c.GetLbPolicy() {
		case clusterv3.Cluster_ROUND_ROBIN, clusterv3.Cluster_LEAST_REQUEST, clusterv3.Cluster_RANDOM:
		default:
			return nil, tgt, edsRef{}, fmt.Errorf("lb_policy %s is not implemented by the stand-in", c.GetLbPolicy())
		}
	}
	if lbp := c.GetLoadBalancingPolicy(); lbp != nil {
		if out.originalDst != nil {
			return nil, tgt, edsRef{}, errors.New("load_balancing_policy on an ORIGINAL_DST cluster")
		}
		oh, err := loadBalancingPolicy("load_balancing_policy", lbp, true)
		if err != nil {
			return nil, tgt, edsRef{}, err
		}
		out.override = oh
	}
	eps, members, transports, err := clusterEndpoints(cla, sel, env)
	if err != nil {
		return nil, tgt, edsRef{}, err
	}
	out.endpoints, out.members, out.transports = eps, members, transports
	hc, err := parseHealthChecks(c)
	if err != nil {
		return nil, tgt, edsRef{}, err
	}
	panicAt, err := panicThreshold(c)
	if err != nil {
		return nil, tgt, edsRef{}, err
	}
	if hc != nil && env.health != nil {
		out.health, err = env.health.forCluster(c.GetName(), hc, panicAt, eps, func(host string) grpcTarget { return targetOf(host, out.transportFor(host)) })
		if err != nil {
			return nil, tgt, edsRef{}, err
		}
	}
	if len(eps) > 0 {
		// A gRPC client of this cluster connects to its first host (its
		// first usable one when health checked, chosen per stream).
		tgt = targetOf(eps[0], out.transportFor(eps[0]))
		if out.health != nil {
			tgt.cl = out
		}
	}
	return out, tgt, eds, nil
}

// secretNotSuppliedTarget is a gRPC target that fails at once, standing for
// a host whose transport socket waits for an SDS secret that never comes:
// a filter's stream to it fails (its failure mode decides), an EDS stream
// never connects.
const secretNotSuppliedTarget = "unix:///nonexistent/infergate-devproxy-sds-secret-not-supplied"

// targetOf is how a gRPC client reaches host through its transport socket.
func targetOf(host string, t hostTransport) grpcTarget {
	switch t.kind {
	case acceptAnyTLS:
		return grpcTarget{addr: host, tls: true, cert: t.cert, certID: t.certID}
	case secretNotSupplied:
		return grpcTarget{addr: secretNotSuppliedTarget}
	}
	return grpcTarget{addr: host}
}

// configSource reads an EDS ConfigSource: ADS (""), or an
// api_config_source streaming EDS over gRPC, named by the source it opens a
// stream to: an envoy_grpc cluster of the bootstrap, or a google_grpc
// channel, which needs no cluster (and then its target).
func configSource(where string, cs *corev3.ConfigSource, env buildEnv) (string, grpcTarget, error) {
	var none grpcTarget
	if cs == nil {
		return "", none, fmt.Errorf("%s is required", where)
	}
	if err := checkFields(where, cs); err != nil {
		return "", none, err
	}
	if cs.GetAds() != nil {
		return "", none, nil
	}
	api := cs.GetApiConfigSource()
	if api == nil {
		return "", none, fmt.Errorf("%s: only ads and api_config_source are implemented by the stand-in", where)
	}
	where += ".api_config_source"
	if err := checkFields(where, api); err != nil {
		return "", none, err
	}
	if api.GetApiType() != corev3.ApiConfigSource_GRPC {
		return "", none, fmt.Errorf("%s.api_type %s: only GRPC (state of the world) is implemented by the stand-in", where, api.GetApiType())
	}
	if len(api.GetGrpcServices()) != 1 {
		return "", none, fmt.Errorf("%s: want one grpc_services entry", where)
	}
	gs := api.GetGrpcServices()[0]
	if err := checkFields(where+".grpc_services[0]", gs); err != nil {
		return "", none, err
	}
	if g := gs.GetGoogleGrpc(); g != nil {
		tgt, err := googleGrpcTarget(where+".grpc_services[0].google_grpc", g)
		if err != nil {
			return "", none, err
		}
		return "google_grpc:" + g.GetTargetUri(), tgt, nil
	}
	eg := gs.GetEnvoyGrpc()
	if eg == nil {
		return "", none, fmt.Errorf("%s.grpc_services[0]: want envoy_grpc or google_grpc", where)
	}
	if err := checkFields(where+".grpc_services[0].envoy_grpc", eg); err != nil {
		return "", none, err
	}
	// Envoy takes a non-ADS subscription only from a cluster of the
	// bootstrap that is not EDS (its primary clusters):
	// source/common/config/utility.cc
	// Utility::checkApiConfigSourceSubscriptionBackingCluster and
	// validateClusterName, the set built in cluster_manager_impl.cc
	// (ClusterManagerImpl::init, is_primary_cluster). A cluster CDS sent
	// is never one: the update is rejected (envoyproxy/envoy#12954).
	name := eg.GetClusterName()
	if bc, ok := env.bootstrap[name]; !ok || bc.GetType() == clusterv3.Cluster_EDS {
		return "", none, fmt.Errorf("%s: %s must have a statically defined non-EDS cluster: '%s' does not exist, was added via api, or is an EDS cluster",
			where, "envoy.config.core.v3.ApiConfigSource", name)
	}
	return name, none, nil
}

// googleGrpcTarget is how Envoy's Google gRPC client reaches target_uri
// (source/common/grpc/google_grpc_creds_impl.cc
// CredsUtility::defaultChannelCredentials): without channel_credentials a
// plaintext channel; with ssl_credentials TLS that verifies the server
// against root_certs (the system's when empty) for the target's host name,
// presenting cert_chain and private_key when set. Other credentials and
// call credentials are not reproduced.
func googleGrpcTarget(where string, g *corev3.GrpcService_GoogleGrpc) (grpcTarget, error) {
	var tgt grpcTarget
	if err := checkFields(where, g); err != nil {
		return tgt, err
	}
	target := strings.TrimPrefix(g.GetTargetUri(), "dns:///")
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return tgt, fmt.Errorf("%s.target_uri %q: want host:port (or dns:///host:port): %w", where, g.GetTargetUri(), err)
	}
	tgt = grpcTarget{addr: target}
	cc := g.GetChannelCredentials()
	if cc == nil {
		return tgt, nil
	}
	ssl := cc.GetSslCredentials()
	if ssl == nil {
		return tgt, fmt.Errorf("%s.channel_credentials: only ssl_credentials is implemented by the stand-in", where)
	}
	if err := checkFields(where+".channel_credentials.ssl_credentials", ssl); err != nil {
		return tgt, err
	}
	roots, err := dataSource(where+".channel_credentials.ssl_credentials.root_certs", ssl.GetRootCerts())
	if err != nil {
		return tgt, err
	}
	if len(roots) > 0 && !x509.NewCertPool().AppendCertsFromPEM(roots) {
		return tgt, fmt.Errorf("%s.channel_credentials.ssl_credentials.root_certs: no PEM certificate", where)
	}
	if ssl.GetCertChain() != nil || ssl.GetPrivateKey() != nil {
		cert, err := keyPair(where+".channel_credentials.ssl_credentials", ".cert_chain", ssl.GetCertChain(), ".private_key", ssl.GetPrivateKey())
		if err != nil {
			return tgt, err
		}
		tgt.cert, tgt.certID = cert, certID(cert)
	}
	tgt.tls, tgt.verify, tgt.roots, tgt.serverName = true, true, string(roots), host
	return tgt, nil
}

func originalDstSource(oc *clusterv3.Cluster_OriginalDstLbConfig) (*originalDst, error) {
	if err := checkFields("original_dst_lb_config", oc); err != nil {
		return nil, err
	}
	out := &originalDst{}
	if oc.GetMetadataKey() != nil {
		k, err := metadataKeyOf("original_dst_lb_config.metadata_key", oc.GetMetadataKey())
		if err != nil {
			return nil, err
		}
		out.md = k
	}
	if oc.GetUseHttpHeader() {
		out.header = "x-envoy-original-dst-host" // Envoy's default header
		if name := oc.GetHttpHeaderName(); name != "" {
			out.header = strings.ToLower(name)
		}
	}
	// With neither, only the connection's restored destination, which the
	// stand-in never has.
	return out, nil
}

// loadBalancingPolicy reads Cluster.load_balancing_policy. Envoy uses the
// first policy it supports, and supports many; the stand-in takes the first
// policy and NACKs it unless it is override_host or one of round_robin,
// least_request and random, which all pick among equal hosts (round robin
// here).
func loadBalancingPolicy(where string, lbp *clusterv3.LoadBalancingPolicy, allowOverride bool) (*overrideHost, error) {
	if err := checkFields(where, lbp); err != nil {
		return nil, err
	}
	if len(lbp.GetPolicies()) == 0 {
		return nil, fmt.Errorf("%s: no policies", where)
	}
	p := lbp.GetPolicies()[0]
	pw := where + ".policies[0]"
	if err := checkAll(pw, p, p.GetTypedExtensionConfig()); err != nil {
		return nil, err
	}
	tc := p.GetTypedExtensionConfig().GetTypedConfig()
	msg, err := tc.UnmarshalNew()
	if err != nil {
		return nil, fmt.Errorf("%s: policy %s is not implemented by the stand-in", pw, tc.GetTypeUrl())
	}
	switch m := msg.(type) {
	case *roundrobinv3.RoundRobin, *leastrequestv3.LeastRequest, *randomv3.Random:
		return nil, nil
	case *overridehostv3.OverrideHost:
		if !allowOverride {
			return nil, fmt.Errorf("%s: override_host as a fallback policy", pw)
		}
		return overrideHostOf(pw, m)
	}
	return nil, fmt.Errorf("%s: policy %s is not implemented by the stand-in", pw, tc.GetTypeUrl())
}

func overrideHostOf(where string, m *overridehostv3.OverrideHost) (*overrideHost, error) {
	if err := checkFields(where, m); err != nil {
		return nil, err
	}
	out := &overrideHost{}
	for i, s := range m.GetOverrideHostSources() {
		sw := fmt.Sprintf("%s.override_host_sources[%d]", where, i)
		if err := checkFields(sw, s); err != nil {
			return nil, err
		}
		if s.GetMetadata() != nil {
			k, err := metadataKeyOf(sw+".metadata", s.GetMetadata())
			if err != nil {
				return nil, err
			}
			out.sources = append(out.sources, hostSource{md: k})
			continue
		}
		if s.GetHeader() == "" {
			return nil, fmt.Errorf("%s: neither header nor metadata", sw)
		}
		out.sources = append(out.sources, hostSource{header: strings.ToLower(s.GetHeader())})
	}
	if k := m.GetSelectedHostKey(); k != nil {
		sk, err := metadataKeyOf(where+".selected_host_key", k)
		if err != nil {
			return nil, err
		}
		out.selected = sk
	}
	if fp := m.GetFallbackPolicy(); fp != nil {
		if _, err := loadBalancingPolicy(where+".fallback_policy", fp, false); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func metadataKeyOf(where string, k *metadatav3.MetadataKey) (*metadataKey, error) {
	if err := checkFields(where, k); err != nil {
		return nil, err
	}
	out := &metadataKey{namespace: k.GetKey()}
	for i, seg := range k.GetPath() {
		if err := checkFields(fmt.Sprintf("%s.path[%d]", where, i), seg); err != nil {
			return nil, err
		}
		out.path = append(out.path, seg.GetKey())
	}
	if out.namespace == "" || len(out.path) == 0 {
		return nil, fmt.Errorf("%s: want a key and a path", where)
	}
	return out, nil
}

// clientCertificate reads CommonTlsContext.tls_certificates: nil for none.
// Envoy presents the first certificate whose algorithm the server accepts;
// the stand-in takes the first, and since its choice among several could
// differ from Envoy's, it NACKs more than one. The chain and key are read
// when the update is built (a file changed later is read again with the
// next update) and must parse as a PEM pair.
func clientCertificate(where string, tcs []*tlsv3.TlsCertificate) (*tls.Certificate, error) {
	switch len(tcs) {
	case 0:
		return nil, nil
	case 1:
	default:
		return nil, fmt.Errorf("%s: %d certificates; the stand-in presents one and does not implement Envoy's choice among several (the first whose algorithm the server accepts)", where, len(tcs))
	}
	tc := tcs[0]
	where += "[0]"
	if err := checkFields(where, tc); err != nil {
		return nil, err
	}
	return keyPair(where, ".certificate_chain", tc.GetCertificateChain(), ".private_key", tc.GetPrivateKey())
}

// keyPair reads a certificate chain and its private key from two
// DataSources (named chainField and keyField under where), both required.
func keyPair(where, chainField string, chainDS *corev3.DataSource, keyField string, keyDS *corev3.DataSource) (*tls.Certificate, error) {
	chain, err := dataSource(where+chainField, chainDS)
	if err != nil {
		return nil, err
	}
	key, err := dataSource(where+keyField, keyDS)
	if err != nil {
		return nil, err
	}
	if len(chain) == 0 || len(key) == 0 {
		return nil, fmt.Errorf("%s: %s and %s are both required", where, chainField[1:], keyField[1:])
	}
	cert, err := tls.X509KeyPair(chain, key)
	if err != nil {
		return nil, fmt.Errorf("%s: %s and %s: %w", where, chainField[1:], keyField[1:], err)
	}
	return &cert, nil
}

// dataSource reads a DataSource as Envoy does when it loads the
// configuration: inline_bytes, inline_string, or the file named by
// filename, read now. Unset is empty; environment_variable and
// watched_directory are NACKed (xdsRules).
func dataSource(where string, ds *corev3.DataSource) ([]byte, error) {
	if err := checkAll(where, ds); err != nil {
		return nil, err
	}
	switch s := ds.GetSpecifier().(type) {
	case *corev3.DataSource_InlineBytes:
		return s.InlineBytes, nil
	case *corev3.DataSource_InlineString:
		return []byte(s.InlineString), nil
	case *corev3.DataSource_Filename:
		b, err := os.ReadFile(s.Filename)
		if err != nil {
			return nil, fmt.Errorf("%s.filename: %w", where, err)
		}
		return b, nil
	}
	return nil, nil
}

// clusterEndpoints lists the hosts the normal load balancer uses (the
// lowest priority level that has healthy hosts; UNHEALTHY, DRAINING and
// TIMEOUT hosts left out), every host of the assignment, for
// override_host, which Envoy lets pick any host of the cluster, and each
// host's transport socket (sel, by the host's and its locality's
// metadata). Host names are resolved.
func clusterEndpoints(cla *endpointv3.ClusterLoadAssignment, sel *transportSelector, env buildEnv) ([]string, map[string]bool, map[string]hostTransport, error) {
	if cla == nil {
		return nil, nil, nil, nil
	}
	if err := checkFields("load_assignment", cla); err != nil {
		return nil, nil, nil, err
	}
	if len(cla.GetPolicy().GetDropOverloads()) > 0 {
		return nil, nil, nil, errors.New("load_assignment.policy.drop_overloads is not implemented by the stand-in")
	}
	byPriority := map[uint32][]string{}
	members := map[string]bool{}
	transports := map[string]hostTransport{}
	best := ^uint32(0)
	for i, lle := range cla.GetEndpoints() {
		where := fmt.Sprintf("load_assignment.endpoints[%d]", i)
		if err := checkFields(where, lle); err != nil {
			return nil, nil, nil, err
		}
		for j, le := range lle.GetLbEndpoints() {
			ew := fmt.Sprintf("%s.lb_endpoints[%d]", where, j)
			ep := le.GetEndpoint()
			if err := checkAll(ew, le, ep, ep.GetAddress(), ep.GetAddress().GetSocketAddress()); err != nil {
				return nil, nil, nil, err
			}
			sa := ep.GetAddress().GetSocketAddress()
			if sa == nil {
				return nil, nil, nil, fmt.Errorf("%s: want a socket_address", ew)
			}
			ip, err := env.resolve(sa.GetAddress())
			if err != nil {
				// As Envoy: a name that does not resolve gives the cluster
				// no host (and requests to it "no healthy upstream").
				env.log.Error(err, "cluster host not resolved", "where", ew)
				continue
			}
			hostPort := net.JoinHostPort(ip, strconv.Itoa(int(sa.GetPortValue())))
			members[hostPort] = true
			transports[hostPort] = sel.pick(le.GetMetadata(), lle.GetMetadata())
			switch le.GetHealthStatus() {
			case corev3.HealthStatus_UNHEALTHY, corev3.HealthStatus_DRAINING, corev3.HealthStatus_TIMEOUT:
				continue
			}
			p := lle.GetPriority()
			byPriority[p] = append(byPriority[p], hostPort)
			best = min(best, p)
		}
	}
	return byPriority[best], members, transports, nil
}
