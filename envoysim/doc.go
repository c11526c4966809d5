// Package envoysim is the Envoy stand-in: a loopback HTTP/1.1 reverse proxy
// that runs each request through ext_proc filters the way Envoy's
// envoy.filters.http.ext_proc filter does (extprocfilter.Client) and then
// routes it the way Envoy's router does. It runs as the command envoysim
// (cmd/envoysim) for the demo, the benchmarks and the end-to-end tests,
// because Envoy itself cannot run on the machines this project is built on. It is a test harness written from Envoy's documented semantics,
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
//     open never lets the client choose its upstream. Each filter's
//     processor is a cluster of its hosts (one, or several replicas:
//     Config.FilterHosts), health checked as infergate's integrations
//     render a processor's cluster (gRPC, every 2 s, no panic), each
//     stream started on the next healthy host, round robin, so a processor
//     that dies fails open once it is taken out, or, with replicas left,
//     its streams go to them;
//   - over xDS (Node): an Envoy node on an ADS stream (package xdsclient)
//     taking listeners, routes, clusters and endpoints from a real control
//     plane. Every field of every message it reads is either interpreted
//     with Envoy's semantics, or listed as ignorable with the reason it
//     cannot change where a request goes (xdsfields.go), or the update is
//     NACKed with the field named and the last good configuration kept;
//   - from a static bootstrap (NodeConfig.Bootstrap, LoadBootstrap;
//     `envoysim --bootstrap`), as `envoy -c` runs one: the
//     listeners and clusters of static_resources, route configurations
//     inline, built under the same rules as xDS resources, with no ADS
//     stream. What would be a NACK over xDS fails start-up with the same
//     message, and so do EDS clusters and RDS (nothing to fetch them
//     from), dynamic_resources, static secrets and any bootstrap field but
//     node (its id and metadata only, for istio.metadata_exchange) and
//     admin (ignored: no admin interface).
//     TestBootstrapServesTraffic, TestBootstrapFromYAML, TestBootstrapErrors
//
// # Faithfulness in xDS mode
//
// Each row: the Envoy behaviour, the proto fields and the Envoy source it
// follows ("Envoy:", paths in envoyproxy/envoy, read at main f73fdf90,
// 1.39.0-dev, and checked against the 1.39.0 and 1.39.1 changelogs: Envoy
// Gateway v1.9.1 deploys 1.39.1), and the test that shows it (xdsclient,
// envoysim or test/e2e).
//
//	ADS state of the world: CDS and LDS as wildcards, RDS and EDS by the
//	names listeners and clusters reference; ACK with version_info and
//	response_nonce; NACK with error_detail and the last accepted version;
//	resubscribe with the last versions after a reconnect. A CDS or LDS
//	response is the whole set; an RDS or EDS response may carry only the
//	resources that changed (Istio sends only the load assignments it
//	pushes for): the others are kept until no listener or cluster names
//	them.
//	  DiscoveryRequest.{version_info,response_nonce,error_detail,resource_names};
//	  xDS protocol "Grouping resources into responses"
//	  Envoy: source/extensions/config_subscription/grpc/grpc_mux_impl.cc
//	  GrpcMuxImpl::onDiscoveryResponse, processDiscoveryResources, onStreamEstablished
//	  xdsclient: TestFollowsListenersAndClustersToRoutesAndEndpoints,
//	  TestHandlerErrorNACKs, TestReconnectResumes; TestPartialRDSAndEDSResponses
//
//	A set field the stand-in does not reproduce is a NACK naming it. A
//	cluster or listener of a CDS or LDS update that cannot be built (or
//	bound) is rejected alone and keeps the version the node had of it (or
//	stays out); the rest of the update is applied, and the update is
//	NACKed naming each rejected resource. Anything else rejects the update
//	whole and the node keeps its last good configuration.
//	  Envoy: grpc_mux_impl.cc GrpcMuxImpl::onDiscoveryResponse;
//	  source/common/upstream/cds_api_helper.cc CdsApiHelper::onConfigUpdate;
//	  source/common/listener_manager/lds_api.cc LdsApiImpl::onConfigUpdate
//	  TestBuildNACKsWhatItDoesNotReproduce, TestUnsupportedUpdateKeepsTheLastGoodConfig,
//	  TestUpdateAppliedInPart, e2e TestXDSUnsupportedFieldIsNACKed
//
//	Updates apply live: a request keeps the table it started with; a
//	listener that leaves LDS drains; a listener waiting for its RDS holds
//	its socket without serving, or keeps serving its previous table.
//	  Envoy: source/common/listener_manager/listener_manager_impl.cc
//	  addOrUpdateListenerInternal, drainListener, onListenerWarmed
//	  e2e TestXDSLiveUpdate, TestListenersFollowUpdates, TestWarmingListener
//
//	Listener: one plaintext filter chain (filter_chains[0], or
//	default_filter_chain alone, as Envoy Gateway renders it) holding the
//	HTTP connection manager; bound when it first appears, on 127.0.0.1 (NodeConfig.Address)
//	at the listener's port or, with FreePorts, a free one; a port that
//	cannot be bound NACKs the update. tls_inspector and http_inspector are
//	accepted (they only feed filter chain matching), and so is the chain's
//	transport_socket_connect_timeout (no handshake on a plaintext chain).
//	  Listener.{address,filter_chains,listener_filters}; TestListenerThatCannotBindIsNACKed
//	  Envoy: listener_manager_impl.cc createListenSocketFactory
//
//	Connection manager: without proxy_100_continue, "Expect: 100-continue"
//	is answered by the stand-in and removed before the filters (with it,
//	forwarded; either way the client's 100 comes from the stand-in when
//	the body is first read); a client's x-forwarded-client-cert is removed
//	before the filters unless forward_client_cert_details is
//	ALWAYS_FORWARD_ONLY (the connection has no client certificate).
//	stream_idle_timeout (300 s unless set, 0 none): a request with no
//	activity (body read, response written) for that long ends: before the
//	response started with "stream timeout", 504 if the whole request had
//	been received and 408 if its body was still due; after it, a reset. A
//	route's idle_timeout replaces it once the route is resolved (0: none);
//	Envoy also starts a timer for a route's idle_timeout where the
//	connection manager has none (stream_idle_timeout 0), the stand-in not.
//	  HttpConnectionManager.{proxy_100_continue,forward_client_cert_details,stream_idle_timeout},
//	  RouteAction.idle_timeout;
//	  Envoy: source/common/http/conn_manager_impl.cc ActiveStream::decodeHeaders
//	  (encode1xxHeaders before the filters; the stand-in sends the 100 when
//	  the body is first read); conn_manager_utility.cc mutateXfccRequestHeader
//	  conn_manager_impl.cc ActiveStream::onIdleTimeout (sendLocalReply with
//	  utility.cc Utility::maybeRequestTimeoutCode(remoteDecodeComplete())),
//	  ActiveStream::refreshIdleTimeout
//	  TestProxy100Continue, TestForwardClientCertDetails, TestStreamIdleTimeout
//
//	HTTP filters in order, the router last; ext_proc filters run, and so
//	do health_check (non-pass-through: a request matching its headers is
//	answered 200), header_mutation (request header removals only) and
//	Istio's istio.metadata_exchange (below); others only if listed as
//	pass-through, where their config leaves every request and response
//	unchanged: grpc_stats (statistics), istio.stats (metrics), istio.alpn
//	(the ALPN of upstream TLS handshakes; routed hosts are plaintext),
//	fault and cors with an empty config (any field set is a NACK, and so
//	is a pass-through filter's per-route config). HttpFilter.disabled
//	leaves a filter off except on routes whose per-filter config enables
//	it. Istio's configs in TypedStructs (udpa or xds) are unwrapped.
//	  HttpConnectionManager.http_filters, HttpFilter.disabled
//	  Envoy: source/extensions/filters/http/health_check/health_check.cc
//	  HealthCheckFilter::decodeHeaders; header_mutation/header_mutation.cc
//	  HeaderMutation::decodeHeaders; source/common/http/filter_chain_helper.cc
//	  FilterChainUtility::createFilterChainForFactories
//	  TestRouterLocalReplies, TestPerRouteFilterConfig, TestHealthCheckFilter, TestHeaderMutationFilter,
//	  TestPassThroughFilters
//
//	istio.metadata_exchange (io.istio.http.peer_metadata.Config): upstream
//	propagation by istio_headers sets x-envoy-peer-metadata-id (the node
//	id) and x-envoy-peer-metadata (the node's workload metadata, as
//	istio/proxy's metadata_object.cc encodes it) on the request, unless the
//	route's cluster says istio disable_mx (or external, or is the
//	PassthroughCluster, with skip_external_clusters); upstream discovery
//	by istio_headers removes both from the response; downstream discovery
//	removes them from the request, and downstream propagation answers a
//	client that sent them. workload_discovery and shared_with_upstream only
//	feed telemetry. Weighted clusters that disagree on disable_mx are
//	NACKed.
//	  istio/proxy source/extensions/filters/http/peer_metadata/filter.cc
//	  TestPeerMetadataFilter, TestPeerMetadataValue, TestIstioGatewayTraffic
//
//	ext_proc: grpc_service.envoy_grpc.cluster_name (the cluster's first
//	host, its first healthy one when health checked, chosen as each stream
//	starts; TLS from its transport socket, one channel per address, TLS
//	and client certificate), failure_mode_allow (with a
//	FULL_DUPLEX_STREAMED body, only until body data has reached the filter:
//	the body is read while the stream connects, and a connection failure
//	counts after that first read; a stream whose start fails at once, the
//	cluster missing or without a healthy host, fails open with or without a
//	body),
//	processing_mode (bodies NONE, BUFFERED, FULL_DUPLEX_STREAMED),
//	message_timeout, metadata_options (untyped receiving namespaces kept,
//	forwarding namespaces sent from the stream's metadata), status_on_error,
//	disable_immediate_response (an immediate response is then a spurious
//	message), route_cache_action / disable_clear_route_cache; mutation_rules
//	only at Envoy's defaults; allow_mode_override only where Envoy ignores it.
//	  ExternalProcessor.*
//	  Envoy: source/extensions/filters/http/ext_proc/ext_proc.cc Filter::openStream,
//	  Filter::onData (bodyReceived), Filter::failureModeAllow, Filter::onGrpcError;
//	  processor_state.cc ProcessorState::canFailOpen, DecodingProcessorState::
//	  clearRouteCache (only with a header mutation in the same answer); config.cc;
//	  source/common/grpc/async_client_impl.cc AsyncStreamImpl::initialize (a
//	  start that fails at once)
//	  extprocfilter: TestMetadataOptions, TestStatusOnError, TestFailureModes;
//	  TestRouteRematchedAfterClearRouteCache, TestClearRouteCacheNeedsAHeaderMutation,
//	  TestServedEndpointReachesThePicker, TestFailOpenNeedsNoBodyYet
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
//	  Envoy: ext_proc.cc FilterConfigPerRoute, Filter::mergePerRouteConfig;
//	  source/common/router/per_filter_config.cc PerFilterConfigs::disabled;
//	  config_impl.cc RouteEntryImplBase::filterDisabled
//	  TestPerRouteFilterConfig, TestPerRouteConfigsMerge, TestFilterConfigWrapper,
//	  TestFilterChainFromTheFirstRoute, e2e TestXDSRequestsReachThePickersChoice (Istio)
//
//	Route matching: the virtual host by :authority (exact, then the longest
//	suffix wildcard, prefix wildcard, then "*"; the port is part of the
//	authority unless ignore_port_in_host_matching); the first route whose
//	match holds: prefix, path, path_separated_prefix, safe_regex (the whole
//	path, query string excluded), case_sensitive, header matchers (string
//	matchers, present, invert; repeated values joined by ","),
//	runtime_fraction's default value. A route is matched when the first
//	filter needs it and again after an ext_proc answer with
//	clear_route_cache; each request draws one random value (Envoy's stream
//	id) for runtime fractions and weighted clusters, so a re-match takes
//	the same share and cluster.
//	  RouteConfiguration, VirtualHost.domains, RouteMatch, HeaderMatcher
//	  Envoy: source/common/router/config_impl.cc RouteMatcher::findVirtualHost,
//	  RouteEntryImplBase::matchRoute; conn_manager_impl.cc
//	  ActiveStream::refreshCachedRoute (stream_id_ as the random value);
//	  source/common/http/header_utility.h HeaderDataBaseImpl::matchesHeaders
//	  (1.39 matches repeated headers value by value,
//	  match_headers_individually; the stand-in joins them)
//	  TestRouteMatching, TestVirtualHostSelection, TestRouteRematchedAfterClearRouteCache
//
//	Route actions: cluster, weighted_clusters (by weight per request; a
//	cluster's typed_per_filter_config is the most specific level for the
//	requests that take it: TestWeightedClusterFilterConfig),
//	direct_response (its body inline or a filename read when the update
//	is built), timeout (15s default, 0 none, within Timeouts.Route),
//	max_grpc_timeout (a gRPC request's timeout is its grpc-timeout header,
//	none meaning none, capped at the maximum unless it is 0),
//	cluster_not_found_response_code, host_rewrite_literal, prefix_rewrite.
//	request_headers_to_remove of the route, virtual host and route
//	configuration is applied before the host is chosen, so a header the
//	route removes is gone for the load balancer too.
//	  RouteAction, Route.request_headers_to_remove
//	  Envoy: source/common/router/router.cc Filter::decodeHeaders
//	  (finalizeRequestHeaders, then chooseHost and createConnPool),
//	  FilterUtility::finalTimeout; config_impl.h DEFAULT_ROUTE_TIMEOUT_MS
//	  TestHeadersRemovedBeforeTheHostChoice, TestRouterLocalReplies,
//	  TestDirectResponseBodySources, TestMaxGrpcTimeout, TestIstioGatewayTraffic
//
//	Retries: the route's retry_policy, else its virtual host's. After a
//	connection failure (connect-failure; reset, 5xx, gateway-error), a
//	reset before the response (reset, 5xx, gateway-error) or response
//	headers it names (5xx, gateway-error, retriable-4xx,
//	retriable-status-codes with retriable_status_codes, the gRPC statuses
//	cancelled, deadline-exceeded, internal, resource-exhausted,
//	unavailable from grpc-status; none if the response carries
//	x-envoy-ratelimited, unless envoy-ratelimited), the request is sent
//	again, up to num_retries (1 by default) times, after Envoy's jittered
//	exponential back-off (retry_back_off, 25ms base, 10 times the base at
//	most); refused-stream and http3-post-connect-failure need HTTP/2 or
//	HTTP/3 upstreams and never apply. The body sent so far is kept for the
//	next attempt up to the buffer limit (Route.per_request_buffer_limit_bytes,
//	else Listener.per_connection_buffer_limit_bytes, 1 MiB), past which the
//	request is not retried. Each attempt's host is chosen again:
//	override_host takes the next host of its list, then its fallback;
//	with previous_hosts, round robin chooses again a host already
//	attempted, up to host_selection_retry_max_attempts times. With the
//	virtual host's include_request_attempt_count, each attempt carries
//	x-envoy-attempt-count. The last attempt's response or failure
//	answers ("retried and the latest reset reason").
//	  RetryPolicy, VirtualHost.include_request_attempt_count
//	  Envoy: source/common/router/retry_state_impl.cc RetryStateImpl::
//	  wouldRetryFromHeaders, wouldRetryFromReset, enableBackoffTimer;
//	  source/common/common/backoff_strategy.cc JitteredExponentialBackOffStrategy;
//	  router.cc Filter::decodeData (retry_or_shadow_abandoned_)
//	  TestRetryPolicyRules, TestHostPicker, TestReplayBody, TestIstioGatewayTraffic
//
//	Local replies of the router: no route 404 (empty), cluster not found
//	503 (empty), "no healthy upstream" 503, connection failure 503, upstream
//	timeout 504; they pass through the filters' response path.
//	  Envoy: router.cc Filter::decodeHeaders, sendNoHealthyUpstreamResponse,
//	  onUpstreamReset, onResponseTimeout; source/common/http/filter_manager.cc
//	  DownstreamFilterManager::sendLocalReply
//	  TestRouterLocalReplies, e2e TestXDSRequestsReachThePickersChoice
//
//	Clusters: STATIC, STRICT_DNS and LOGICAL_DNS (host names resolved from
//	NodeConfig.Resolve, then NodeConfig.Lookup or the system resolver; a
//	name that does not resolve is no host, as in Envoy), EDS (the lowest
//	priority level with hosts; UNHEALTHY, DRAINING and TIMEOUT hosts left
//	out); connect_timeout; lb_policy ROUND_ROBIN, LEAST_REQUEST and RANDOM
//	all pick round robin. STRICT_DNS makes a host of every address a name
//	resolves to and resolves it again every dns_refresh_rate (5 s unset),
//	rebuilding when the answer changes; a failed lookup keeps the hosts;
//	new hosts of a health-checked cluster wait for their first check (the
//	cluster keeps its previous hosts meanwhile, where Envoy adds the new
//	ones as unhealthy: either way no stream reaches them unchecked).
//	LOGICAL_DNS takes the first address.
//	  Cluster.{type,load_assignment,eds_cluster_config,connect_timeout,lb_policy,dns_refresh_rate}
//	  Envoy: source/extensions/clusters/dns/dns_cluster.cc
//	  DnsClusterImpl::ResolveTarget::startResolve; logical_dns_cluster.cc;
//	  upstream_impl.cc ClusterImplBase::partitionHostList,
//	  HostImplBase::coarseHealth, BaseDynamicClusterImpl::updateDynamicHostList
//	  TestClusterEndpoints, TestStrictDNSHostPerAddress, TestDNSRefreshUpdatesHosts,
//	  test/faults TestPickerRollingRestart
//
//	Active health checks (health_checks: gRPC, or TCP connect-only with
//	reuse_connection false: a connection made, through the host's TLS
//	handshake when it has one, passes and is closed; one refused or not
//	made within the timeout is a network failure) and
//	common_lb_config.healthy_panic_threshold: a host starts unhealthy and
//	the cluster warms until each host had its first check; the first
//	success makes a host healthy, later ones after healthy_threshold; an
//	answer other than SERVING takes a host out at once, a connection
//	failure or timeout after unhealthy_threshold in a row; checks every
//	interval, every no_traffic_interval (60 s by default) until the
//	cluster carried traffic; the grpc.health.v1 service_name with the
//	:authority of grpc_health_check.authority, else the cluster's name.
//	Below the panic threshold (50% by default, 0 never) every host is used;
//	otherwise only the healthy ones, and with none a routed request gets
//	"no healthy upstream" and an ext_proc stream fails at its start; an
//	ext_proc stream starts on the next usable host, round robin.
//	Sessions outlive updates that keep the cluster, host and check. Checks
//	share one connection per host (reuse_connection unset; a timeout ends
//	only the RPC) or, with reuse_connection false, each opens and closes
//	its own. A host turning unhealthy has its ext_proc channel drained:
//	streams on it go on, new ones open a new channel (Envoy drains the
//	host's pools on every worker, close_connections_on_host_health_failure
//	or not, which changes TCP pools only).
//	  HealthCheck.{timeout,interval,unhealthy_threshold,healthy_threshold,
//	  unhealthy_interval,no_traffic_interval,no_traffic_healthy_interval,
//	  grpc_health_check,tcp_health_check,reuse_connection}, Cluster.CommonLbConfig.healthy_panic_threshold
//	  Envoy: source/extensions/health_checkers/common/health_checker_base_impl.cc
//	  HealthCheckerImplBase::interval, ActiveHealthCheckSession::handleSuccess,
//	  setUnhealthy; source/extensions/health_checkers/grpc/health_checker_impl.cc
//	  GrpcActiveHealthCheckSession::onInterval, onTimeout, onRpcComplete,
//	  isHealthCheckSucceeded; source/extensions/health_checkers/tcp/
//	  health_checker_impl.cc TcpActiveHealthCheckSession::onInterval, onEvent;
//	  source/common/upstream/cluster_manager_impl.cc
//	  ThreadLocalClusterManagerImpl::onHostHealthFailure;
//	  upstream_impl.cc BaseDynamicClusterImpl::updateDynamicHostList
//	  (FAILED_ACTIVE_HC), ClusterImplBase::onInitDone; load_balancing_policies/
//	  common/load_balancer_impl.cc LoadBalancerBase::isHostSetInPanic
//	  TestFailOpenNeedsNoBodyYet, TestHealthCheckedProcessorCluster, TestHealthCheckReuseConnection,
//	  TestProcessorWithoutGRPCHealth,
//	  test/faults (every scenario), e2e TestPlainEnvoyBootstrap,
//	  TestFailureModeWhenThePickerStops, TestEnvoyGatewayExtensionConfigRoutes
//
//	Socket options of a health-checked processor cluster's connections
//	(ext_proc channels and the checks'): upstream_connection_options
//	.tcp_keepalive turns the kernel's keepalive on with the given probes,
//	time and interval, each unset one the system's (without it, none: Go
//	would otherwise probe every 15 s); upstream_bind_config with socket
//	options alone, of which TCP_USER_TIMEOUT (level 6, name 18,
//	STATE_PREBIND) is applied and any other is a NACK. A connection whose
//	peer vanished closes after the unanswered probes, or once sent data has
//	waited the user timeout for an acknowledgement, resetting its streams.
//	  Cluster.{upstream_connection_options.tcp_keepalive,upstream_bind_config.socket_options}
//	  Envoy: source/common/upstream/upstream_impl.cc (cluster socket
//	  options, the bind config's socket_options); source/common/network/
//	  socket_option_factory.cc SocketOptionFactory::buildTcpKeepaliveOptions,
//	  buildLiteralOptions; socket_option_impl.cc SocketOptionImpl::setOption
//	  test/faults TestPickerSilentLoss, TestPayloadSilentLoss
//
//	Transport sockets per host: the first of transport_socket_matches whose
//	match criteria are all in the host's envoy.transport_socket_match
//	metadata (LbEndpoint.metadata), else the first whose criteria are all in
//	its locality's, else transport_socket; raw_buffer is plaintext. A TLS
//	socket whose certificate or validation context comes from SDS (Istio's
//	auto mTLS, tlsMode: istio) is built as Envoy builds one whose secret
//	has not arrived, since the stand-in has no SDS: every connection
//	through it fails ("TLS error: Secret is not supplied by SDS", a
//	connection failure a retry policy may retry elsewhere; a processor's
//	stream to such a host fails as by its failure mode). A routed host
//	whose socket is TLS without SDS is NACKed (upstream TLS to model
//	servers). Cluster.filters: only Istio's TCP metadata exchange, with a
//	protocol other than h2, which stays inert on connections that do not
//	negotiate that ALPN, as all the stand-in's are.
//	  Cluster.{transport_socket_matches,transport_socket,filters}
//	  Envoy: source/common/upstream/transport_socket_match_impl.cc
//	  TransportSocketMatcherImpl::resolve; source/common/tls/ssl_socket.cc
//	  NotReadySslSocket; istio/proxy metadata_exchange.cc
//	  TestTransportSocketMatches, TestTransportSocketsInBuild, TestClusterFilters,
//	  TestIstioGatewayTraffic
//
//	Clusters warm: an EDS cluster whose first load assignment has not
//	arrived, or a health-checked cluster whose hosts have not had their
//	first check. While the node initializes (until a CDS update is in use
//	with none warming) the whole update waits, listeners included, for at
//	most 15s, as Envoy's cluster manager initializes before LDS starts.
//	After that each warming cluster waits alone: a new one is not there
//	(its routes answer 503 cluster_not_found, a filter naming it fails at
//	stream start), an updated one serves at its version in use, and every
//	other change applies at once; it is put in use when ready, or when its
//	EDS source's initial_fetch_timeout has passed (15s unset; 0, as Istio
//	sends, waits for ever).
//	  Envoy: cluster_manager_impl.cc ClusterManagerImpl::addOrUpdateCluster
//	  (warming_clusters_), ClusterManagerInitHelper; source/common/config/utility.cc
//	  Utility::configSourceInitialFetchTimeout
//	  TestEDSClusterWarms, TestClusterWarmsAlone
//
//	EDS from ADS, or, for a cluster whose eds_config is an api_config_source
//	(GRPC, one grpc_services entry), over an EDS stream of its own: to an
//	envoy_grpc cluster, which must be a static non-EDS cluster of the
//	node's bootstrap (NodeConfig.BootstrapClusters; any other is NACKed
//	with Envoy's message, "must have a statically defined non-EDS
//	cluster"), with the cluster's TLS and client certificate; or to a
//	google_grpc target_uri, which names no cluster, in plaintext without
//	channel_credentials or with ssl_credentials over TLS verified against
//	root_certs for the target's host. Routes only over ADS. Such a stream
//	that fails is retried after a jittered back-off from 500 ms doubling
//	to 30 s (the stand-in's ADS stream uses 100 ms to 5 s); the last
//	assignments it delivered stay.
//	  ConfigSource, ApiConfigSource, GrpcService.GoogleGrpc
//	  Envoy: source/common/config/utility.cc
//	  Utility::checkApiConfigSourceSubscriptionBackingCluster, validateClusterName;
//	  cluster_manager_impl.cc (primary_clusters_ from bootstrap static_resources);
//	  subscription_factory_impl.cc subscriptionFromConfigSource;
//	  source/common/grpc/google_grpc_creds_impl.cc CredsUtility::defaultChannelCredentials;
//	  source/extensions/config_subscription/grpc/grpc_stream.h (RetryInitialDelayMs,
//	  RetryMaxDelayMs)
//	  TestEndpointsFromAnotherEDSServer, test/envoygateway TestProxyStartsWhileTheExtensionIsDown, TestEDSStreamPresentsTheClientCertificate,
//	  test/envoygateway TestTrafficThroughEnvoyGatewayXDS (scale-out),
//	  TestEnvoyGatewayServesTheExtensionsXDS (every config source checked
//	  against Envoy Gateway's bootstrap)
//
//	Upstream TLS to ext_proc and EDS clusters: UpstreamTlsContext with an
//	empty validation context (any server certificate accepted, sni
//	ignored), tls_params no wider than TLS 1.2 to 1.3 (Envoy's client
//	defaults, and the stand-in's), and the client certificate of
//	common_tls_context.tls_certificates (one entry: certificate_chain and
//	private_key, each inline_bytes, inline_string or a filename read when
//	the update is built), presented when the server asks for one (mutual
//	TLS, e.g. a processor run with --client-ca-file). A file that cannot
//	be read or a pair that does not parse NACKs the update.
//	  UpstreamTlsContext, CommonTlsContext.tls_certificates, TlsCertificate, DataSource
//	  Envoy: source/common/tls/context_config_impl.cc ClientContextConfigImpl
//	  (Envoy's client default is TLS 1.2 only; the stand-in also offers 1.3)
//	  TestMutualTLSToProcessors, TestClusterClientCertificate,
//	  TestConnPoolKeysByCertificate, TestBuildNACKsWhatItDoesNotReproduce,
//	  extprocfilter TestTLS
//
//	ORIGINAL_DST with original_dst_lb_config: metadata_key (a string, or
//	the first element of a list), then the first instance of
//	use_http_header's header (x-envoy-original-dst-host unless
//	http_header_name); without either, no host: 503.
//	  Cluster.original_dst_lb_config
//	  Envoy: source/extensions/clusters/original_dst/original_dst_cluster.cc
//	  OriginalDstCluster::LoadBalancer::chooseHost, metadataOverrideHost, requestOverrideHost
//	  TestHostChoice, TestHostSourcesReadAsEnvoyDoes, e2e (Envoy Gateway shape)
//
//	load_balancing_policy: the first policy must be override_host,
//	round_robin, least_request or random. override_host: sources in order
//	(a metadata string or the first instance of a header, either a comma
//	list), hosts outside the cluster (any priority or health) skipped, the
//	first usable host tried (a retry takes the next, see Retries), else
//	fallback_policy (round robin); selected_host_key written with each
//	host chosen, for the filters' response path.
//	  OverrideHost.{override_host_sources,selected_host_key,fallback_policy}
//	  Envoy: source/extensions/load_balancing_policies/override_host/load_balancer.cc
//	  OverrideHostLoadBalancer::LoadBalancerImpl::chooseHostInternal, getSelectedHosts
//	  TestHostChoice, TestHostSourcesReadAsEnvoyDoes, TestLoadBalancingPolicyFirstWins,
//	  TestServedEndpointReachesThePicker, e2e TestXDSLiveUpdate
//
//	Metadata match criteria: the route action's metadata_match, a
//	weighted cluster's merged over it key by key, then the request's
//	envoy.lb dynamic metadata merged over both; only the envoy.lb
//	namespace is criteria (kgateway's envoy.lb.subset_hint is inert).
//	Read by the subset load balancer alone.
//	  RouteAction.metadata_match, WeightedCluster.ClusterWeight.metadata_match
//	  Envoy: source/common/router/config_impl.cc RouteEntryImplBase (and
//	  WeightedClusterEntry), router.h Filter::metadataMatchCriteria,
//	  metadatamatchcriteria_impl.cc MetadataMatchCriteriaImpl::extractMetadataMatchCriteria
//	  TestMatchCriteria
//
//	Subset load balancing (lb_subset_config on a STATIC, STRICT_DNS,
//	LOGICAL_DNS or EDS cluster): each selector groups the hosts that have
//	all its keys in their envoy.lb metadata by those values (every host,
//	whatever its health or priority); a request whose criteria name
//	exactly a selector's keys, each value equal (as protobuf values: "1"
//	is not 1), goes to that group, round robin among its EDS-healthy
//	hosts of its best priority less those failing health checks (panic
//	threshold applies), or among all of its hosts if none is EDS-healthy;
//	otherwise the fallback of the selector that ends at those keys, else
//	the cluster's: ANY_ENDPOINT (the cluster's round robin) or NO_FALLBACK
//	(no healthy upstream, 503). A comma list in the criteria matches no
//	group. DEFAULT_SUBSET, KEYS_SUBSET, FALLBACK_LIST, list_as_any,
//	panic_mode_any, single_host_per_subset, and subsets on ORIGINAL_DST or
//	with load_balancing_policy are NACKed.
//	  Cluster.lb_subset_config, LbSubsetConfig.{fallback_policy,subset_selectors},
//	  LbSubsetSelector.{keys,fallback_policy}, LbEndpoint.metadata
//	  Envoy: source/extensions/load_balancing_policies/subset/subset_lb.cc
//	  SubsetLoadBalancer::chooseHostIteration, tryChooseHostFromContext,
//	  findSubset, tryFindSelectorFallbackParams, initSubsetSelectorMap,
//	  processSubsets, extractSubsetMetadata
//	  TestSubsetLoadBalancer, TestTrafficInTheKgatewayShape,
//	  test/kgateway TestTrafficThroughKgateway
//
//	envoy.filters.http.header_to_metadata, request rules on headers: at
//	its place in the chain (so after an ext_proc filter's answer to the
//	request headers), each rule in order reads every instance of its
//	header joined with ",", removes the header if asked, and writes the
//	rule's fixed value or the header's as a string under key in
//	metadata_namespace (default: the filter's name), merged into the
//	stream's dynamic metadata; an empty value or one of 8 KiB or more is
//	not written; on_header_missing writes its value when the header is
//	absent. Envoy's own rejections (cookie with header, neither, no
//	on_header_* rule, an empty on_header_missing value) NACK with its
//	words; cookies, regex rewrites, NUMBER, PROTOBUF_VALUE, BASE64,
//	response rules and per-route config are NACKed.
//	  header_to_metadata.v3.Config.{request_rules}, Rule.{header,on_header_present,
//	  on_header_missing,remove}, KeyValuePair.{metadata_namespace,key,value}
//	  Envoy: source/extensions/filters/http/header_to_metadata/
//	  header_to_metadata_filter.cc HeaderToMetadataFilter::decodeHeaders,
//	  writeHeaderToMetadata, applyKeyValue, addMetadata, decideNamespace;
//	  filter_config.cc HeaderValueSelector::extract, Rule::Rule;
//	  filter_config.h MAX_HEADER_VALUE_LEN
//	  TestHeaderToMetadataRules, TestKgatewayShapeBuildsAndNACKs,
//	  TestTrafficInTheKgatewayShape
//
// # Not reproduced
//
// Set in a configuration, these are NACKed: static secrets, and certificate
// providers (an SDS secret is treated as never arriving, above); TLS
// listeners, several filter chains or any filter_chain_match but
// plaintext; downstream HTTP/2 (codec_type HTTP2 or HTTP3); per-try
// timeouts, retry priorities, retry host predicates but previous_hosts,
// reset-before-request, retriable headers, rate-limited back-off and
// include_attempt_count_in_response; hedging, redirects,
// request_headers_to_add; query-parameter, grpc and metadata route
// matches; grpc_timeout_offset; ring hash and maglev load balancing, and
// subset load balancing beyond the row above; transport_socket_matcher; TLS to model servers; certificate
// validation (validation_context); TLS versions outside 1.2 to 1.3 and
// cipher, curve and signature settings; more than one tls_certificates
// entry (Envoy picks among them by the server's accepted algorithms),
// private key passwords, PKCS#12, private key providers and watched
// directories; DataSource environment_variable; ext_proc body modes
// STREAMED, BUFFERED_PARTIAL and GRPC, observability_mode, request and
// response attributes, forward_rules, non-default mutation_rules,
// google_grpc and http_service for ext_proc (google_grpc only as an EDS
// source), google_grpc channel credentials but ssl_credentials; TCP, HTTP
// and custom health checks, TCP ones with payloads or reusing their
// connection, more than one health check per cluster;
// upstream network filters but Istio's metadata exchange; any HTTP filter
// type not listed above (wasm, lua, rbac, ...), and fault or cors filters
// configured to act.
//
// Accepted and ignored, each with its reason in xdsfields.go (and, for
// filters, istio.go and transport.go): outlier detection (no host is
// ejected), circuit breakers, buffer limits but the retry
// buffer's, statistics, logging, tracing, x-forwarded-for and x-request-id
// handling, response header changes, path normalisation (normalize_path,
// merge_slashes: the stand-in matches the path as sent), the downstream
// transport socket's handshake timeout, and Istio's telemetry (grpc_stats,
// istio.stats, workload discovery, the TCP metadata exchange on
// connections that do not negotiate its ALPN).
//
// # Also not reproduced, in both modes
//
//   - ext_proc local replies go straight to the client without passing other
//     filters' response path; HTTP trailers are not forwarded; upstream
//     requests are HTTP/1.1;
//   - the rest of Envoy: x-request-id, x-forwarded-* (use_remote_address),
//     header sanitising but x-forwarded-client-cert's, the x-envoy-*
//     request headers that adjust the router (x-envoy-retry-on,
//     x-envoy-max-retries, x-envoy-upstream-rq-timeout-ms, ...), HTTP/2,
//     HTTP health checks and TCP ones beyond connect-only, outlier
//     detection. The proxy adds a
//     response header x-infergate-upstream naming the endpoint that served,
//     which Envoy does not.
package envoysim
