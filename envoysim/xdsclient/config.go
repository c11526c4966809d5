package xdsclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Type URLs of the resources the stand-in consumes, as they appear in
// DiscoveryRequest.type_url and DiscoveryResponse.type_url.
const (
	ListenerType = typePrefix + "envoy.config.listener.v3.Listener"
	RouteType    = typePrefix + "envoy.config.route.v3.RouteConfiguration"
	ClusterType  = typePrefix + "envoy.config.cluster.v3.Cluster"
	EndpointType = typePrefix + "envoy.config.endpoint.v3.ClusterLoadAssignment"
	SecretType   = typePrefix + "envoy.extensions.transport_sockets.tls.v3.Secret"

	typePrefix = "type.googleapis.com/"
	// wrapperType is envoy.service.discovery.v3.Resource, which servers use
	// to attach a ttl (go-control-plane does) or other per-resource fields.
	wrapperType = typePrefix + "envoy.service.discovery.v3.Resource"
)

// UserAgentName is sent as Node.user_agent_name so that control planes
// (and their logs) can tell the stand-in from a real Envoy.
const UserAgentName = "infergate-envoysim"

const (
	defaultBackoffInitial = 100 * time.Millisecond
	defaultBackoffMax     = 5 * time.Second
	// maxResponseBytes lifts grpc-go's 4 MiB receive limit: a control plane
	// with many services (Istio without Sidecar scoping) sends LDS and CDS
	// responses larger than that.
	maxResponseBytes = 128 << 20
)

// Service is the discovery service a Client streams from.
type Service string

const (
	// AggregatedService is ADS (envoy.service.discovery.v3.AggregatedDiscoveryService), every type on one stream.
	AggregatedService Service = "ADS"
	// EndpointService is EDS alone (envoy.service.endpoint.v3.EndpointDiscoveryService),
	// as Envoy streams it for a cluster whose eds_config is an api_config_source.
	EndpointService Service = "EDS"
)

// Config configures a Client.
type Config struct {
	// Service is AggregatedService (the default) or EndpointService.
	Service Service
	// Server is the host:port of the ADS server. It is dialled as given
	// (grpc's passthrough resolver); a target with a scheme ("dns:///...")
	// is used unchanged.
	Server string
	// NodeID is Node.id. Control planes key their per-proxy state on it
	// (go-control-plane's IDHash, Istio's sidecar~ip~pod.ns~domain form).
	NodeID string
	// NodeCluster is Node.cluster.
	NodeCluster string
	// NodeMetadata is Node.metadata; Istio reads its proxy settings from it.
	NodeMetadata *structpb.Struct
	// TLS secures the channel; nil means plaintext.
	TLS *tls.Config
	// Token, when set, is asked for a bearer token on every stream, sent as
	// the authorization header (the service-account JWT that Envoy
	// Gateway's gateway-namespace mode checks, say). It needs TLS.
	Token func(ctx context.Context) (string, error)
	// Logger receives connection events, ignored responses and NACKs at
	// level 0, every request and response at V(1).
	Logger logr.Logger
	// BackoffInitial and BackoffMax bound the jittered exponential delay
	// between stream attempts (default 100ms and 5s); the delay resets once
	// a stream has delivered a response. The same bounds pace repeated NACKs.
	BackoffInitial time.Duration
	BackoffMax     time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.Server == "" {
		return c, errors.New("xdsclient: Config.Server is required")
	}
	if c.Token != nil && c.TLS == nil {
		return c, errors.New("xdsclient: Config.Token needs TLS (a bearer token is not sent in plaintext)")
	}
	if c.NodeID == "" {
		return c, errors.New("xdsclient: Config.NodeID is required (control planes key node state on it)")
	}
	switch c.Service {
	case "":
		c.Service = AggregatedService
	case AggregatedService, EndpointService:
	default:
		return c, fmt.Errorf("xdsclient: Config.Service %q: want %s or %s", c.Service, AggregatedService, EndpointService)
	}
	if c.BackoffInitial < 0 || c.BackoffMax < 0 {
		return c, fmt.Errorf("xdsclient: negative backoff (initial %v, max %v)", c.BackoffInitial, c.BackoffMax)
	}
	if c.BackoffInitial == 0 {
		c.BackoffInitial = defaultBackoffInitial
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = max(defaultBackoffMax, c.BackoffInitial)
	}
	if c.BackoffInitial > c.BackoffMax {
		return c, fmt.Errorf("xdsclient: BackoffInitial %v exceeds BackoffMax %v", c.BackoffInitial, c.BackoffMax)
	}
	return c, nil
}

// Handler receives whole state-of-the-world updates, one type at a time.
type Handler interface {
	// Apply gets every resource of typeURL from one DiscoveryResponse,
	// already unwrapped and checked to be of typeURL: the full set for
	// wildcard LDS and CDS, the server's answer for the requested names of
	// RDS and EDS. A nil error ACKs. An error NACKs, with err.Error() as
	// DiscoveryRequest.error_detail.message; the handler must then keep the
	// state it had before the call, as Envoy keeps its last good config.
	//
	// Calls come one at a time, in stream order, from the goroutine that
	// reads the stream. Apply may call Client.Subscribe; those requests are
	// sent right after Apply returns, before its ACK.
	Apply(ctx context.Context, typeURL, version string, resources []*anypb.Any) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, typeURL, version string, resources []*anypb.Any) error

// Apply calls f.
func (f HandlerFunc) Apply(ctx context.Context, typeURL, version string, resources []*anypb.Any) error {
	return f(ctx, typeURL, version, resources)
}
