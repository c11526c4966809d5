package envoygateway

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	pb "github.com/envoyproxy/gateway/proto/extension"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// Endpoints lists a pool's endpoints (ready pod IP × target port, as
// ip:port) at the time of a translation.
type Endpoints interface {
	Endpoints(ctx context.Context, p *Pool) ([]string, error)
}

// Rules reads HTTPRoute rules: a rule split between InferencePools needs
// its backendRefs' weights, which Envoy Gateway does not pass to the hooks.
type Rules interface {
	// PoolWeights is the weight of each InferencePool backendRef of the
	// rule, by pool (namespace/name).
	PoolWeights(ctx context.Context, r RuleRef) (map[string]uint32, error)
}

// RuleRef names an HTTPRoute rule.
type RuleRef struct {
	Namespace, Name string
	Rule            int
}

// Server is the EnvoyGatewayExtension gRPC service: Envoy Gateway calls
// it during every translation (extensionManager hooks Route, Cluster and
// Translation) for the routes and clusters of HTTPRoute rules whose
// backendRef is an InferencePool.
type Server struct {
	pb.UnimplementedEnvoyGatewayExtensionServer
	endpoints Endpoints
	rules     Rules
	rulesWait time.Duration
	cfg       Config
	log       logr.Logger
}

// NewServer returns the service over an endpoint source and a rule source
// (read for rules split between pools; without one, such a rule answers
// 500). With cfg.EDS set, the pools' clusters take their endpoints from the
// extension's EDS service at that address (and endpoints is not read);
// without, they are written into each cluster at translation time. With
// cfg.Payload set, the payload processor runs before the pools' pickers.
func NewServer(endpoints Endpoints, rules Rules, cfg Config, log logr.Logger) *Server {
	return &Server{endpoints: endpoints, rules: rules, rulesWait: rulesWait, cfg: cfg, log: log}
}

// Register adds the service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { pb.RegisterEnvoyGatewayExtensionServer(g, s) }

// pools returns the InferencePools among the resources Envoy Gateway
// attached, in backendRef order and each once, and why one cannot be used.
func pools(resources []*pb.ExtensionResource) ([]*Pool, error) {
	var out []*Pool
	for _, r := range resources {
		var tm metav1.TypeMeta
		if err := json.Unmarshal(r.GetUnstructuredBytes(), &tm); err != nil || tm.Kind != "InferencePool" ||
			tm.GroupVersionKind().Group != inferencev1.GroupVersion.Group {
			continue // another extension's resource
		}
		p, err := ParsePool(r.GetUnstructuredBytes())
		if err != nil {
			// The route still needs the pool's name for its error.
			return nil, err
		}
		if !slices.ContainsFunc(out, func(q *Pool) bool { return q.Key() == p.Key() }) {
			out = append(out, p)
		}
	}
	return out, nil
}

// PostRouteModify enables the pool's picker on the route of a rule whose
// backend is an InferencePool; a rule split between pools gets a weighted
// cluster per pool.
func (s *Server) PostRouteModify(ctx context.Context, req *pb.PostRouteModifyRequest) (*pb.PostRouteModifyResponse, error) {
	route := req.GetRoute()
	ps, perr := pools(req.GetPostRouteContext().GetExtensionResources())
	if len(ps) == 0 && perr == nil {
		// Not a pool's route.
		return &pb.PostRouteModifyResponse{Route: route}, nil
	}
	var r *routev3.Route
	var err error
	switch {
	case perr != nil:
		s.log.Error(perr, "route answers 500", "route", route.GetName())
		r, err = ModifyRoute(route, nil, perr)
	case len(ps) == 1:
		r, err = ModifyRoute(route, ps[0], nil)
	default:
		weights, werr := s.weights(ctx, route.GetName(), ps)
		if werr != nil {
			s.log.Error(werr, "route answers 500", "route", route.GetName())
			r, err = ModifyRoute(route, nil, werr)
			break
		}
		r, err = SplitRoute(route, ps, weights)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "route %q: %v", route.GetName(), err)
	}
	return &pb.PostRouteModifyResponse{Route: r}, nil
}

