package envoygateway

import (
	"encoding/json"
	"errors"
	"fmt"

	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/gateways/internal/xdsbuild"
)

// Annotations a pool may carry to change what the extension renders.
const (
	// ResponseBodyAnnotation "streamed" sends response bodies to the picker
	// (FULL_DUPLEX_STREAMED); by default it gets response headers only, which
	// carry the served endpoint, and every streamed chunk skips a gRPC hop.
	ResponseBodyAnnotation = "infergate.io/epp-response-body"
	// PlaintextAnnotation "true" reaches the picker without TLS; by default
	// the extension uses TLS that accepts the picker's self-signed certificate.
	PlaintextAnnotation = "infergate.io/epp-plaintext"
	// HealthCheckAnnotation "tcp" has Envoy check the picker with a
	// connect-only TCP check instead of grpc.health.v1 on its ext_proc
	// port, for a picker that serves no such service there (GAIE's and
	// llm-d's unless run with --health-checking); "grpc" is the default.
	HealthCheckAnnotation = "infergate.io/epp-health-check"
)

// DefaultEPPPort is the endpoint picker's ext_proc port when the pool's
// endpointPickerRef names none.
const DefaultEPPPort = 9002

// Pool is what the extension needs of an InferencePool.
type Pool struct {
	Namespace, Name string
	// TargetPorts are the model servers' ports on each selected pod.
	TargetPorts []int32
	Selector    map[string]string
	// EPPService and EPPPort locate the endpoint picker (a Service in the
	// pool's namespace).
	EPPService string
	EPPPort    uint32
	// FailOpen is failureMode FailOpen: requests go on without the picker's
	// answer when it cannot be reached.
	FailOpen     bool
	ResponseBody bool
	Plaintext    bool
	// HealthCheck is how Envoy checks the picker (xdsbuild.HealthGRPC or
	// xdsbuild.HealthTCP).
	HealthCheck string
}

// Key is namespace/name.
func (p *Pool) Key() string { return p.Namespace + "/" + p.Name }

// ErrInvalidPool wraps what makes a pool unusable; the route gets a 500
// naming it, the rest of the configuration is unaffected.
var ErrInvalidPool = errors.New("invalid InferencePool")

// ParsePool reads an InferencePool from the JSON Envoy Gateway hands the
// extension (ExtensionResource.unstructured_bytes) and checks what the
// rendering relies on.
func ParsePool(data []byte) (*Pool, error) {
	var ip inferencev1.InferencePool
	if err := json.Unmarshal(data, &ip); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPool, err)
	}
	if ip.Kind != "InferencePool" || ip.APIVersion != inferencev1.GroupVersion.String() {
		return nil, fmt.Errorf("%w: %s %s is not an %s InferencePool", ErrInvalidPool, ip.APIVersion, ip.Kind, inferencev1.GroupVersion)
	}
	return poolOf(&ip)
}

func poolOf(ip *inferencev1.InferencePool) (*Pool, error) {
	p := &Pool{Namespace: ip.Namespace, Name: ip.Name}
	bad := func(format string, args ...any) (*Pool, error) {
		return nil, fmt.Errorf("%w %s: %s", ErrInvalidPool, p.Key(), fmt.Sprintf(format, args...))
	}
	if len(ip.Spec.TargetPorts) == 0 {
		return bad("spec.targetPorts is empty")
	}
	for _, tp := range ip.Spec.TargetPorts {
		if tp.Number < 1 || tp.Number > 65535 {
			return bad("spec.targetPorts: %d is not a port", tp.Number)
		}
		p.TargetPorts = append(p.TargetPorts, int32(tp.Number))
	}
	if len(ip.Spec.Selector.MatchLabels) == 0 {
		return bad("spec.selector.matchLabels is empty")
	}
	p.Selector = make(map[string]string, len(ip.Spec.Selector.MatchLabels))
	for k, v := range ip.Spec.Selector.MatchLabels {
		p.Selector[string(k)] = string(v)
	}
	ref := ip.Spec.EndpointPickerRef
	switch {
	case ref == nil || ref.Name == "":
		return bad("spec.endpointPickerRef is required (the extension routes every request through the pool's endpoint picker)")
	case ref.Group != nil && *ref.Group != "":
		return bad("spec.endpointPickerRef.group %q: only a core Service is supported", *ref.Group)
	case ref.Kind != "" && ref.Kind != "Service":
		return bad("spec.endpointPickerRef.kind %q: only Service is supported", ref.Kind)
	}
	p.EPPService, p.EPPPort = string(ref.Name), DefaultEPPPort
	if ref.Port != nil {
		if ref.Port.Number < 1 || ref.Port.Number > 65535 {
			return bad("spec.endpointPickerRef.port %d is not a port", ref.Port.Number)
		}
		p.EPPPort = uint32(ref.Port.Number)
	}
	switch ref.FailureMode {
	case inferencev1.EndpointPickerFailOpen:
		p.FailOpen = true
	case "", inferencev1.EndpointPickerFailClose:
	default:
		return bad("spec.endpointPickerRef.failureMode %q: want FailOpen or FailClose", ref.FailureMode)
	}
	switch v := ip.Annotations[ResponseBodyAnnotation]; v {
	case "streamed":
		p.ResponseBody = true
	case "", "none":
	default:
		return bad("annotation %s %q: want streamed or none", ResponseBodyAnnotation, v)
	}
	switch v := ip.Annotations[PlaintextAnnotation]; v {
	case "true":
		p.Plaintext = true
	case "", "false":
	default:
		return bad("annotation %s %q: want true or false", PlaintextAnnotation, v)
	}
	switch v := ip.Annotations[HealthCheckAnnotation]; v {
	case "", xdsbuild.HealthGRPC:
		p.HealthCheck = xdsbuild.HealthGRPC
	case xdsbuild.HealthTCP:
		p.HealthCheck = xdsbuild.HealthTCP
	default:
		return bad("annotation %s %q: want %s or %s", HealthCheckAnnotation, v, xdsbuild.HealthGRPC, xdsbuild.HealthTCP)
	}
	return p, nil
}
