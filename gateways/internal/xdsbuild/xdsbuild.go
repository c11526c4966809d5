// Package xdsbuild builds the Envoy configuration pieces every gateway
// integration renders the same way: the clusters that reach the picker and
// the payload processor, their ext_proc filters, and the filter that takes
// a client's own steering headers off the request. The Envoy Gateway
// extension and the plain-Envoy bootstrap both use it, so a fix to one
// shape is a fix to all.
package xdsbuild

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/inference/wire"
)

// Defaults of what is rendered.
const (
	// MessageTimeout bounds a processor's answer where Envoy applies one:
	// not on a FULL_DUPLEX_STREAMED body, where only the stream's own
	// timeouts hold.
	MessageTimeout = 10 * time.Second
	// ConnectTimeout bounds connecting to a processor.
	ConnectTimeout = 5 * time.Second
	// RouterFilter is the name Envoy's router filter goes by.
	RouterFilter = "envoy.filters.http.router"
	// PayloadMetadataNamespace is where the payload processor reports token
	// usage (extproc/payload.MetadataNamespace).
	PayloadMetadataNamespace = "io.infergate.payload"
)

// Any wraps m; m is always a well-formed message, so it cannot fail.
func Any(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err) // unreachable: marshalling a valid message
	}
	return a
}

// Filter is an HTTP filter of the connection manager.
func Filter(name string, config proto.Message) *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: Any(config)}}
}

// ClientCert is a PEM certificate chain and its private key, presented to
// processors that require client certificates (--client-ca-file). It
// travels inline in the clusters' TLS context; Envoy redacts private keys
// (a sensitive field) from its config dumps.
type ClientCert struct {
	ChainPEM, KeyPEM []byte
}

// TLS is how a cluster reaches its server: nil for plaintext; otherwise
// TLS that accepts the server's certificate (processors serve self-signed
// ones by default), sending SNI and, when set, a client certificate.
type TLS struct {
	SNI        string
	ClientCert *ClientCert
}

// GRPCCluster is a STRICT_DNS cluster of the gRPC servers at host:port
// over HTTP/2, health checked (ProcessorHealth). STRICT_DNS makes each
// address host resolves to a host of its own, resolved again every 5 s
// (source/extensions/clusters/dns/dns_cluster.cc): a headless Service's
// name gives Envoy one host per ready pod, which it can fail over between;
// a ClusterIP is one host, down whenever the pod its checks reach is.
//
// Connections carry TCP keepalive (ProcessorKeepalive) and
// TCP_USER_TIMEOUT (ProcessorUserTimeout), which the kernel applies
// whatever the server: a connection to a peer that vanished without a
// word (a node lost, a partition) is closed within about 10 s, idle or
// with streams waiting on it, instead of the kernel's two hours (idle) or
// about 15 minutes of retransmissions; its streams are reset and the
// requests on them answered by the failure mode. HTTP/2 PING keepalive
// (Http2ProtocolOptions.connection_keepalive) is not set: grpc-go servers,
// GAIE's and llm-d's endpoint pickers among them, allow a PING only every
// 5 minutes by default (keepalive.EnforcementPolicy MinTime) and close the
// connection, streams and all, with GOAWAY ENHANCE_YOUR_CALM
// "too_many_pings" after a few more frequent ones.
func GRPCCluster(name, host string, port uint32, tls *TLS) *clusterv3.Cluster {
	c := &clusterv3.Cluster{
		Name:                      name,
		ClusterDiscoveryType:      &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		LbPolicy:                  clusterv3.Cluster_ROUND_ROBIN,
		ConnectTimeout:            durationpb.New(ConnectTimeout),
		HealthChecks:              []*corev3.HealthCheck{ProcessorHealth()},
		CommonLbConfig:            &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{Value: 0}},
		UpstreamConnectionOptions: &clusterv3.UpstreamConnectionOptions{TcpKeepalive: ProcessorKeepalive()},
		// A bind config of socket options alone, no address (Envoy 1.25+).
		UpstreamBindConfig: &corev3.BindConfig{SocketOptions: []*corev3.SocketOption{ProcessorUserTimeout()}},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: SocketAddress(host, port),
			}}}},
		}}},
		TypedExtensionProtocolOptions: map[string]*anypb.Any{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": Any(&httpv3.HttpProtocolOptions{
				UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
				}},
			}),
		},
	}
	if tls != nil {
		c.TransportSocket = upstreamTLS(tls)
	}
	return c
}

