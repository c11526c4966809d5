// Package envoy renders a complete bootstrap for a plain Envoy in front of
// inference pools: no control plane, the pools, their pickers and the
// payload processor written out as static resources.
//
// Each pool's requests reach the endpoint its picker chose through an
// ORIGINAL_DST cluster keyed on x-gateway-destination-endpoint, the
// canonical recipe for gateways without InferencePool support. A request
// first matches the pool's fallback route (it has no such header yet),
// which turns the pool's picker on; the picker sets the header and clears
// the route cache, and the request is matched again, now to the ORIGINAL_DST
// route. When a FailOpen pool's picker cannot be reached, the request stays
// on the fallback route: round robin over the pool's endpoints (a FailClose
// pool answers 500 from the ext_proc filter, and its fallback route 503 if
// a picker ever answers without a pick). A client's own copy of the header
// is removed before any of this, so it can never choose its upstream.
package envoy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/infergate/infergate/gateways/internal/xdsbuild"
	"github.com/infergate/infergate/inference/wire"
)

// Defaults of Config.
const (
	DefaultListen       = "0.0.0.0:8080"
	DefaultAdmin        = "127.0.0.1:9901"
	DefaultRouteTimeout = xdsbuild.RouteTimeout
)

// Names in the rendered configuration.
const (
	ListenerName       = "infergate"
	RouteConfigName    = "infergate"
	PayloadFilterName  = "envoy.filters.http.ext_proc/infergate/payload"
	PayloadClusterName = "infergate/payload"
	StripFilterName    = "envoy.filters.http.header_mutation/infergate"
)

// Config describes the gateway to render.
type Config struct {
	// Listen is the host:port the gateway listener binds (DefaultListen).
	Listen string
	// Admin is the host:port of Envoy's admin interface (DefaultAdmin);
	// it stays on loopback unless set otherwise, as it can stop the proxy.
	Admin string
	// Pools are tried in order: those with Models first match their
	// models; at most one, the last, may take every model.
	Pools []Pool
	// Payload, when set, is the payload processor, run before the pickers.
	Payload *Processor
	// ClientCert is presented to the pickers and the payload processor
	// over TLS, for processors run with --client-ca-file.
	ClientCert *xdsbuild.ClientCert
	// RouteTimeout bounds a whole request, streamed answer included
	// (DefaultRouteTimeout).
	RouteTimeout time.Duration
}

// Processor is an ext_proc server: the payload processor or a picker.
type Processor struct {
	// Address is host:port (a DNS name is resolved by Envoy, STRICT_DNS).
	Address string
	// Plaintext turns TLS off; by default Envoy speaks TLS and accepts the
	// processor's self-signed certificate.
	Plaintext bool
	// FailOpen lets requests through when the processor cannot be reached
	// (failure_mode_allow): for a picker, the pool's failureMode FailOpen.
	FailOpen bool
	// HealthCheck is how Envoy checks it: xdsbuild.HealthGRPC (""; what
	// infergate's processors serve) or xdsbuild.HealthTCP, for a picker
	// without grpc.health.v1 on its ext_proc port (GAIE's and llm-d's
	// unless run with --health-checking).
	HealthCheck string
}

// Processor.HealthCheck values.
const (
	HealthGRPC = xdsbuild.HealthGRPC
	HealthTCP  = xdsbuild.HealthTCP
)

// Pool is one inference pool.
type Pool struct {
	// Name names the pool's clusters and filter (letters, digits, '-', '_', '.').
	Name string
	// Picker is the pool's endpoint picker.
	Picker Processor
	// Endpoints are the pool's model servers (host:port); a FailOpen
	// pool's fallback balances over them.
	Endpoints []string
	// Models, when set, are the base models the pool serves: requests
	// whose x-gateway-base-model-name (set by the payload processor) is
	// one of them come here. Empty: every request that no pool before it
	// took.
	Models []string
	// ResponseBody sends response bodies to the picker too.
	ResponseBody bool
}

