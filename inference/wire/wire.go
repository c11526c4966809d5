// Package wire holds the names the endpoint picker protocol and the
// payload processor put on the wire (headers and dynamic-metadata keys),
// and the conventions both ends assume, so the picker, the payload
// processor, the Envoy stand-in, the gateway integrations and the
// conformance suite spell them once. It imports nothing, so the Wasm
// build can use it too.
package wire

// Names of the endpoint picker protocol.
const (
	// LBNamespace is Envoy's load-balancing dynamic-metadata namespace; the
	// picker's answer and the served endpoint live in it.
	LBNamespace = "envoy.lb"
	// SubsetHintNamespace carries the proxy's optional subset hint to the picker.
	SubsetHintNamespace = "envoy.lb.subset_hint"
	// ExtProcHealthService is the grpc.health.v1 service a processor
	// reports ready under on its ext_proc port, and gateways check.
	ExtProcHealthService = "envoy.service.ext_proc.v3.ExternalProcessor"
	// DestinationEndpointKey is the header and metadata key of the pick:
	// "ip:port", or a comma list best first.
	DestinationEndpointKey = "x-gateway-destination-endpoint"
	// ServedEndpointKey reports, on the response path, the endpoint that served.
	ServedEndpointKey = "x-gateway-destination-endpoint-served"
	// SubsetKey is the subset hint's key: a list of "ip:port".
	SubsetKey = "x-gateway-destination-endpoint-subset"
	// ScoresKey (in LBNamespace) carries every candidate's score, when the
	// picker is asked to emit them.
	ScoresKey = "x-gateway-destination-endpoint-scores"
	// ObjectiveHeader names a request's objective (and so its priority);
	// LegacyObjectiveHeader is the older name, still honoured.
	ObjectiveHeader       = "x-llm-d-inference-objective"
	LegacyObjectiveHeader = "x-gateway-inference-objective"
	// FairnessHeader names a request's fairness flow;
	// LegacyFairnessHeader is the older name, still honoured.
	FairnessHeader       = "x-llm-d-inference-fairness-id"
	LegacyFairnessHeader = "x-gateway-inference-fairness-id"
	// DropReasonHeader carries the machine-readable reason of a refusal, by
	// the picker or the payload processor; the name the reference picker
	// uses, so dashboards and tests carry over.
	DropReasonHeader = "x-llm-d-request-dropped-reason"
)

// Names the payload processor sets on the requests it passes on, for the
// routes and the picker after it.
const (
	// ModelNameHeader is the model the request names (a base model or a
	// LoRA adapter); BaseModelNameHeader the base model it runs on, which
	// routes match. Lower-case, as HTTP/2 and Envoy's header maps have
	// them: X-Gateway-Model-Name is the same header.
	ModelNameHeader     = "x-gateway-model-name"
	BaseModelNameHeader = "x-gateway-base-model-name"
	// MaskedHeader lists the guardrail rules that masked something,
	// comma-separated, so the upstream and the access log can tell the
	// prompt was changed.
	MaskedHeader = "x-infergate-masked"
	// GuardrailHeader names the guardrail rule that rejected a request.
	GuardrailHeader = "x-infergate-guardrail"
)

// Names of the conformance tests: the upstream suite's and infergate's own.
const (
	// EndpointSelectionHeader is the request header the picker's testing
	// filter (header-based-testing-filter) keeps the endpoints of: a
	// comma list of IPs or ip:port. Whoever sends it steers the pick.
	EndpointSelectionHeader = "test-epp-endpoint-selection"
	// ConformanceServedHeader is the response header in which the
	// conformance-test picker reports the endpoint that served.
	ConformanceServedHeader = "x-conformance-test-served-endpoint"
	// EchoSetHeader asks the conformance suite's echo server to set a
	// response header ("name:value") of its own.
	EchoSetHeader = "X-Echo-Set-Header"
	// ShedTestHeader asks infergate's conformance-test picker to shed the
	// request as a saturated pool would (429, rejected-saturated).
	ShedTestHeader = "x-infergate-test-epp-shed"
	// FallbackTestHeader asks infergate's conformance-test picker for every
	// endpoint EndpointSelectionHeader names, in its order, as the pick and
	// its fallbacks.
	FallbackTestHeader = "x-infergate-test-epp-fallbacks"
)

// DefaultBytesPerToken is how many bytes of prompt text make a token
// wherever no tokenizer is at hand: about right for English text with the
// common tokenizers. The picker assumes it of a server until the server's
// own counters say otherwise (and cuts prompts into prefix blocks by it),
// the payload processor estimates prompt tokens by it, and the simulator
// tokenizes by it by default, so that all of them agree on a prompt's
// size.
const DefaultBytesPerToken = 4