// Health checking of a processor's cluster. A processor that cannot be
// reached must fail its stream at the start, not later: Envoy lets
// failure_mode_allow through a FULL_DUPLEX_STREAMED body only until body
// data has reached the filter (ext_proc.cc Filter::failureModeAllow,
// processor_state.cc canFailOpen), and a refused connection is known only
// after that, so the request would get a 500. A stream start fails at once
// only when the cluster has no healthy host (async_client_impl.cc
// AsyncStreamImpl::initialize, the router's "no healthy upstream"). So the
// cluster checks its hosts over grpc.health.v1 (every infergate processor
// serves it on its ext_proc port, NOT_SERVING while it drains) and never
// goes into panic (healthy_panic_threshold 0), which would use unhealthy
// hosts again. A host is out after one NOT_SERVING answer, or after
// ProcessorUnhealthyThreshold checks without one; the no-traffic intervals
// equal the interval, since Envoy's default for a cluster that never
// carried traffic is 60 s (HealthCheckerImplBase::interval).
//
// Each check opens a connection of its own (reuse_connection false). With
// the default, checks share one connection and a timeout resets only the
// stream (source/extensions/health_checkers/grpc/health_checker_impl.cc
// GrpcActiveHealthCheckSession::onTimeout): a connection to a pod that
// vanished without a word would keep failing checks until the kernel gave
// up retransmitting (about 15 minutes), and a ClusterIP's connection
// tracking would keep it on the dead pod after a replacement is ready. A
// new connection per check reaches whoever answers the address now. A host
// found unhealthy has its worker connections drained by Envoy (idle ones
// closed, busy ones take no new stream: cluster_manager_impl.cc
// onHostHealthFailure), so new streams open fresh connections once it is
// healthy again; close_connections_on_host_health_failure would add
// nothing for HTTP pools and is not set.
const (
	ProcessorHealthInterval     = 2 * time.Second
	ProcessorHealthTimeout      = time.Second
	ProcessorUnhealthyThreshold = 2
)

// Health checks a processor's cluster may run (ProcessorHealthOf).
const (
	// HealthGRPC is grpc.health.v1 on the ext_proc port, which every
	// infergate processor serves (NOT_SERVING while it drains, so a
	// rollout moves streams off a pod before it stops).
	HealthGRPC = "grpc"
	// HealthTCP is a connect-only check, for a processor that serves no
	// grpc.health.v1 on its ext_proc port (GAIE's and llm-d's pickers
	// unless run with --health-checking), which a gRPC check would never
	// find healthy (an UNIMPLEMENTED answer is an active failure). It sees
	// a crash or a lost node, not a drain.
	HealthTCP = "tcp"
)

// ProcessorHealthOf is the check kind names ("" is HealthGRPC).
func ProcessorHealthOf(kind string) (*corev3.HealthCheck, error) {
	switch kind {
	case "", HealthGRPC:
		return ProcessorHealth(), nil
	case HealthTCP:
		hc := ProcessorHealth()
		// Connect only: no payload sent or expected; a connection per
		// check (reuse_connection false), since with a reused connection
		// an empty check passes without a packet exchanged
		// (source/extensions/health_checkers/tcp/health_checker_impl.cc
		// TcpActiveHealthCheckSession::onInterval).
		hc.HealthChecker = &corev3.HealthCheck_TcpHealthCheck_{TcpHealthCheck: &corev3.HealthCheck_TcpHealthCheck{}}
		return hc, nil
	}
	return nil, fmt.Errorf("%q: want %s or %s", kind, HealthGRPC, HealthTCP)
}

// ProcessorHealth is the gRPC health check of a processor's cluster.
func ProcessorHealth() *corev3.HealthCheck {
	interval := durationpb.New(ProcessorHealthInterval)
	return &corev3.HealthCheck{
		Timeout:                  durationpb.New(ProcessorHealthTimeout),
		Interval:                 interval,
		NoTrafficInterval:        interval,
		NoTrafficHealthyInterval: interval,
		UnhealthyThreshold:       wrapperspb.UInt32(ProcessorUnhealthyThreshold),
		HealthyThreshold:         wrapperspb.UInt32(1),
		ReuseConnection:          wrapperspb.Bool(false),
		HealthChecker: &corev3.HealthCheck_GrpcHealthCheck_{GrpcHealthCheck: &corev3.HealthCheck_GrpcHealthCheck{
			ServiceName: wire.ExtProcHealthService,
		}},
	}
}

// TCP keepalive of a processor's connections: probes after 5 s idle, every
// 2 s, 3 unanswered close it (about 11 s). The kernel sends them only
// while nothing sent is unacknowledged.
const (
	ProcessorKeepaliveTime     = 5
	ProcessorKeepaliveInterval = 2
	ProcessorKeepaliveProbes   = 3
)