var poolName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Bootstrap renders the configuration, or says what in c is wrong.
func Bootstrap(c Config) (*bootstrapv3.Bootstrap, error) {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Admin == "" {
		c.Admin = DefaultAdmin
	}
	if c.RouteTimeout == 0 {
		c.RouteTimeout = DefaultRouteTimeout
	}
	listen, err := address("listen", c.Listen)
	if err != nil {
		return nil, err
	}
	admin, err := address("admin", c.Admin)
	if err != nil {
		return nil, err
	}
	if err := check(c); err != nil {
		return nil, err
	}

	var clusters []*clusterv3.Cluster
	filters := []*hcmv3.HttpFilter{}
	if p := c.Payload; p != nil {
		cl, err := processorCluster(PayloadClusterName, *p, c.ClientCert)
		if err != nil {
			return nil, fmt.Errorf("payload: %w", err)
		}
		clusters = append(clusters, cl)
		filters = append(filters, xdsbuild.Filter(PayloadFilterName, xdsbuild.PayloadProcessor(PayloadClusterName, p.FailOpen)))
	}
	// After the payload processor (which drops client copies itself) and
	// before any picker.
	filters = append(filters, xdsbuild.Filter(StripFilterName, xdsbuild.StripSteering()))

	vh := &routev3.VirtualHost{Name: "inference", Domains: []string{"*"}}
	for _, p := range c.Pools {
		picker, err := processorCluster(pickerCluster(p), p.Picker, c.ClientCert)
		if err != nil {
			return nil, fmt.Errorf("pool %s: picker: %w", p.Name, err)
		}
		clusters = append(clusters, picker, pickedCluster(p))
		if p.Picker.FailOpen {
			fallback, err := fallbackCluster(p)
			if err != nil {
				return nil, fmt.Errorf("pool %s: %w", p.Name, err)
			}
			clusters = append(clusters, fallback)
		}
		filters = append(filters, xdsbuild.Filter(pickerFilter(p), xdsbuild.IdlePicker(pickerCluster(p), p.Picker.Address, p.Picker.FailOpen)))
		vh.Routes = append(vh.Routes, poolRoutes(p, c.RouteTimeout)...)
	}
	filters = append(filters, xdsbuild.Filter(xdsbuild.RouterFilter, &routerv3.Router{}))

	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: "infergate",
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: RouteConfigName, VirtualHosts: []*routev3.VirtualHost{vh},
		}},
		HttpFilters: filters,
		// Envoy's default, 300 s, would end a response that is silent for
		// that long (a long generation that is not streamed) before the
		// route timeout does (http_connection_manager.proto
		// stream_idle_timeout).
		StreamIdleTimeout: durationpb.New(c.RouteTimeout),
	}
	return &bootstrapv3.Bootstrap{
		Node:  &corev3.Node{Id: "infergate-gateway", Cluster: "infergate"},
		Admin: &bootstrapv3.Admin{Address: admin},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: []*listenerv3.Listener{{
				Name:    ListenerName,
				Address: listen,
				FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
					Name:       "envoy.filters.network.http_connection_manager",
					ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: xdsbuild.Any(hcm)},
				}}}},
			}},
			Clusters: clusters,
		},
	}, nil
}

// check validates what Bootstrap does not check on the way.
func check(c Config) error {
	if len(c.Pools) == 0 {
		return errors.New("pools: at least one pool is needed")
	}
	seen := map[string]bool{}
	for i, p := range c.Pools {
		where := fmt.Sprintf("pools[%d]", i)
		if !poolName.MatchString(p.Name) {
			return fmt.Errorf("%s.name: %q is not a name (letters, digits, '.', '-', '_', at most 63)", where, p.Name)
		}
		if seen[p.Name] {
			return fmt.Errorf("%s.name: %q is used twice", where, p.Name)
		}
		seen[p.Name] = true
		if len(p.Models) == 0 && i != len(c.Pools)-1 {
			return fmt.Errorf("%s: a pool without models takes every request, so it must be the last", where)
		}
		if len(p.Models) > 0 && c.Payload == nil {
			return fmt.Errorf("%s.models: routing by model needs the payload processor, which sets %s", where, wire.BaseModelNameHeader)
		}
		if p.Picker.FailOpen && len(p.Endpoints) == 0 {
			return fmt.Errorf("%s.endpoints: a FailOpen pool needs its endpoints, to balance over when the picker is down", where)
		}
		for j, ep := range p.Endpoints {
			if _, err := address(fmt.Sprintf("%s.endpoints[%d]", where, j), ep); err != nil {
				return err
			}
		}
	}
	return nil
}

// address parses host:port.
func address(field, hostPort string) (*corev3.Address, error) {
	host, port, err := xdsbuild.HostPort(hostPort)
	if err != nil {
		return nil, fmt.Errorf("%s: %q: %w", field, hostPort, err)
	}
	return xdsbuild.SocketAddress(host, port), nil
}

