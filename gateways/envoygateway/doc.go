// Package envoygateway is infergate's Envoy Gateway extension server
// (`infergate egext`): Envoy Gateway v1.9 calls it through an
// extensionManager that lists InferencePool as a backendResource, so that an
// HTTPRoute whose backendRef is an InferencePool resolves (plain Envoy
// Gateway answers InvalidKind) and every request to the pool goes through
// the pool's endpoint picker.
//
// For each pool a route serves, the hooks render:
//
//   - Route (PostRouteModify): the route turns the pool's ext_proc filter
//     on (an ExtProcPerRoute processing mode in typed_per_filter_config) and
//     carries the pool in its metadata, for Translation to find; a pool
//     that cannot be used (no endpointPickerRef, an unknown failureMode, ...)
//     makes the route a 500 naming the problem, nothing else changes;
//   - Cluster (PostClusterModify): the rule's cluster holds the pool's
//     endpoints (ready pods × targetPorts; served over EDS by the extension
//     from a Pod watch when Options.EDSAddress is set, so they follow pods
//     without a translation) behind Envoy's override_host load balancing
//     policy, which takes the host the picker wrote in envoy.lb metadata.
//     Not ORIGINAL_DST by header: a header can come from the client, an
//     ORIGINAL_DST cluster has no host when the picker fails open (503), and
//     it would send traffic to any address the picker names. With
//     override_host, hosts outside the pool are skipped, a FailOpen pool whose
//     picker is down is balanced round robin over its endpoints, and the
//     host that served is reported to the picker (selected_host_key);
//   - a rule split between InferencePools by weight (Envoy Gateway renders
//     its backendRefs as one cluster) becomes weighted clusters, one per
//     pool with that pool's endpoints, each turning its own pool's picker
//     on in the weighted cluster's typed_per_filter_config: Envoy picks the
//     cluster when it matches the route (and the same one when a filter
//     clears the route cache), so a pool's picker only ever chooses among
//     its own pods. The weights come from the HTTPRoute (the hooks are not
//     given them), read from the extension's cache; a rule that mixes
//     pools with other backends answers 500;
//   - Translation (PostTranslateModify): the picker's cluster (STRICT_DNS
//     <service>.<namespace>.svc.cluster.local, HTTP/2, TLS accepting its
//     self-signed certificate) and one ext_proc filter per pool on each HTTP
//     listener that serves the pool, inserted just before the router so
//     Envoy Gateway's own filters run first. On the listener the filter
//     sends nothing (headers SKIP, bodies NONE); the pool's routes turn it on
//     with an ExtProcPerRoute processing mode: request headers and a
//     FULL_DUPLEX_STREAMED request body, and response headers (response
//     bodies only with the pool annotation infergate.io/epp-response-body:
//     streamed). It is not a disabled filter enabled per route: Envoy fixes a
//     request's filter chain from the first route matched, so a rule reached
//     only once the payload processor set the model header would never call
//     the picker. failure_mode_allow is the pool's failureMode. A
//     header_mutation filter before them removes a client's own
//     x-gateway-destination-endpoint, and, when configured (Payload), the
//     payload processor's filter runs first of all, on every route.
//
// The extension also writes each pool's status.parents and records Warning
// Events for its problems (status.go), and with Options.EDSAddress serves
// the pools' endpoints over EDS (eds.go).
//
// Envoy Gateway configuration (EnvoyGateway resource, under extensionManager):
//
//	backendResources:
//	- {group: inference.networking.k8s.io, version: v1, kind: InferencePool}
//	hooks:
//	  xdsTranslator:
//	    post: [Route, Cluster, Translation]
//	    translation: {listener: {includeAll: true}, route: {includeAll: true}, cluster: {includeAll: true}}
//	service:
//	  fqdn: {hostname: infergate-egext.infergate-system.svc.cluster.local, port: 5005}
//	failOpen: false
package envoygateway
