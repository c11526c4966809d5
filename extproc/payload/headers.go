package payload

import (
	"maps"
	"slices"

	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/policy"
)

// clientHeadersToRemove lists the request headers that must not reach the
// upstream as the client sent them (policy.RequestHeadersToRemove: the
// processor's own and those that steer the endpoint pick), leaving out
// the ones set in the same mutation: overwriting them is enough, and the
// result then does not depend on the order a proxy applies removals and
// sets in.
func clientHeadersToRemove(sent server.Headers, set []server.Header) []string {
	remove := policy.RequestHeadersToRemove(maps.Keys(sent))
	return slices.DeleteFunc(remove, func(name string) bool {
		return slices.ContainsFunc(set, func(h server.Header) bool { return h.Name == name })
	})
}