// ProcessorUserTimeoutMillis bounds how long data sent to a processor may
// stay unacknowledged before the kernel closes the connection
// (TCP_USER_TIMEOUT); it also ends keepalive probing at that age. A live
// processor's kernel acknowledges at once, however busy the process.
const ProcessorUserTimeoutMillis = 10000

// ProcessorUserTimeout is TCP_USER_TIMEOUT as a literal socket option
// (Linux: level IPPROTO_TCP 6, name TCP_USER_TIMEOUT 18), set before the
// connection is made (source/common/network/socket_option_impl.cc).
func ProcessorUserTimeout() *corev3.SocketOption {
	return &corev3.SocketOption{
		Description: "TCP_USER_TIMEOUT",
		Level:       6,
		Name:        18,
		Value:       &corev3.SocketOption_IntValue{IntValue: ProcessorUserTimeoutMillis},
		State:       corev3.SocketOption_STATE_PREBIND,
	}
}

// ProcessorKeepalive is the TCP keepalive of a processor's connections.
func ProcessorKeepalive() *corev3.TcpKeepalive {
	return &corev3.TcpKeepalive{
		KeepaliveTime:     wrapperspb.UInt32(ProcessorKeepaliveTime),
		KeepaliveInterval: wrapperspb.UInt32(ProcessorKeepaliveInterval),
		KeepaliveProbes:   wrapperspb.UInt32(ProcessorKeepaliveProbes),
	}
}

// upstreamTLS is the TLS a processor's cluster originates. It offers ALPN
// h2 and nothing else: grpc-go refuses a TLS client that negotiates none.
// Envoy would offer h2 to an HTTP/2 cluster without it too (its pool
// passes the protocol as the ALPN fallback: source/common/http/
// conn_pool_base.cc wrapTransportSocketOptions, used when the context
// sets none by source/common/tls/client_context_impl.cc newSsl); Istio
// sets it on the HTTP/2 outbound clusters its DestinationRules originate
// TLS for (pilot/pkg/networking/core/cluster_tls.go constructUpstreamTLS,
// ALPNH2Only). Here it is in the xDS for anyone to read.
func upstreamTLS(t *TLS) *corev3.TransportSocket {
	ctc := &tlsv3.CommonTlsContext{AlpnProtocols: []string{"h2"}}
	if cc := t.ClientCert; cc != nil {
		ctc.TlsCertificates = []*tlsv3.TlsCertificate{{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: cc.ChainPEM}},
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: cc.KeyPEM}},
		}}
	}
	return &corev3.TransportSocket{
		Name:       "envoy.transport_sockets.tls",
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: Any(&tlsv3.UpstreamTlsContext{Sni: t.SNI, CommonTlsContext: ctc})},
	}
}

// SocketAddress is a TCP address.
func SocketAddress(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// GRPCService reaches cluster, with authority as the :authority of the
// calls (empty: the cluster name, Envoy's default).
func GRPCService(cluster, authority string) *corev3.GrpcService {
	return &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{
		ClusterName: cluster, Authority: authority,
	}}}
}

// PayloadProcessor is the payload processor's filter with the settings its
// README asks for: headers and FULL_DUPLEX_STREAMED bodies both ways (the
// response body for token usage) and its usage metadata received.
// failure_mode_allow only if asked: with streamed bodies a processor that
// dies mid-body cannot fail open anyway.
func PayloadProcessor(cluster string, failOpen bool) *extprocv3.ExternalProcessor {
	return &extprocv3.ExternalProcessor{
		GrpcService:      GRPCService(cluster, ""),
		FailureModeAllow: failOpen,
		ProcessingMode: &extprocv3.ProcessingMode{
			RequestHeaderMode:   extprocv3.ProcessingMode_SEND,
			RequestBodyMode:     extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			RequestTrailerMode:  extprocv3.ProcessingMode_SEND,
			ResponseHeaderMode:  extprocv3.ProcessingMode_SEND,
			ResponseBodyMode:    extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseTrailerMode: extprocv3.ProcessingMode_SEND,
		},
		MetadataOptions: &extprocv3.MetadataOptions{
			ReceivingNamespaces: &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: []string{PayloadMetadataNamespace}},
		},
	}
}

// PickerMode is what a pool's picker gets on the pool's routes: request
// headers and a streamed request body (FULL_DUPLEX_STREAMED, which needs
// trailers SEND), response headers for the served endpoint, and response
// bodies only if asked.
func PickerMode(responseBody bool) *extprocv3.ProcessingMode {
	mode := &extprocv3.ProcessingMode{
		RequestHeaderMode:   extprocv3.ProcessingMode_SEND,
		RequestBodyMode:     extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		RequestTrailerMode:  extprocv3.ProcessingMode_SEND,
		ResponseHeaderMode:  extprocv3.ProcessingMode_SEND,
		ResponseBodyMode:    extprocv3.ProcessingMode_NONE,
		ResponseTrailerMode: extprocv3.ProcessingMode_SKIP,
	}
	if responseBody {
		mode.ResponseBodyMode = extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED
		mode.ResponseTrailerMode = extprocv3.ProcessingMode_SEND
	}
	return mode
}

