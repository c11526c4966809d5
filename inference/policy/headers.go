package policy

import (
	"iter"
	"slices"
	"strings"

	"github.com/infergate/infergate/inference/wire"
)

// steeringHeaders pick or narrow the upstream: the picker's answer and
// subset hint (and every other x-gateway-destination-endpoint* name, which
// the data plane and the picker may read), and the selection its testing
// filter obeys. Only the picker and the proxy may set them, after this
// processor; a client's copy would choose its own endpoint.
var steeringHeaders = []string{wire.DestinationEndpointKey, wire.SubsetKey, wire.ServedEndpointKey, wire.EndpointSelectionHeader}

// StripsRequestHeader reports whether a request header the client sent
// must be removed before the request goes on: the processor's own headers
// (OwnHeaders) and the headers that steer the endpoint pick. Names are
// compared case-insensitively.
func StripsRequestHeader(name string) bool {
	name = strings.ToLower(name)
	switch name {
	case wire.ModelNameHeader, wire.BaseModelNameHeader, wire.MaskedHeader, wire.EndpointSelectionHeader:
		return true
	}
	return strings.HasPrefix(name, wire.DestinationEndpointKey)
}

// RequestHeadersToRemove returns the request headers both deliveries
// remove from every request they pass on, given the names the client sent:
// OwnHeaders and the steering headers whether sent or not (a proxy may
// hide a header from the processor yet forward it), and every other sent
// name StripsRequestHeader selects. Names are lower-case, sorted and
// unique, so the mutation does not depend on header order.
func RequestHeadersToRemove(sent iter.Seq[string]) []string {
	out := append(OwnHeaders(), steeringHeaders...)
	if sent != nil {
		for name := range sent {
			if StripsRequestHeader(name) {
				out = append(out, strings.ToLower(name))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
