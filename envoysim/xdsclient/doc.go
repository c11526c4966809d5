// Package xdsclient is the xDS side of the Envoy stand-in (envoysim):
// an Aggregated Discovery Service client that talks to a real control plane
// (Envoy Gateway, Istio, go-control-plane) the way an Envoy node does, so
// that the end-to-end tests exercise the control plane's real xDS output
// rather than hand-written proxy config. It is a test harness, not a
// production xDS client: users run Envoy.
//
// # Protocol reproduced
//
// State-of-the-world ADS only (envoy.service.discovery.v3.
// AggregatedDiscoveryService/StreamAggregatedResources), with Envoy's client
// rules:
//
//   - one stream, one sender; DiscoveryRequest.node on the first request of
//     each stream only (what the protocol guarantees; Envoy does the same
//     with set_node_on_first_message_only);
//   - ACK and NACK per the xDS protocol: every DiscoveryResponse of a
//     subscribed type is answered with its response_nonce, version_info the
//     last accepted version, error_detail on rejection;
//   - a subscription change is a new request carrying the type's last
//     accepted version and last nonce; while a response is being applied
//     requests wait, so the RDS/EDS subscriptions its handler makes leave
//     together, just before its ACK, as Envoy pauses RDS during an LDS
//     update and EDS during a CDS update;
//   - after a reconnect every subscription is re-sent, in the order first
//     subscribed, with the last accepted version_info;
//   - responses of types never subscribed are ignored (logged), resources of
//     another type NACK the response, envoy.service.discovery.v3.Resource
//     wrappers are unwrapped and bodiless TTL heartbeats are ACKed without
//     touching the handler.
//
// # Deliberate differences from Envoy
//
//   - a NACK that repeats the previous one (same type, same rejected
//     version_info) is sent after a growing delay (Config.BackoffInitial
//     doubling up to Config.BackoffMax). go-control-plane's snapshot cache
//     answers a NACK at once with the same snapshot, so an unpaced client
//     spins; Envoy avoids this only when rate_limit_settings is configured.
//   - no delta xDS, no per-type (non-aggregated) streams, no resource TTL
//     expiry, no xdstp:// names, no on-demand discovery.
package xdsclient
