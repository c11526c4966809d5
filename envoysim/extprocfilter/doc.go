// Package extprocfilter stands in for Envoy, which cannot run on the machines
// this project is built and tested on (no Envoy binary, no container engine).
// It is an ext_proc client that drives ext_proc servers (the endpoint picker,
// the payload processor) the way Envoy's envoy.filters.http.ext_proc filter
// does, written from Envoy's documented semantics. Client and Exchange give
// protocol tests the exact wire behaviour; package envoysim builds the Envoy
// stand-in (an HTTP proxy chaining filters and routing like a gateway) on
// them, and fakeproc holds scripted ext_proc servers for tests.
//
// # Envoy behaviour reproduced
//
// Stream and messages:
//   - one gRPC stream per HTTP request per filter; the request path and the
//     response path share it; it is half-closed when the request is done;
//   - headers as Envoy's header map: pseudo-headers first, lower-case names,
//     bytes in raw_value (value left empty), end_of_stream on the headers
//     message when there is no body;
//   - protocol_config (the negotiated body modes) on the first message only;
//   - metadata_context on every message: the configured forwarding metadata
//     (e.g. envoy.lb.subset_hint), plus, on the response path,
//     envoy.lb/x-gateway-destination-endpoint-served = the ip:port that served.
//
// Processing modes:
//   - header modes SEND and SKIP; body modes NONE, BUFFERED and
//     FULL_DUPLEX_STREAMED; Envoy's config check that FULL_DUPLEX_STREAMED
//     needs the trailer mode SEND;
//   - FULL_DUPLEX_STREAMED: body chunks go to the server as they arrive,
//     without waiting for any response; chunks are cut as the HTTP/1 codec
//     cuts them (reads of at most 16 KiB, end_of_stream on the last data chunk
//     when the length is known, an empty final chunk for chunked transfer,
//     a trailers message instead of end_of_stream when there are trailers);
//     body responses must be body_mutation.streamed_response and are passed
//     on chunk by chunk as they arrive; content-length is dropped; there is
//     no message timeout;
//   - BUFFERED: the headers are held until the body response, the body goes
//     in one message, body / clear_body mutations apply, and a content-length
//     that does not match the mutated body is an error;
//   - message_timeout (default 200ms) in directions that are not
//     FULL_DUPLEX_STREAMED.
//
// Responses from the server:
//   - order per direction: headers, then body, then trailers; anything
//     unexpected (out of order, duplicated, of another direction, of an
//     unknown type) is a spurious message, and a plain body mutation in
//     FULL_DUPLEX_STREAMED fails with Envoy's text "spurious message: Normal
//     body mutation response is received while body_mode_ is
//     FULL_DUPLEX_STREAMED";
//   - header_mutation with Envoy's rules (mutation_utils.cc
//     MutationUtils::applyHeaderMutations): raw_value only (a value-only
//     header is set empty, value beside raw_value is not read), the
//     deprecated append flag only (false: overwrite; append_action is
//     ignored), the default mutation
//     rules (:method, :scheme, :authority, host and x-envoy-* are not
//     changed, system headers are not removed, :path may change on requests
//     and :status on responses), invalid names or values rejected;
//   - clear_route_cache recorded on the request path only, and only with a
//     header mutation in the same answer (DecodingProcessorState::
//     clearRouteCache); dynamic_metadata merged by namespace into the stream's
//     metadata shared by all filters;
//   - immediate_response ends the request with that local reply (status, 200
//     when missing or below 200; header mutation; body; details).
//
// Metadata (metadata_options):
//   - with FilterConfig.MetadataOptions set, only the receiving namespaces
//     of the server's dynamic_metadata are kept (none when the list is
//     empty); RequestWithMetadata / ResponseWithMetadata send the forwarded
//     namespaces the caller selected from the stream's metadata. Without
//     MetadataOptions every namespace is kept, a convenience for tests.
//
// Failures:
//   - a gRPC error, a server that cannot be reached when the stream opens,
//     or a spurious message is a stream error: with failure_mode_allow
//     false a 500 local reply, or status_on_error when it is set; a message
//     timeout is a 504 whatever status_on_error says (ext_proc.cc
//     Filter::onGrpcError, onMessageTimeout);
//   - with failure_mode_allow true the filter is skipped and the request
//     continues unmodified, but in FULL_DUPLEX_STREAMED only until body
//     data has reached the filter (ext_proc.cc Filter::onData,
//     Filter::failureModeAllow, processor_state.cc canFailOpen; Envoy PR
//     #41276); after that the failure is a 500. The body is read from once
//     the headers are on the stream (or the stream failed to connect), and
//     a failure of the stream's connection, refused at the open or reset
//     after it, counts only once that first read has begun and returned
//     (the return bounded by 100 ms): in Envoy the body that came with the
//     headers reaches the filter in the headers' dispatch (Filter::
//     decodeHeaders, decodeData), a connection's failure on a later turn of
//     the event loop (connection_impl.cc ConnectionImpl::onFileEvent; even
//     a connect refused at once is deferred to a write event,
//     ClientConnectionImpl::connect).
//     A stream whose start fails at once (NewClientStarting: no cluster, no
//     healthy host; async_client_impl.cc AsyncStreamImpl::initialize) fails
//     open with or without a body. A BUFFERED body stays in the filter and
//     fails open at any time;
//   - a rejected mutation is a 500 (status_on_error when set) whatever
//     failure_mode_allow says (Filter::handleErrorResponse);
//   - a server that ends its stream cleanly (grpc-status OK) is left out for
//     the rest of the request, even with answers still owed (body data it
//     held is lost) (Filter::onGrpcCloseWithStatus).
//
// # Not reproduced
//
//   - body modes STREAMED, BUFFERED_PARTIAL and GRPC (rejected by NewClient);
//     mode_override and allow_mode_override; CONTINUE_AND_REPLACE (treated as
//     an invalid response); send_body_without_waiting_for_header_response;
//     observability_mode; flow-control messages (flow_control_init, window
//     updates, request_drain); streamed_immediate_response;
//   - typed metadata; request/response attributes; forward_rules;
//     mutation_rules other than the defaults;
//     deferred_close_timeout; grpc_service timeout and initial metadata
//     (route_cache_action, forwarding namespaces and ExtProcPerRoute are the
//     proxy's: package envoysim);
//   - buffer limits (a BUFFERED body is not capped); trailers in modes other
//     than FULL_DUPLEX_STREAMED.
package extprocfilter
