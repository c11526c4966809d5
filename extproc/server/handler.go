// Package server is the ext_proc plumbing every infergate processor shares.
//
// It owns the Envoy side of the protocol (message order, FULL_DUPLEX_STREAMED
// rules, body assembly within a limit, re-chunking, immediate responses, health
// and graceful stop) so that a processor only decides what to do with a whole
// request: an Exchange is called once with headers and body, and again on the
// response path.
package server

import (
	"context"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// Handler creates one Exchange per ext_proc stream, that is per HTTP request.
type Handler interface {
	NewExchange(ctx context.Context) Exchange
}

// Exchange handles one HTTP request seen through ext_proc.
type Exchange interface {
	// HandleRequest is called once, when the request headers and the whole
	// body (nil for body-less requests) have arrived.
	HandleRequest(ctx context.Context, req *Request) *Decision
	// HandleResponseHeaders is called when the upstream's response headers arrive.
	HandleResponseHeaders(ctx context.Context, resp *Response) *Decision
	// HandleResponseBody sees each response body chunk as it streams and
	// returns what to forward in its place (usually the chunk itself), and
	// dynamic metadata to emit with it (nil for none).
	HandleResponseBody(ctx context.Context, chunk []byte, endOfStream bool) ([]byte, *structpb.Struct)
	// Close is called once when the stream ends for any reason; err is nil
	// when the exchange ran to its natural end.
	Close(ctx context.Context, summary Summary)
}

// HeaderGate is an optional Exchange extension. RejectEarly is called with
// the headers (and metadata so far) of a request that carries a body, before
// the body arrives; a non-nil Rejection ends the request at once. Shedding
// uses it: a request that its headers alone condemn should not cost the
// proxy and the processor its body, least of all when the pool is
// overloaded. HandleRequest is not called for a request rejected early.
type HeaderGate interface {
	RejectEarly(ctx context.Context, req *Request) *Rejection
}

// BodyLimiter is an optional Exchange extension: a request-body limit of
// the exchange's own (a policy's), enforced like Limits.MaxRequestBodyBytes
// as the chunks arrive, so an oversized body is refused before it is
// buffered rather than after. CheckBodySize gets the body's size so far
// and returns the rejection once it is over; HandleRequest is not called
// then.
type BodyLimiter interface {
	CheckBodySize(n int64) *Rejection
}

// DecisionCoster is an optional Exchange extension: what deciding a
// request holds beyond its body (a parse, copies of its text, findings, a
// rewritten body), in bytes, as an upper bound. The server charges it to
// the request buffer budget while HandleRequest runs, so that the budget
// bounds what requests cost, not only what their bodies weigh. A large
// decision waits for room within the decisions' share of the budget (half
// of it; one over the share runs alone), and one over a body of 1 MiB or
// more for a core (Limits.MaxLargeDecisions), or is refused: 503
// processor-overloaded when no room comes within the request idle
// timeout, 413 request-too-large when its cost and body could not fit the
// budget even alone; HandleRequest is not called then (decision.go has
// the rules). DecisionCost is called
// once, with the whole request, just before HandleRequest; it must be
// cheap (it may measure the body, not read it).
type DecisionCoster interface {
	DecisionCost(req *Request) int64
}

// Headers holds HTTP headers with lower-case names, one value each, as
// Envoy's HeaderMap presents them to ext_proc.
type Headers map[string]string

// Get returns the value of a header by case-insensitive name.
func (h Headers) Get(name string) string { return h[strings.ToLower(name)] }

// Metadata is ext_proc filter metadata: namespace → struct.
type Metadata map[string]*structpb.Struct

// Request is what a processor sees of an HTTP request.
type Request struct {
	Headers Headers
	// Body is the whole request body; nil when the request carried none.
	// The server lets go of it (sets it nil) once the answers carrying it
	// are sent: an Exchange that keeps it past HandleRequest keeps it
	// outside the request buffer budget for as long as the stream lasts.
	Body []byte
	// HasTrailers is true when the request ended with trailers.
	HasTrailers bool
	// Metadata merges the metadata_context of every request-path message,
	// so a hint is honoured on whichever message carried it.
	Metadata Metadata
}

// Response is what a processor sees of the upstream's response headers.
type Response struct {
	Headers  Headers
	Metadata Metadata
	// EndOfStream is true when the response has no body.
	EndOfStream bool
}

// Summary tells Exchange.Close how the stream ended.
type Summary struct {
	// ResponseMetadata merges the metadata_context of every response-path message.
	ResponseMetadata Metadata
	// ResponseStatus is the upstream :status, 0 if no response was seen.
	ResponseStatus int
	// Err is the reason the stream ended early, nil on a natural end.
	Err error
}

// Header is one header to set.
type Header struct {
	Name, Value string
}

// Decision is a processor's answer to a request or response.
type Decision struct {
	// SetHeaders overwrite (or add) headers.
	SetHeaders []Header
	// RemoveHeaders are removed before SetHeaders apply.
	RemoveHeaders []string
	// DynamicMetadata is emitted as ProcessingResponse.dynamic_metadata
	// (namespace → fields).
	DynamicMetadata *structpb.Struct
	// EncodedMetadata, when set, is sent instead of DynamicMetadata: the
	// same kind of metadata, encoded once (EncodeMetadata) and shared by
	// the decisions that carry it.
	EncodedMetadata *EncodedMetadata
	// Body, when non-nil, replaces the request body.
	Body []byte
	// ClearRouteCache asks the proxy to re-run route selection because a
	// routing header changed.
	ClearRouteCache bool
	// Reject ends the exchange with an immediate response instead.
	Reject *Rejection
}

// Rejection is an immediate response sent to the client instead of
// forwarding the request.
type Rejection struct {
	Status int
	// Reason goes into the drop-reason header (wire.DropReasonHeader);
	// short, machine-readable.
	Reason string
	// Message goes into the JSON error body; for humans.
	Message string
	// Headers are added to the answer, after content-type and the drop reason.
	Headers []Header
}
