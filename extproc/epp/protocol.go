// Package epp is the endpoint picker: an ext_proc processor that picks the
// model-server endpoint for each inference request and answers it the way
// the inference-extension endpoint picker protocol prescribes.
package epp

import "github.com/infergate/infergate/inference/wire"

// Wire names of the endpoint picker protocol.
const (
	// DestinationHeader carries the pick ("ip:port" or a comma list, best
	// first); the same value goes into LBNamespace metadata.
	DestinationHeader = wire.DestinationEndpointKey
	// LBNamespace is Envoy's subset load-balancing metadata namespace.
	LBNamespace = wire.LBNamespace
	// SubsetNamespace / SubsetKey carry the proxy's optional hint: the only
	// endpoints the pick may come from.
	SubsetNamespace = wire.SubsetHintNamespace
	SubsetKey       = wire.SubsetKey
	// ServedKey (in LBNamespace, response path) is the endpoint that served.
	ServedKey = wire.ServedEndpointKey
	// ScoresKey (in LBNamespace) carries per-endpoint scores when enabled.
	ScoresKey = "x-gateway-destination-endpoint-scores"

	// ConformanceServedHeader is the response header in which the
	// conformance-test picker reports the served endpoint, and EchoSetHeader
	// the request header that asks the suite's echo server to set a
	// response header (name:value) of its own.
	ConformanceServedHeader = "x-conformance-test-served-endpoint"
	EchoSetHeader           = "X-Echo-Set-Header"
	// ConformanceShedHeader, on a request to the conformance-test picker,
	// has it shed the request as a saturated pool sheds a sheddable one
	// (429, rejected-saturated, Retry-After), so a suite can check that a
	// gateway hands the picker's refusal to the client.
	ConformanceShedHeader = wire.ShedTestHeader
	// ConformanceFallbackHeader, on a request to the conformance-test
	// picker, has it answer every endpoint the selection header names, in
	// its order: the pick and its fallbacks, for a suite to check that a
	// gateway walks the list.
	ConformanceFallbackHeader = wire.FallbackTestHeader

	// ObjectiveHeader names the request's objective (→ priority);
	// LegacyObjectiveHeader is the older name, still honoured.
	ObjectiveHeader       = "x-llm-d-inference-objective"
	LegacyObjectiveHeader = "x-gateway-inference-objective"
	// FairnessHeader names the request's fairness flow.
	FairnessHeader       = "x-llm-d-inference-fairness-id"
	LegacyFairnessHeader = "x-gateway-inference-fairness-id"
)

// Drop reasons sent in the drop-reason header of immediate responses.
const (
	ReasonNoEndpoints = "rejected-no-endpoints"
	ReasonSaturated   = "rejected-saturated"
	ReasonBadRequest  = "rejected-bad-request"
	ReasonTTLExpired  = "rejected-ttl-expired"
	ReasonCancelled   = "rejected-context-cancelled"
)
