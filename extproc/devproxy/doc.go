// Package devproxy is the Envoy stand-in: a loopback HTTP/1.1 reverse proxy
// that runs each request through ext_proc filters the way Envoy's
// envoy.filters.http.ext_proc filter does (extproctest.Client) and then
// routes it the way a gateway honours the endpoint picker's answer. It is
// linked into the binary as `infergate devproxy` for the demo, the
// benchmarks and the end-to-end tests, because Envoy itself cannot run on
// the machines this project is built on. It is a test harness written from
// Envoy's documented semantics, never a production gateway: users run Envoy.
//
// # Behaviour reproduced
//
//   - filters run in order on the request path, each one's mutated headers
//     and processed body feeding the next, and in reverse order on the
//     response path; the upstream request starts when the last filter lets
//     the headers continue; bodies stream through and every response chunk
//     is flushed to the client at once;
//   - routing "override-host" (envoy.load_balancing_policies.override_host as
//     Istio configures it): envoy.lb metadata wins over the
//     x-gateway-destination-endpoint header, a comma list is walked in order
//     on connection failure, invalid entries are skipped;
//     "original-dst-header" (an ORIGINAL_DST cluster with use_http_header):
//     the first instance of the header only, a value that is not one ip:port
//     gives 503 "no healthy upstream"; without a pick, round robin over the
//     fallback endpoints, or 503 "no healthy upstream";
//   - the router's own local replies (no healthy upstream, upstream connect
//     failure, upstream timeout) pass through the filters' response path; a
//     failure after the response started resets the client connection.
//
// # Not reproduced
//
//   - ext_proc local replies go straight to the client without passing other
//     filters' response path; HTTP trailers are not forwarded;
//   - the rest of Envoy: x-request-id, x-forwarded-*, header sanitising,
//     HTTP/2, retry policies beyond walking the override list (and only
//     while the request body has not been read), health checks, outlier
//     detection, and override_host's check that the host belongs to the
//     cluster. The proxy also adds a response header x-infergate-upstream
//     naming the endpoint that served, which Envoy does not.
package devproxy
