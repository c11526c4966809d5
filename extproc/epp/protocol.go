// Package epp is the endpoint picker: an ext_proc processor that picks the
// model-server endpoint for each inference request and answers it the way
// the inference-extension endpoint picker protocol prescribes. The
// protocol's header and metadata names are in package wire.
package epp

// Drop reasons sent in the drop-reason header (wire.DropReasonHeader) of
// immediate responses.
const (
	ReasonNoEndpoints = "rejected-no-endpoints"
	ReasonSaturated   = "rejected-saturated"
	ReasonBadRequest  = "rejected-bad-request"
	ReasonTTLExpired  = "rejected-ttl-expired"
	ReasonCancelled   = "rejected-context-cancelled"
)
