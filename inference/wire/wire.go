// Package wire holds the names the endpoint picker protocol puts on the wire
// (headers and dynamic-metadata keys), so the picker, the Envoy stand-in,
// the gateway integrations and the conformance suite spell them once. It
// imports nothing, so the Wasm build can use it too.
package wire

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
	// EndpointSelectionHeader is the request header the picker's testing
	// filter (header-based-testing-filter) keeps the endpoints of: a
	// comma list of IPs or ip:port. Whoever sends it steers the pick.
	EndpointSelectionHeader = "test-epp-endpoint-selection"
	// ShedTestHeader asks infergate's conformance-test picker to shed the
	// request as a saturated pool would (429, rejected-saturated).
	ShedTestHeader = "x-infergate-test-epp-shed"
	// FallbackTestHeader asks infergate's conformance-test picker for every
	// endpoint EndpointSelectionHeader names, in its order, as the pick and
	// its fallbacks.
	FallbackTestHeader = "x-infergate-test-epp-fallbacks"
	// DropReasonHeader carries the machine-readable reason of a refusal, by
	// the picker or the payload processor; the name the reference picker
	// uses, so dashboards and tests carry over.
	DropReasonHeader = "x-llm-d-request-dropped-reason"
)