// IdlePicker is a pool's picker filter as a listener holds it: in the
// chain of every request but sending nothing (headers SKIP, bodies NONE),
// so that only the pool's routes, through an ExtProcPerRoute override of
// PickerMode (PickerOnRoute), make it talk to the picker. It is not
// disabled: Envoy fixes a request's filter chain from the first route it
// matches, and a request may reach the pool's route only once the payload
// processor has set its model header and the route is matched again;
// per-route overrides, by contrast, are read from the route current when
// the filter runs. envoy.lb is received (the pick, which the router's
// override_host reads) and forwarded: Envoy itself writes nothing there
// for the picker (neither the served endpoint nor a subset hint, which
// GAIE carries in its own namespace envoy.lb.subset_hint, not forwarded
// here), so the picker sees only what another filter of the chain put in
// it. failure_mode_allow is the pool's failureMode.
func IdlePicker(cluster, authority string, failOpen bool) *extprocv3.ExternalProcessor {
	ns := &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: []string{wire.LBNamespace}}
	return &extprocv3.ExternalProcessor{
		GrpcService:      GRPCService(cluster, authority),
		FailureModeAllow: failOpen,
		ProcessingMode: &extprocv3.ProcessingMode{
			RequestHeaderMode:  extprocv3.ProcessingMode_SKIP,
			ResponseHeaderMode: extprocv3.ProcessingMode_SKIP,
		},
		MessageTimeout:  durationpb.New(MessageTimeout),
		MetadataOptions: &extprocv3.MetadataOptions{ForwardingNamespaces: ns, ReceivingNamespaces: ns},
	}
}

// FallbackRetries is the retry policy a pool's route gets when it has none
// of its own: Envoy walks the picker's fallback list (override_host takes
// the next host of the list on each attempt) only when the route retries.
// It retries only what never reached a model server (a refused or failed
// connection, a refused HTTP/2 stream), so no prompt is run twice, up to
// FallbackRetryCount times, never on a host already tried.
func FallbackRetries() *routev3.RetryPolicy {
	return &routev3.RetryPolicy{
		RetryOn:    "connect-failure,refused-stream",
		NumRetries: wrapperspb.UInt32(FallbackRetryCount),
		RetryHostPredicate: []*routev3.RetryPolicy_RetryHostPredicate{{
			Name:       "envoy.retry_host_predicates.previous_hosts",
			ConfigType: &routev3.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: Any(&previoushostsv3.PreviousHostsPredicate{})},
		}},
		HostSelectionRetryMaxAttempts: 5,
	}
}

// FallbackRetryCount is FallbackRetries' number of retries: a pick and two
// fallbacks.
const FallbackRetryCount = 2

// RouteTimeout bounds a request to a pool, its streamed answer included,
// where nothing else sets a bound: Envoy's default route timeout, 15 s
// (RouteAction.timeout; config_impl.cc RouteEntryImplBase), cuts
// generations that run longer, which long prompts and outputs do.
const RouteTimeout = 10 * time.Minute

// PickerOnRoute is the per-route configuration that turns an IdlePicker
// filter on for a pool's route.
func PickerOnRoute(responseBody bool) *extprocv3.ExtProcPerRoute {
	return &extprocv3.ExtProcPerRoute{
		Override: &extprocv3.ExtProcPerRoute_Overrides{Overrides: &extprocv3.ExtProcOverrides{ProcessingMode: PickerMode(responseBody)}},
	}
}

// StripSteering removes a client's own x-gateway-destination-endpoint from
// the request, so that it never reaches a picker or a cluster that routes
// by it (an ORIGINAL_DST cluster keyed on that header would otherwise
// send the request wherever the client asked).
func StripSteering() *headermutationv3.HeaderMutation {
	return &headermutationv3.HeaderMutation{Mutations: &headermutationv3.Mutations{
		RequestMutations: []*mutationrulesv3.HeaderMutation{{Action: &mutationrulesv3.HeaderMutation_Remove{Remove: wire.DestinationEndpointKey}}},
	}}
}

// HostPort splits "host:port", refusing an empty host and a port outside
// 1-65535, so a mistyped address fails at translation, not in Envoy.
func HostPort(hostPort string) (string, uint32, error) {
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("port %q must be 1-65535", port)
	}
	if host == "" {
		return "", 0, errors.New("the host is empty")
	}
	return host, uint32(n), nil
}