// weights are the backendRef weights of ps in the rule route belongs to
// (Envoy Gateway names a route httproute/<namespace>/<name>/rule/<index>/...).
func (s *Server) weights(ctx context.Context, route string, ps []*Pool) ([]uint32, error) {
	ref, ok := ParseRouteName(route)
	if !ok {
		return nil, fmt.Errorf("%w: route %q splits between pools but does not name its HTTPRoute rule", ErrInvalidPool, route)
	}
	if s.rules == nil {
		return nil, fmt.Errorf("%w: a rule split between pools needs the HTTPRoute's weights, and the extension reads no HTTPRoutes", ErrInvalidPool)
	}
	// The rule comes from the extension's cache, which may not have seen
	// the HTTPRoute Envoy Gateway is translating yet: wait a little for
	// the pools to match. (A change of weights alone cannot be told apart;
	// it shows at the next translation.)
	ctx, cancel := context.WithTimeout(ctx, s.rulesWait)
	defer cancel()
	for {
		out, err := s.ruleWeights(ctx, ref, ps)
		if err == nil {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: HTTPRoute %s/%s rule %d: %w", ErrInvalidPool, ref.Namespace, ref.Name, ref.Rule, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// rulesWait bounds how long a translation waits for the extension's cache
// to hold the rule it translates.
const rulesWait = 3 * time.Second

func (s *Server) ruleWeights(ctx context.Context, ref RuleRef, ps []*Pool) ([]uint32, error) {
	byPool, err := s.rules.PoolWeights(ctx, ref)
	if err != nil {
		return nil, err
	}
	out := make([]uint32, len(ps))
	for i, p := range ps {
		w, ok := byPool[p.Key()]
		if !ok {
			return nil, fmt.Errorf("no backendRef to pool %s", p.Key())
		}
		out[i] = w
	}
	return out, nil
}

// ParseRouteName reads the HTTPRoute rule of a route Envoy Gateway named
// httproute/<namespace>/<name>/rule/<index>/...
func ParseRouteName(name string) (RuleRef, bool) {
	parts := strings.SplitN(name, "/", 6)
	if len(parts) < 5 || parts[0] != "httproute" || parts[3] != "rule" {
		return RuleRef{}, false
	}
	i, err := strconv.Atoi(parts[4])
	if err != nil || i < 0 {
		return RuleRef{}, false
	}
	return RuleRef{Namespace: parts[1], Name: parts[2], Rule: i}, true
}

// PostClusterModify fills the pool's cluster with its endpoints behind the
// override_host policy. The cluster of a rule split between pools is left
// as it is: each pool gets a cluster of its own (PostTranslateModify).
func (s *Server) PostClusterModify(ctx context.Context, req *pb.PostClusterModifyRequest) (*pb.PostClusterModifyResponse, error) {
	ps, perr := pools(req.GetPostClusterContext().GetBackendExtensionResources())
	if len(ps) != 1 || perr != nil {
		// Not a pool, a split rule, or a pool whose route answers 500.
		return &pb.PostClusterModifyResponse{Cluster: req.GetCluster()}, nil
	}
	p := ps[0]
	var eps []string
	if s.cfg.EDS == nil {
		var err error
		if eps, err = s.endpoints.Endpoints(ctx, p); err != nil {
			// Envoy Gateway keeps its previous configuration when a hook fails.
			return nil, status.Errorf(codes.Unavailable, "endpoints of pool %s: %v", p.Key(), err)
		}
	}
	c, err := ModifyCluster(req.GetCluster(), p, eps, s.cfg.EDS)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "cluster %q: %v", req.GetCluster().GetName(), err)
	}
	s.log.V(1).Info("pool cluster", "cluster", c.GetName(), "pool", p.Key(), "endpoints", len(eps))
	return &pb.PostClusterModifyResponse{Cluster: c}, nil
}

// PostTranslateModify adds each pool's picker cluster and filter, and the
// pools' clusters of split rules.
func (s *Server) PostTranslateModify(ctx context.Context, req *pb.PostTranslateModifyRequest) (*pb.PostTranslateModifyResponse, error) {
	clusters, listeners, err := ModifyTranslation(ctx, req.GetClusters(), req.GetListeners(), req.GetRoutes(), s.cfg, s.endpoints)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "translation: %v", err)
	}
	return &pb.PostTranslateModifyResponse{
		Clusters: clusters, Secrets: req.GetSecrets(), Listeners: listeners, Routes: req.GetRoutes(),
	}, nil
}
