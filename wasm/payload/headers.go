package main

import (
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

	"github.com/infergate/infergate/inference/policy"
)

// stripClientHeaders removes the request headers a client may not send
// (policy.RequestHeadersToRemove, the rule the ext_proc processor applies
// too): the plugin's own, and those that steer the endpoint pick, which
// the picker after this filter would obey. It runs on the request headers,
// before the plugin sets any, so what it sets later is its own. It reports
// false when a host call failed and the request was refused instead: a
// steering header left in place would pick the upstream.
func (s *stream) stripClientHeaders() bool {
	sent, err := proxywasm.GetHttpRequestHeaders()
	if err != nil {
		s.fail("reading the request headers", err)
		return false
	}
	names := func(yield func(string) bool) {
		for _, h := range sent {
			if !yield(h[0]) {
				return
			}
		}
	}
	for _, name := range policy.RequestHeadersToRemove(names) {
		if err := proxywasm.RemoveHttpRequestHeader(name); err != nil {
			s.fail("removing the client's "+name, err)
			return false
		}
	}
	return true
}
