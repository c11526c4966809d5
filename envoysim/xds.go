package envoysim

import (
	"crypto/tls"
	"fmt"
	"maps"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

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
	// resolve maps a host name to its addresses; dns records those of
	// STRICT_DNS clusters, to be resolved again (refreshDNS).
	resolve func(host string) ([]string, error)
	dns     *dnsSeen
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
	connFor func(target string, tls bool, cert *tls.Certificate, so extprocfilter.SocketOptions) (*grpc.ClientConn, error)
	// currentConn is the channel to a processor host for a stream starting
	// now (connPool.current): nil, the one connFor gave.
	currentConn func(target string, tls bool, cert *tls.Certificate, so extprocfilter.SocketOptions) (*grpc.ClientConn, error)
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
