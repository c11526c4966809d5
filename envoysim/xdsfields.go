package envoysim

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// fieldRules is how the stand-in treats one xDS message type: the fields it
// reads (each with Envoy's semantics) and the fields it may ignore because
// they do not change where a request goes or whether it is answered, each
// with the reason. Any other field that is set makes the update a NACK that
// names it: the stand-in never silently drops a field that could change
// routing.
type fieldRules struct {
	reads   []string
	ignores map[string]string
}

// xdsRules holds the rules per message type. It is read-only: a literal,
// never written after package initialisation.
var xdsRules = map[protoreflect.FullName]fieldRules{
	// A bootstrap (NodeConfig.Bootstrap, LoadBootstrap) is read for its
	// static_resources; dynamic_resources and static secrets are errors
	// where read (staticResources).
	"envoy.config.bootstrap.v3.Bootstrap": {
		// node: its id and metadata are the local node's, which
		// istio.metadata_exchange sends upstream (peerMetadataFilter).
		reads: []string{"static_resources", "dynamic_resources", "node"},
		ignores: map[string]string{
			"admin": "the stand-in has no admin interface: nothing is served at admin.address",
		},
	},
	"envoy.config.bootstrap.v3.Bootstrap.StaticResources": {
		reads: []string{"listeners", "clusters", "secrets"},
	},
	"envoy.config.listener.v3.Listener": {
		// per_connection_buffer_limit_bytes bounds the request body a
		// route's retry policy may replay (table.bufferLimit).
		reads: []string{"name", "address", "filter_chains", "default_filter_chain", "listener_filters", "per_connection_buffer_limit_bytes"},
		ignores: map[string]string{
			"stat_prefix":                          "statistics",
			"drain_type":                           "drain behaviour on shutdown",
			"access_log":                           "logging",
			"traffic_direction":                    "statistics and tracing",
			"listener_filters_timeout":             "only bounds listener filters, which the stand-in does not run",
			"continue_on_listener_filters_timeout": "only bounds listener filters, which the stand-in does not run",
			"enable_reuse_port":                    "socket option",
			"socket_options":                       "socket option",
			"metadata":                             "opaque to routing",
			"connection_balance_config":            "spreads connections over worker threads",
			"freebind":                             "socket option",
			"bypass_overload_manager":              "overload manager, which the stand-in does not have",
			"max_connections_to_accept_per_socket_event": "connection accept batching",
		},
	},
	"envoy.config.listener.v3.ListenerFilter": {
		reads: []string{"name", "typed_config"},
	},
	"envoy.config.listener.v3.FilterChain": {
		reads: []string{"filters", "filter_chain_match"},
		ignores: map[string]string{
			"name":     "a label",
			"metadata": "opaque to routing",
			// A chain's transport_socket is NACKed: its connections are
			// plaintext, with no handshake to time out.
			"transport_socket_connect_timeout": "bounds the downstream transport socket's handshake; the stand-in's chains are plaintext (transport_socket is NACKed)",
		},
	},
	"envoy.config.listener.v3.FilterChainMatch": {
		// Present but empty, or naming only what a plaintext HTTP listener
		// matches anyway.
		reads: []string{"transport_protocol"},
	},
	"envoy.config.listener.v3.Filter": {
		reads: []string{"name", "typed_config"},
	},
	"envoy.config.core.v3.Address": {
		reads: []string{"socket_address"},
	},
	"envoy.config.core.v3.SocketAddress": {
		reads:   []string{"address", "port_value", "protocol"},
		ignores: map[string]string{"ipv4_compat": "dual-stack socket option"},
	},
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager": {
		reads: []string{"stream_idle_timeout", "route_config", "rds", "http_filters", "codec_type", "proxy_100_continue", "forward_client_cert_details"},
		ignores: map[string]string{
			"stat_prefix":                          "statistics",
			"access_log":                           "logging",
			"use_remote_address":                   "x-forwarded-for handling, which the stand-in does not do",
			"xff_num_trusted_hops":                 "x-forwarded-for handling, which the stand-in does not do",
			"skip_xff_append":                      "x-forwarded-for handling, which the stand-in does not do",
			"via":                                  "adds a via header",
			"generate_request_id":                  "x-request-id, which the stand-in does not generate",
			"preserve_external_request_id":         "x-request-id, which the stand-in does not generate",
			"server_name":                          "the server response header",
			"server_header_transformation":         "the server response header",
			"common_http_protocol_options":         "connection limits (idle timeout, header count)",
			"http_protocol_options":                "HTTP/1 codec options",
			"http2_protocol_options":               "HTTP/2 codec options; the stand-in serves HTTP/1.1",
			"request_timeout":                      "bounds receiving the request; requests in tests arrive at once",
			"request_headers_timeout":              "bounds receiving the headers; requests in tests arrive at once",
			"drain_timeout":                        "drain behaviour on shutdown",
			"delayed_close_timeout":                "connection close timing",
			"max_request_headers_kb":               "a limit requests in tests stay under",
			"normalize_path":                       "only changes paths with dot segments or escapes; the stand-in matches the path as sent",
			"merge_slashes":                        "only changes paths with repeated slashes; the stand-in matches the path as sent",
			"path_with_escaped_slashes_action":     "only changes paths with escaped slashes; the stand-in matches the path as sent",
			"upgrade_configs":                      "WebSocket and other upgrades, which inference requests do not use",
			"tracing":                              "tracing",
			"internal_address_config":              "which peers count as internal, for header sanitising the stand-in does not do",
			"add_user_agent":                       "user-agent and x-envoy-downstream-service-cluster headers",
			"early_header_mutation_extensions":     "none set by the inference integrations; listed so a set one is seen",
			"append_x_forwarded_port":              "x-forwarded-port header",
			"append_local_overload":                "overload header",
			"scheme_header_transformation":         "the :scheme the stand-in always sets to http",
			"strip_trailing_host_dot":              "only changes authorities ending in a dot",
			"set_current_client_cert_details":      "what x-forwarded-client-cert says of a client certificate; the stand-in's plaintext listeners never see one",
			"local_reply_config":                   "rewrites local reply bodies only",
			"request_id_extension":                 "x-request-id, which the stand-in does not generate",
			"stream_error_on_invalid_http_message": "HTTP/1 protocol errors",
		},
	},
	"envoy.extensions.filters.network.http_connection_manager.v3.Rds": {
		reads: []string{"route_config_name", "config_source"},
	},
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter": {
		reads:   []string{"name", "typed_config", "disabled"},
		ignores: map[string]string{"is_optional": "only matters for filter types the proxy does not know, which are NACKed"},
	},
	"envoy.extensions.filters.http.header_mutation.v3.HeaderMutation": {
		reads: []string{"mutations"},
	},
	"envoy.extensions.filters.http.header_mutation.v3.Mutations": {
		// Only removals of request headers (checked where read).
		reads: []string{"request_mutations"},
	},
	"envoy.config.common.mutation_rules.v3.HeaderMutation": {
		reads: []string{"remove"},
	},
	// The configs of pass-through filters that act only when a field is
	// set: any field set is a NACK.
	"envoy.extensions.filters.http.fault.v3.HTTPFault": {},
	"envoy.extensions.filters.http.cors.v3.Cors":       {},
	"envoy.extensions.filters.http.health_check.v3.HealthCheck": {
		// Only non-pass-through mode (checked where read).
		reads: []string{"pass_through_mode", "headers"},
	},
	"envoy.extensions.filters.http.router.v3.Router": {
		ignores: map[string]string{
			"dynamic_stats":          "statistics",
			"start_child_span":       "tracing",
			"suppress_envoy_headers": "x-envoy-* headers, which the stand-in does not add",
		},
	},
	"envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor": {
		reads: []string{"grpc_service", "failure_mode_allow", "processing_mode", "message_timeout",
			"metadata_options", "mutation_rules", "allow_mode_override", "disable_clear_route_cache",
			"route_cache_action", "status_on_error", "disable_immediate_response"},
		ignores: map[string]string{
			"stat_prefix":            "statistics",
			"deferred_close_timeout": "only used in observability_mode, which is NACKed",
			"emit_client_span":       "tracing",
			"max_message_timeout":    "only bounds override_message_timeout answers; the processors under test send none",
		},
	},
	"envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute": {
		reads: []string{"disabled", "overrides"},
	},
	"envoy.extensions.filters.http.ext_proc.v3.ExtProcOverrides": {
		reads: []string{"processing_mode", "grpc_service", "metadata_options", "failure_mode_allow"},
		ignores: map[string]string{
			"grpc_initial_metadata": "extra gRPC metadata for the processor, not routing",
		},
	},
	"envoy.extensions.filters.http.ext_proc.v3.ProcessingMode": {
		reads: []string{"request_header_mode", "response_header_mode", "request_body_mode",
			"response_body_mode", "request_trailer_mode", "response_trailer_mode"},
	},
	"envoy.extensions.filters.http.ext_proc.v3.MetadataOptions": {
		reads: []string{"forwarding_namespaces", "receiving_namespaces"},
	},
	"envoy.extensions.filters.http.ext_proc.v3.MetadataOptions.MetadataNamespaces": {
		reads: []string{"untyped"},
	},
	"envoy.config.common.mutation_rules.v3.HeaderMutationRules": {
		// Only values equal to Envoy's defaults (checked where read).
		reads: []string{"allow_all_routing", "allow_envoy", "disallow_system", "disallow_all", "disallow_is_error"},
	},
	"envoy.config.core.v3.GrpcService": {
		// google_grpc only in an api_config_source (ext_proc refuses it
		// where read).
		reads: []string{"envoy_grpc", "google_grpc"},
		ignores: map[string]string{
			"timeout": "Envoy applies it to unary calls only; ext_proc streams are bounded by message_timeout",
		},
	},
	"envoy.config.core.v3.GrpcService.GoogleGrpc": {
		reads: []string{"target_uri", "channel_credentials"},
		ignores: map[string]string{
			"stat_prefix":                   "statistics",
			"channel_args":                  "gRPC channel tuning (keepalive, message sizes) that does not change where endpoints come from",
			"per_stream_buffer_limit_bytes": "a buffer limit EDS messages in tests stay under",
		},
	},
	"envoy.config.core.v3.GrpcService.GoogleGrpc.ChannelCredentials": {
		reads: []string{"ssl_credentials"},
	},
	"envoy.config.core.v3.GrpcService.GoogleGrpc.SslCredentials": {
		reads: []string{"root_certs", "cert_chain", "private_key"},
	},
	"envoy.config.core.v3.GrpcService.EnvoyGrpc": {
		reads:   []string{"cluster_name"},
		ignores: map[string]string{"authority": "the :authority of the gRPC stream, not where it goes"},
	},
	"envoy.config.route.v3.RouteConfiguration": {
		reads: []string{"name", "virtual_hosts", "request_headers_to_remove", "typed_per_filter_config", "ignore_port_in_host_matching"},
		ignores: map[string]string{
			"validate_clusters":                   "config-time check only",
			"response_headers_to_add":             "response headers, not routing",
			"response_headers_to_remove":          "response headers, not routing",
			"max_direct_response_body_size_bytes": "a limit direct responses in tests stay under",
			"metadata":                            "opaque to routing",
		},
	},
	"envoy.config.route.v3.VirtualHost": {
		reads: []string{"name", "domains", "routes", "request_headers_to_remove", "typed_per_filter_config",
			"retry_policy", "include_request_attempt_count"},
		ignores: map[string]string{
			"response_headers_to_add":    "response headers, not routing",
			"response_headers_to_remove": "response headers, not routing",
			"metadata":                   "opaque to routing",
		},
	},
	"envoy.config.route.v3.Route": {
		// per_request_buffer_limit_bytes bounds the request body the retry
		// policy may replay (route.bufferLimit).
		reads: []string{"name", "match", "route", "direct_response", "request_headers_to_remove", "typed_per_filter_config",
			"per_request_buffer_limit_bytes"},
		ignores: map[string]string{
			"metadata":                   "opaque to routing",
			"decorator":                  "tracing",
			"tracing":                    "tracing",
			"response_headers_to_add":    "response headers, not routing",
			"response_headers_to_remove": "response headers, not routing",
			"stat_prefix":                "statistics",
		},
	},
	"envoy.config.route.v3.RouteMatch": {
		reads: []string{"prefix", "path", "safe_regex", "path_separated_prefix", "case_sensitive", "headers", "runtime_fraction"},
	},
	"envoy.config.core.v3.RuntimeFractionalPercent": {
		reads:   []string{"default_value"},
		ignores: map[string]string{"runtime_key": "the stand-in has no runtime layer: the default value always applies"},
	},
	"envoy.type.v3.FractionalPercent": {
		reads: []string{"numerator", "denominator"},
	},
	"envoy.config.route.v3.HeaderMatcher": {
		reads: []string{"name", "exact_match", "prefix_match", "suffix_match", "contains_match", "safe_regex_match",
			"string_match", "present_match", "invert_match"},
	},
	"envoy.type.matcher.v3.StringMatcher": {
		reads: []string{"exact", "prefix", "suffix", "contains", "safe_regex", "ignore_case"},
	},
	"envoy.type.matcher.v3.RegexMatcher": {
		reads:   []string{"regex"},
		ignores: map[string]string{"google_re2": "the engine choice; Go's regexp is RE2"},
	},
	"envoy.config.route.v3.RouteAction": {
		reads: []string{"cluster", "weighted_clusters", "timeout", "host_rewrite_literal", "prefix_rewrite", "auto_host_rewrite", "include_vh_rate_limits",
			"retry_policy", "cluster_not_found_response_code", "max_grpc_timeout", "idle_timeout", "metadata_match"},
		ignores: map[string]string{
			"upgrade_configs": "WebSocket and other upgrades, which inference requests do not use",
			"hash_policy":     "read only by ring_hash and maglev load balancers, which are NACKed",
		},
	},
	"envoy.config.route.v3.RetryPolicy": {
		// retry_priority, retry options predicates, per-try timeouts,
		// rate-limited back-off, retriable (request) headers and
		// refresh_cluster_on_retry are not implemented.
		reads: []string{"retry_on", "num_retries", "retry_host_predicate", "host_selection_retry_max_attempts",
			"retriable_status_codes", "retry_back_off"},
	},
	"envoy.config.route.v3.RetryPolicy.RetryHostPredicate": {
		// Only previous_hosts (checked where read).
		reads: []string{"name", "typed_config"},
	},
	"envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate": {},
	"envoy.config.route.v3.RetryPolicy.RetryBackOff": {
		reads: []string{"base_interval", "max_interval"},
	},
	"envoy.config.route.v3.WeightedCluster": {
		reads:   []string{"clusters"},
		ignores: map[string]string{"total_weight": "deprecated; the weights' sum is used"},
	},
	"envoy.config.route.v3.WeightedCluster.ClusterWeight": {
		reads: []string{"name", "weight", "typed_per_filter_config", "metadata_match"},
	},
	"envoy.config.route.v3.DirectResponseAction": {
		reads: []string{"status", "body"},
	},
	"envoy.config.core.v3.DataSource": {
		// Read by dataSource; filename when the update is built.
		// environment_variable and watched_directory are not implemented.
		reads: []string{"inline_string", "inline_bytes", "filename"},
	},
	"envoy.config.route.v3.FilterConfig": {
		reads:   []string{"config", "disabled"},
		ignores: map[string]string{"is_optional": "only matters for filter types the proxy does not know, which are NACKed"},
	},
	"envoy.config.cluster.v3.Cluster": {
		// metadata: filter_metadata istio.disable_mx and istio.external
		// decide whether istio.metadata_exchange sends its headers
		// (peerMetadataFilter); the rest of it is opaque to routing.
		reads: []string{"name", "type", "eds_cluster_config", "load_assignment", "connect_timeout", "lb_policy",
			"load_balancing_policy", "original_dst_lb_config", "transport_socket", "transport_socket_matches", "filters",
			"metadata", "health_checks", "common_lb_config", "dns_refresh_rate", "upstream_connection_options", "upstream_bind_config",
			"lb_subset_config"},
		ignores: map[string]string{
			"circuit_breakers":                         "concurrency limits the tests stay under",
			"per_connection_buffer_limit_bytes":        "buffer sizing",
			"dns_lookup_family":                        "the stand-in resolves with its own table, then the system resolver",
			"respect_dns_ttl":                          "the stand-in resolves again every dns_refresh_rate, whatever the answer's TTL",
			"outlier_detection":                        "ejects failing hosts; the stand-in never ejects (documented)",
			"typed_extension_protocol_options":         "HTTP protocol options: the stand-in speaks HTTP/2 to gRPC clusters and HTTP/1.1 upstream",
			"cleanup_interval":                         "ORIGINAL_DST host cleanup",
			"track_cluster_stats":                      "statistics",
			"alt_stat_name":                            "statistics",
			"ignore_health_on_host_removal":            "when a host leaving the assignment goes: the stand-in drops it at once, Envoy keeps a healthy one until it fails a check",
			"close_connections_on_host_health_failure": "closes TCP proxy pools only; HTTP pools drain on a health failure either way (cluster_manager_impl.cc onHostHealthFailure)",
			"dns_resolution_config":                    "the stand-in resolves with its own table, then the system resolver",
			"typed_dns_resolver_config":                "the stand-in resolves with its own table, then the system resolver",
			"http2_protocol_options":                   "HTTP/2 options: the stand-in speaks HTTP/2 to gRPC clusters and HTTP/1.1 upstream",
			"upstream_http_protocol_options":           "auto SNI and SAN checks for upstream TLS, which is NACKed on routed clusters",
		},
	},
	"envoy.config.cluster.v3.Cluster.LbSubsetConfig": {
		// fallback_policy DEFAULT_SUBSET, metadata_fallback_policy
		// FALLBACK_LIST, list_as_any and panic_mode_any are not implemented
		// (the first two are checked where read).
		reads: []string{"fallback_policy", "subset_selectors", "metadata_fallback_policy"},
		ignores: map[string]string{
			"default_subset":        "read only by the DEFAULT_SUBSET fallbacks, which are NACKed",
			"locality_weight_aware": "locality weights; all hosts are local to the stand-in",
			"scale_locality_weight": "locality weights; all hosts are local to the stand-in",
		},
	},
	"envoy.config.cluster.v3.Cluster.LbSubsetConfig.LbSubsetSelector": {
		// single_host_per_subset and fallback_keys_subset (read only by
		// the KEYS_SUBSET fallback, NACKed where read) are not implemented.
		reads: []string{"keys", "fallback_policy"},
	},
	"envoy.extensions.filters.http.header_to_metadata.v3.Config": {
		reads:   []string{"request_rules", "response_rules"},
		ignores: map[string]string{"stat_prefix": "statistics"},
	},
	"envoy.extensions.filters.http.header_to_metadata.v3.Config.Rule": {
		reads: []string{"header", "cookie", "on_header_present", "on_header_missing", "remove"},
	},
	"envoy.extensions.filters.http.header_to_metadata.v3.Config.KeyValuePair": {
		// regex_value_rewrite, types but STRING and encodings but NONE are
		// NACKed where read.
		reads: []string{"metadata_namespace", "key", "value", "regex_value_rewrite", "type", "encode"},
	},
	"envoy.config.cluster.v3.UpstreamConnectionOptions": {
		reads: []string{"tcp_keepalive"},
		ignores: map[string]string{
			"set_local_interface_name_on_upstream_connections": "names the local interface in the connection's info",
			"happy_eyeballs_config":                            "address family order; the stand-in's hosts have one address each",
		},
	},
	"envoy.config.core.v3.BindConfig": {
		reads: []string{"socket_options"},
	},
	"envoy.config.core.v3.SocketOption": {
		reads:   []string{"level", "name", "int_value", "state"},
		ignores: map[string]string{"description": "a label for logs"},
	},
	"envoy.config.core.v3.TcpKeepalive": {
		reads: []string{"keepalive_probes", "keepalive_time", "keepalive_interval"},
	},
	"envoy.config.cluster.v3.Cluster.TransportSocketMatch": {
		reads: []string{"name", "match", "transport_socket"},
	},
	// Upstream network filters: only Istio's TCP metadata exchange, which
	// acts only on connections that negotiate its ALPN (clusterFilters).
	"envoy.config.cluster.v3.Filter": {
		reads: []string{"name", "typed_config"},
	},
	"envoy.config.cluster.v3.Cluster.CommonLbConfig": {
		reads: []string{"healthy_panic_threshold"},
		ignores: map[string]string{
			"update_merge_window":             "how long host changes are batched before the load balancer sees them",
			"ignore_new_hosts_until_first_hc": "new hosts start unhealthy until their first check in the stand-in as well",
		},
	},
	"envoy.config.core.v3.HealthCheck": {
		reads: []string{"timeout", "interval", "unhealthy_threshold", "healthy_threshold", "grpc_health_check",
			"unhealthy_interval", "no_traffic_interval", "no_traffic_healthy_interval", "reuse_connection", "tcp_health_check"},
		ignores: map[string]string{
			"initial_jitter":                   "spreads the first checks in time",
			"interval_jitter":                  "spreads checks in time",
			"interval_jitter_percent":          "spreads checks in time",
			"event_log_path":                   "logging",
			"event_logger":                     "logging",
			"always_log_health_check_failures": "logging",
			"always_log_health_check_success":  "logging",
		},
	},
	// A connect-only check: send and receive payloads are NACKed where read.
	"envoy.config.core.v3.HealthCheck.TcpHealthCheck": {
		reads: []string{"send", "receive"},
	},
	"envoy.config.core.v3.HealthCheck.GrpcHealthCheck": {
		reads: []string{"service_name", "authority"},
	},
	"envoy.config.cluster.v3.Cluster.EdsClusterConfig": {
		reads: []string{"eds_config", "service_name"},
	},
	"envoy.config.core.v3.ConfigSource": {
		reads: []string{"ads", "api_config_source", "resource_api_version"},
		ignores: map[string]string{
			"initial_fetch_timeout": "how long a resource may take to arrive before Envoy goes on without it",
		},
	},
	"envoy.config.core.v3.ApiConfigSource": {
		reads: []string{"api_type", "transport_api_version", "grpc_services"},
		ignores: map[string]string{
			"set_node_on_first_message_only": "the stand-in sends the node on the first message of a stream",
			"request_timeout":                "REST only",
			"refresh_delay":                  "REST only",
		},
	},
	"envoy.config.cluster.v3.Cluster.OriginalDstLbConfig": {
		reads: []string{"use_http_header", "http_header_name", "metadata_key"},
	},
	"envoy.config.endpoint.v3.ClusterLoadAssignment": {
		reads: []string{"cluster_name", "endpoints"},
		ignores: map[string]string{
			"policy": "overprovisioning and endpoint staleness; drop_overloads is checked where read",
		},
	},
	"envoy.config.endpoint.v3.LocalityLbEndpoints": {
		// metadata: its envoy.transport_socket_match entry chooses the
		// transport socket of hosts whose own metadata matches none.
		reads: []string{"lb_endpoints", "priority", "metadata"},
		ignores: map[string]string{
			"locality":              "locality-aware balancing; all hosts are local to the stand-in",
			"load_balancing_weight": "locality weights; all hosts are local to the stand-in",
		},
	},
	"envoy.config.endpoint.v3.LbEndpoint": {
		// metadata: its envoy.transport_socket_match entry chooses the
		// host's transport socket (transport_socket_matches), its envoy.lb
		// entry the host's subsets (lb_subset_config); the rest is opaque
		// to routing.
		reads: []string{"endpoint", "health_status", "metadata"},
		ignores: map[string]string{
			"load_balancing_weight": "host weights; the stand-in balances round robin",
		},
	},
	"envoy.config.endpoint.v3.Endpoint": {
		reads:   []string{"address"},
		ignores: map[string]string{"hostname": "a label (used for auto_host_rewrite, which is NACKed)", "health_check_config": "health checking, which the stand-in does not do"},
	},
	"envoy.config.cluster.v3.LoadBalancingPolicy": {
		reads: []string{"policies"},
	},
	"envoy.config.cluster.v3.LoadBalancingPolicy.Policy": {
		reads: []string{"typed_extension_config"},
	},
	"envoy.config.core.v3.TypedExtensionConfig": {
		reads: []string{"name", "typed_config"},
	},
	"envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost": {
		reads: []string{"override_host_sources", "selected_host_key", "fallback_policy"},
	},
	"envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost.OverrideHostSource": {
		reads: []string{"header", "metadata"},
	},
	"envoy.type.metadata.v3.MetadataKey": {
		reads: []string{"key", "path"},
	},
	"envoy.type.metadata.v3.MetadataKey.PathSegment": {
		reads: []string{"key"},
	},
	"envoy.config.core.v3.TransportSocket": {
		reads: []string{"name", "typed_config"},
	},
	"envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer": {},
	"envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext": {
		reads: []string{"common_tls_context"},
		ignores: map[string]string{
			"sni": "server name sent in the handshake; certificates are not verified against it",
		},
	},
	"envoy.extensions.transport_sockets.tls.v3.CommonTlsContext": {
		// validation_context only empty; tls_certificates at most one;
		// tls_params only at the stand-in's client's versions (checked
		// where read). A context that takes a secret from SDS is never
		// checked field by field: no connection through it can be made
		// (transportSocket).
		reads: []string{"validation_context", "alpn_protocols", "tls_certificates", "tls_params"},
	},
	"envoy.extensions.transport_sockets.tls.v3.TlsParameters": {
		reads: []string{"tls_minimum_protocol_version", "tls_maximum_protocol_version"},
	},
	"envoy.extensions.transport_sockets.tls.v3.TlsCertificate": {
		// The client certificate presented to the cluster's servers. A
		// password, PKCS#12, a private key provider and a watched directory
		// are not implemented.
		reads: []string{"certificate_chain", "private_key"},
	},
}

// checkFields NACKs a message that sets a field its rules neither read nor
// ignore. where names the resource and the path to the message.
func checkFields(where string, m proto.Message) error {
	if m == nil {
		return nil
	}
	name := m.ProtoReflect().Descriptor().FullName()
	rules, ok := xdsRules[name]
	if !ok {
		return fmt.Errorf("%s: %s is not interpreted by the stand-in", where, name)
	}
	var bad []string
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		f := string(fd.Name())
		if _, ignored := rules.ignores[f]; ignored || slices.Contains(rules.reads, f) {
			return true
		}
		bad = append(bad, f)
		return true
	})
	if len(bad) > 0 {
		return fmt.Errorf("%s: %s.%s not implemented by the stand-in", where, name.Name(), strings.Join(bad, ", "))
	}
	return nil
}