func pickerCluster(p Pool) string { return "infergate/epp/" + p.Name }
func pickerFilter(p Pool) string  { return "envoy.filters.http.ext_proc/infergate/" + p.Name }

// processorCluster reaches an ext_proc server.
func processorCluster(name string, p Processor, cert *xdsbuild.ClientCert) (*clusterv3.Cluster, error) {
	host, port, err := xdsbuild.HostPort(p.Address)
	if err != nil {
		return nil, fmt.Errorf("address %q: %w", p.Address, err)
	}
	var tls *xdsbuild.TLS
	if !p.Plaintext {
		tls = &xdsbuild.TLS{SNI: host, ClientCert: cert}
	}
	hc, err := xdsbuild.ProcessorHealthOf(p.HealthCheck)
	if err != nil {
		return nil, fmt.Errorf("healthCheck: %w", err)
	}
	c := xdsbuild.GRPCCluster(name, host, port, tls)
	c.HealthChecks = []*corev3.HealthCheck{hc}
	return c, nil
}

// pickedCluster sends a request to the address the picker put in
// x-gateway-destination-endpoint.
func pickedCluster(p Pool) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 "infergate/picked/" + p.Name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
		LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
		ConnectTimeout:       durationpb.New(xdsbuild.ConnectTimeout),
		LbConfig: &clusterv3.Cluster_OriginalDstLbConfig_{OriginalDstLbConfig: &clusterv3.Cluster_OriginalDstLbConfig{
			UseHttpHeader: true, HttpHeaderName: wire.DestinationEndpointKey,
		}},
	}
}

// fallbackCluster balances over the pool's endpoints, for a FailOpen
// pool whose picker is down.
func fallbackCluster(p Pool) (*clusterv3.Cluster, error) {
	name := "infergate/fallback/" + p.Name
	var eps []*endpointv3.LbEndpoint
	for _, ep := range p.Endpoints {
		addr, err := address("endpoints", ep)
		if err != nil {
			return nil, err
		}
		eps = append(eps, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}}})
	}
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		ConnectTimeout:       durationpb.New(xdsbuild.ConnectTimeout),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: eps,
		}}},
	}, nil
}

// poolRoutes are the pool's two routes: to the picked endpoint once the
// picker has named it, else the fallback, which is where the picker runs.
func poolRoutes(p Pool, timeout time.Duration) []*routev3.Route {
	var match []*routev3.HeaderMatcher
	if len(p.Models) > 0 {
		models := slices.Clone(p.Models)
		slices.Sort(models)
		match = append(match, modelMatcher(models))
	}
	picked := append(slices.Clone(match), &routev3.HeaderMatcher{
		Name: wire.DestinationEndpointKey, HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true},
	})
	enable := map[string]*anypb.Any{pickerFilter(p): xdsbuild.Any(xdsbuild.PickerOnRoute(p.ResponseBody))}
	action := func(cluster string) *routev3.Route_Route {
		return &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
			Timeout:          durationpb.New(timeout),
		}}
	}
	fallback := &routev3.Route{
		Name:                 "infergate/fallback/" + p.Name,
		Match:                &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: match},
		TypedPerFilterConfig: enable,
	}
	if p.Picker.FailOpen {
		fallback.Action = action("infergate/fallback/" + p.Name)
	} else {
		fallback.Action = &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
			Status: 503,
			Body:   &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "the endpoint picker chose no endpoint\n"}},
		}}
	}
	return []*routev3.Route{
		{
			Name:                 "infergate/picked/" + p.Name,
			Match:                &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: picked},
			Action:               action("infergate/picked/" + p.Name),
			TypedPerFilterConfig: enable,
		},
		fallback,
	}
}

// modelMatcher matches a request whose base-model header is one of models.
func modelMatcher(models []string) *routev3.HeaderMatcher {
	quoted := make([]string, len(models))
	for i, m := range models {
		quoted[i] = regexp.QuoteMeta(m)
	}
	pattern := strings.Join(quoted, "|")
	return &routev3.HeaderMatcher{Name: wire.BaseModelNameHeader, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
		StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{
			Regex: "^(?:" + pattern + ")$",
		}}},
	}}
}

// Marshal renders b as indented JSON (which Envoy reads as YAML too), the
// same bytes every time: protojson varies its spacing on purpose, so the
// output is compacted and indented again.
func Marshal(b *bootstrapv3.Bootstrap) ([]byte, error) {
	raw, err := protojson.Marshal(b)
	if err != nil {
		return nil, err
	}
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, err
	}
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
