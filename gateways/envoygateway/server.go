package envoygateway

import (
	"context"
	"encoding/json"

	pb "github.com/envoyproxy/gateway/proto/extension"
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

// Server is the EnvoyGatewayExtension gRPC service: Envoy Gateway calls
// it during every translation (extensionManager hooks Route, Cluster and
// Translation) for the routes and clusters of HTTPRoute rules whose
// backendRef is an InferencePool.
type Server struct {
	pb.UnimplementedEnvoyGatewayExtensionServer
	endpoints Endpoints
	cfg       Config
	log       logr.Logger
}

// NewServer returns the service over an endpoint source. With cfg.EDS set,
// the pools' clusters take their endpoints from the extension's EDS
// service at that address (and endpoints is not read); without, they are
// written into each cluster at translation time. With cfg.Payload set, the
// payload processor runs before the pools' pickers.
func NewServer(endpoints Endpoints, cfg Config, log logr.Logger) *Server {
	return &Server{endpoints: endpoints, cfg: cfg, log: log}
}

// Register adds the service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { pb.RegisterEnvoyGatewayExtensionServer(g, s) }

// pool returns the first InferencePool among the resources Envoy Gateway
// attached (nil when none), and why it cannot be used.
func pool(resources []*pb.ExtensionResource) (*Pool, error) {
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
		return p, nil
	}
	return nil, nil
}

// PostRouteModify enables the pool's picker on the route of a rule whose
// backend is an InferencePool.
func (s *Server) PostRouteModify(_ context.Context, req *pb.PostRouteModifyRequest) (*pb.PostRouteModifyResponse, error) {
	p, perr := pool(req.GetPostRouteContext().GetExtensionResources())
	if p == nil && perr == nil {
		// Not a pool's route.
		return &pb.PostRouteModifyResponse{Route: req.GetRoute()}, nil
	}
	if perr != nil {
		s.log.Error(perr, "route answers 500", "route", req.GetRoute().GetName())
	}
	r, err := ModifyRoute(req.GetRoute(), p, perr)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "route %q: %v", req.GetRoute().GetName(), err)
	}
	return &pb.PostRouteModifyResponse{Route: r}, nil
}

// PostClusterModify fills the pool's cluster with its endpoints behind the
// override_host policy.
func (s *Server) PostClusterModify(ctx context.Context, req *pb.PostClusterModifyRequest) (*pb.PostClusterModifyResponse, error) {
	p, perr := pool(req.GetPostClusterContext().GetBackendExtensionResources())
	if p == nil || perr != nil {
		// Not a pool, or one whose route answers 500: leave the cluster alone.
		return &pb.PostClusterModifyResponse{Cluster: req.GetCluster()}, nil
	}
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

// PostTranslateModify adds each pool's picker cluster and filter.
func (s *Server) PostTranslateModify(_ context.Context, req *pb.PostTranslateModifyRequest) (*pb.PostTranslateModifyResponse, error) {
	clusters, listeners, err := ModifyTranslation(req.GetClusters(), req.GetListeners(), req.GetRoutes(), s.cfg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "translation: %v", err)
	}
	return &pb.PostTranslateModifyResponse{
		Clusters: clusters, Secrets: req.GetSecrets(), Listeners: listeners, Routes: req.GetRoutes(),
	}, nil
}
