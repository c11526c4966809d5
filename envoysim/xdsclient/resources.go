package xdsclient

import (
	"fmt"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// decodeResources unwraps DiscoveryResponse.resources and checks that each
// is of the response's type_url, which Envoy requires of a SotW response.
// Bodiless envoy.service.discovery.v3.Resource wrappers are TTL heartbeats;
// they are counted, not returned.
func decodeResources(typeURL string, in []*anypb.Any) (out []*anypb.Any, heartbeats int, err error) {
	out = make([]*anypb.Any, 0, len(in))
	for i, a := range in {
		if a.GetTypeUrl() == wrapperType {
			var w discoveryv3.Resource
			if err := a.UnmarshalTo(&w); err != nil {
				return nil, 0, fmt.Errorf("resource %d: decode %s: %w", i, wrapperType, err)
			}
			if w.GetResource() == nil {
				heartbeats++
				continue
			}
			a = w.GetResource()
		}
		if a.GetTypeUrl() != typeURL {
			return nil, 0, fmt.Errorf("resource %d is a %s in a response of type %s", i, a.GetTypeUrl(), typeURL)
		}
		out = append(out, a)
	}
	if heartbeats > 0 && len(out) > 0 {
		// In SotW a resource missing from a response is deleted; handing the
		// handler the bodied ones alone would drop the heartbeated ones.
		return nil, 0, fmt.Errorf("response mixes %d TTL heartbeats with %d resources; the stand-in cannot apply that as state of the world", heartbeats, len(out))
	}
	return out, heartbeats, nil
}
