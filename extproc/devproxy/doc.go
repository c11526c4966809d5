// Package devproxy is the Envoy stand-in: a loopback HTTP/1.1 reverse proxy
// that runs each request through ext_proc filters the way Envoy's
// envoy.filters.http.ext_proc filter does (extproctest.Client) and then
// routes it the way Envoy's router does. It is linked into the binary as
// `infergate devproxy` for the demo, the benchmarks and the end-to-end
// tests, because Envoy itself cannot run on the machines this project is
// built on. It is a test harness written from Envoy's documented semantics,
// never a production gateway: users run Envoy.
//
// It is configured in one of three ways, all producing the same per-listener
// table (filters, virtual hosts and routes, clusters):
//
//   - by flags (New): one listener, the given filters in order, one route
//     for every request to one cluster that honours the picker as
//     override_host (metadata, then header, a comma list walked on
//     connection failure) or as an ORIGINAL_DST cluster by header, and
//     falls back to round robin over FallbackEndpoints. A client's own
//     x-gateway-destination-endpoint* headers are removed before the first
//     filter (Config.KeepClientDestination keeps them), so a picker failing
//     open never lets the client choose its upstream;
//   - over xDS (Node): an Envoy node on an ADS stream (package xdsclient)
//     taking listeners, routes, clusters and endpoints from a real control
//     plane. Every field of every message it reads is either interpreted
//     with Envoy's semantics, or listed as ignorable with the reason it
//     cannot change where a request goes (xdsfields.go), or the update is
//     NACKed with the field named and the last good configuration kept;
//   - from a static bootstrap (NodeConfig.Bootstrap, LoadBootstrap;
//     `infergate devproxy --bootstrap`), as `envoy -c` runs one: the
//     listeners and clusters of static_resources, route configurations
//     inline, built under the same rules as xDS resources, with no ADS
//     stream. What would be a NACK over xDS fails start-up with the same
//     message, and so do EDS clusters and RDS (nothing to fetch them
//     from), dynamic_resources, static secrets and any bootstrap field but
//     node and admin (both ignored: no control plane, no admin interface).
//     TestBootstrapServesTraffic, TestBootstrapFromYAML, TestBootstrapErrors
//
// # Faithfulness in xDS mode
//
// Each row: the Envoy behaviour, the proto fields or Envoy source it
// follows, and the test that shows it (xdsclient, devproxy or test/e2e).
//
//	ADS state of the world: CDS and LDS as wildcards, RDS and EDS by the
//	names listeners and clusters reference; ACK with version_info and
//	response_nonce; NACK with error_detail and the last accepted version;
//	resubscribe with the last versions after a reconnect.
//	  DiscoveryRequest.{version_info,response_nonce,error_detail,resource_names}
//	  xdsclient: TestFollowsListenersAndClustersToRoutesAndEndpoints,
//	  TestHandlerErrorNACKs, TestReconnectResumes
//
//	A set field the stand-in does not reproduce is a NACK naming it; the
//	node keeps serving its last good configuration.
//	  TestBuildNACKsWhatItDoesNotReproduce, TestUnsupportedUpdateKeepsTheLastGoodConfig,
//	  e2e TestXDSUnsupportedFieldIsNACKed
//
//	Updates apply live: a request keeps the table it started with; a
//	listener that leaves LDS drains; a listener waiting for its RDS holds
//	its socket without serving, or keeps serving its previous table.
//	  e2e TestXDSLiveUpdate, TestListenersFollowUpdates, TestWarmingListener
//
//	Listener: one plaintext filter chain (filter_chains[0], or
//	default_filter_chain alone, as Envoy Gateway renders it) holding the
//	HTTP connection manager; bound when it first appears, on 127.0.0.1 (NodeConfig.Address)
//	at the listener's port or, with FreePorts, a free one; a port that
//	cannot be bound NACKs the update. tls_inspector and http_inspector are
//	accepted (they only feed filter chain matching).
//	  Listener.{address,filter_chains,listener_filters}; TestListenerThatCannotBindIsNACKed
//
//	HTTP filters in order, the router last; ext_proc filters run, and so
//	do health_check (non-pass-through: a request matching its headers is
//	answered 200) and header_mutation (request header removals only);
//	others only if listed as pass-through (grpc_stats; cors, whose
//	per-route policies are NACKed); HttpFilter.disabled leaves a filter off
//	except on routes whose per-filter config enables it.
//	  HttpConnectionManager.http_filters, HttpFilter.disabled
//	  TestRouterLocalReplies, TestPerRouteFilterConfig, TestHealthCheckFilter, TestHeaderMutationFilter
//
//	ext_proc: grpc_service.envoy_grpc.cluster_name (the cluster's first
//	host, TLS from its transport socket, one channel per address, TLS
//	and client certificate), failure_mode_allow,
//	processing_mode (bodies NONE, BUFFERED, FULL_DUPLEX_STREAMED),
//	message_timeout, metadata_options (untyped receiving namespaces kept,
//	forwarding namespaces sent from the stream's metadata), status_on_error,
//	route_cache_action / disable_clear_route_cache; mutation_rules only at
//	Envoy's defaults; allow_mode_override only where Envoy ignores it.
//	  ExternalProcessor.*; extproctest: TestMetadataOptions, TestStatusOnError;
//	  TestRouteRematchedAfterClearRouteCache, TestServedEndpointReachesThePicker
//
//	Per-route filter config: which filters run is decided by the route a
//	request starts on (the most specific typed_per_filter_config entry: any
//	entry enables a filter HttpFilter.disabled left out, FilterConfig
//	{disabled} removes it; an empty FilterConfig is rejected); ext_proc's
//	own config is taken from the current route, ExtProcPerRoute merged over
//	route configuration, virtual host and route (disabled from the most
//	specific; processing_mode, grpc_service, each metadata namespace list
//	and failure_mode_allow from the most specific level that sets them).
//	Per-route configs of pass-through filters are NACKed.
//	  ext_proc.cc FilterConfigPerRoute; per_filter_config.cc
//	  TestPerRouteFilterConfig, TestPerRouteConfigsMerge, TestFilterConfigWrapper,
//	  TestFilterChainFromTheFirstRoute, e2e TestXDSRequestsReachThePickersChoice (Istio)
//
//	Route matching: the virtual host by :authority (exact, then the longest
//	suffix wildcard, prefix wildcard, then "*"; the port is part of the
//	authority unless ignore_port_in_host_matching); the first route whose
//	match holds: prefix, path, path_separated_prefix, safe_regex (the whole
//	path, query string excluded), case_sensitive, header matchers (string
//	matchers, present, invert; repeated values joined by ","). A route is
//	matched when the first filter needs it and again after an ext_proc
//	answer with clear_route_cache.
//	  RouteConfiguration, VirtualHost.domains, RouteMatch, HeaderMatcher
//	  TestRouteMatching, TestVirtualHostSelection, TestRouteRematchedAfterClearRouteCache
//
//	Route actions: cluster, weighted_clusters (by weight per request),
//	direct_response (its body inline or a filename read when the update
//	is built), timeout (15s default, 0 none, within Timeouts.Route),
//	host_rewrite_literal, prefix_rewrite. request_headers_to_remove of the
//	route, virtual host and route configuration is applied after the host
//	is chosen, as Envoy's router chooses it (createConnPool) before
//	finalizeRequestHeaders.
//	  RouteAction, Route.request_headers_to_remove; router.cc
//	  TestHeadersRemovedAfterTheHostChoice, TestRouterLocalReplies,
//	  TestDirectResponseBodySources
//
//	Local replies of the router: no route 404 (empty), cluster not found
//	503 (empty), "no healthy upstream" 503, connection failure 503, upstream
//	timeout 504; they pass through the filters' response path.
//	  TestRouterLocalReplies, e2e TestXDSRequestsReachThePickersChoice
//
//	Clusters: STATIC, STRICT_DNS and LOGICAL_DNS (host names resolved when
//	the cluster arrives, from NodeConfig.Resolve, then the system resolver;
//	a name that does not resolve is no host, as in Envoy),
//	EDS (the lowest priority level with hosts; UNHEALTHY, DRAINING and
//	TIMEOUT hosts left out); connect_timeout; lb_policy ROUND_ROBIN,
//	LEAST_REQUEST and RANDOM all pick round robin.
//	  Cluster.{type,load_assignment,eds_cluster_config,connect_timeout,lb_policy}
//	  TestClusterEndpoints
//
//	EDS clusters warm: an update that names one whose first load assignment
//	has not arrived is accepted but not put in use (listeners keep their
//	tables, new ones do not serve) until it arrives, or for at most
//	initial_fetch_timeout's default, 15s.
//	  TestEDSClusterWarms
//
//	EDS from ADS, or, for a cluster whose eds_config is an api_config_source
//	(GRPC, one envoy_grpc cluster), over an EDS stream of its own to that
//	cluster's server (with the cluster's TLS and client certificate);
//	routes only over ADS.
//	  ConfigSource, ApiConfigSource; TestEndpointsFromAnotherEDSServer,
//	  TestEDSStreamPresentsTheClientCertificate,
//	  test/envoygateway TestTrafficThroughEnvoyGatewayXDS (scale-out)
//
//	Upstream TLS to ext_proc and EDS clusters: UpstreamTlsContext with an
//	empty validation context (any server certificate accepted, sni
//	ignored) and the client certificate of
//	common_tls_context.tls_certificates (one entry: certificate_chain and
//	private_key, each inline_bytes, inline_string or a filename read when
//	the update is built), presented when the server asks for one (mutual
//	TLS, e.g. a processor run with --client-ca-file). A file that cannot
//	be read or a pair that does not parse NACKs the update.
//	  UpstreamTlsContext, CommonTlsContext.tls_certificates, TlsCertificate,
//	  DataSource; TestMutualTLSToProcessors, TestClusterClientCertificate,
//	  TestConnPoolKeysByCertificate, TestBuildNACKsWhatItDoesNotReproduce,
//	  extproctest TestTLS
//
//	ORIGINAL_DST with original_dst_lb_config: metadata_key (a string, or
//	the first element of a list), then the first instance of
//	use_http_header's header (x-envoy-original-dst-host unless
//	http_header_name); without either, no host: 503.
//	  Cluster.original_dst_lb_config; original_dst_cluster.cc
//	  TestHostChoice, TestHostSourcesReadAsEnvoyDoes, e2e (Envoy Gateway shape)
//
//	load_balancing_policy: the first policy must be override_host,
//	round_robin, least_request or random. override_host: sources in order
//	(a metadata string or the first instance of a header, either a comma
//	list), hosts outside the cluster (any priority or health) skipped, the
//	first usable host tried (further hosts need a retry policy, which is
//	not reproduced), else fallback_policy (round robin); selected_host_key
//	written for the filters' response path.
//	  OverrideHost.{override_host_sources,selected_host_key,fallback_policy}
//	  TestHostChoice, TestHostSourcesReadAsEnvoyDoes, TestLoadBalancingPolicyFirstWins,
//	  TestServedEndpointReachesThePicker, e2e TestXDSLiveUpdate
//
// # Not reproduced
//
// Set in a configuration, these are NACKed: SDS and any secret a transport
// socket would fetch; TLS listeners, several filter chains or any
// filter_chain_match but plaintext; downstream HTTP/2 (codec_type HTTP2 or
// HTTP3); retries (retry_policy), hedging, redirects, request_headers_to_add;
// query-parameter, runtime, grpc and metadata route matches; ring hash,
// maglev and subset load balancing; TLS to model servers; certificate
// validation (validation_context); more than one tls_certificates entry
// (Envoy picks among them by the server's accepted algorithms), private
// key passwords, PKCS#12, private key providers and watched directories;
// DataSource environment_variable; ext_proc body modes STREAMED,
// BUFFERED_PARTIAL and GRPC, observability_mode, request and response
// attributes, forward_rules, non-default mutation_rules, google_grpc and
// http_service; any HTTP filter type not listed above.
//
// Accepted and ignored, each with its reason in xdsfields.go: health
// checks and outlier detection (every host is healthy), circuit breakers,
// buffer limits, statistics, logging, tracing, x-forwarded-for and
// x-request-id handling, response header changes, and path normalisation
// (normalize_path, merge_slashes: the stand-in matches the path as sent).
//
// # Also not reproduced, in both modes
//
//   - ext_proc local replies go straight to the client without passing other
//     filters' response path; HTTP trailers are not forwarded; upstream
//     requests are HTTP/1.1;
//   - the rest of Envoy: x-request-id, x-forwarded-*, header sanitising,
//     HTTP/2, health checks, outlier detection. The proxy adds a response
//     header x-infergate-upstream naming the endpoint that served, which
//     Envoy does not.
package devproxy
