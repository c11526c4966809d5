// Command payload is the payload processor as a proxy-wasm HTTP filter:
// the same decision as `infergate payload` (inference/policy), run inside
// the proxy. Build it with `make wasm`; configure it with the same fields
// as the processor's YAML file, as JSON in the plugin configuration.
//
// Request path only: it holds the request headers, buffers the body to
// its end (Envoy's per-request buffer limit applies first), then sets
// X-Gateway-Model-Name and X-Gateway-Base-Model-Name, replaces the body
// when masking or clamping changed it (fixing content-length), calls
// clear_route_cache so the new headers take part in routing, or answers
// with the error instead. Token usage from responses is reported only by
// the ext_proc processor: proxy-wasm cannot write dynamic metadata.
package main

import (
	"runtime"
	"strconv"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/infergate/infergate/inference/policy"
)

func main() {}

func init() {
	proxywasm.SetPluginContext(func(uint32) types.PluginContext { return &plugin{} })
}

type plugin struct {
	types.DefaultPluginContext
	policy *policy.Policy
}

// OnPluginStart compiles the configuration; an invalid one fails the start
// so the proxy refuses the filter instead of running without guardrails.
func (p *plugin) OnPluginStart(int) types.OnPluginStartStatus {
	raw, err := proxywasm.GetPluginConfiguration()
	if err != nil && err != types.ErrorStatusNotFound {
		proxywasm.LogCriticalf("infergate payload: reading the plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	cfg, err := policy.DecodeJSON(raw)
	if err == nil {
		p.policy, err = policy.Compile(cfg)
	}
	if err != nil {
		proxywasm.LogCriticalf("infergate payload: plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	return types.OnPluginStartStatusOK
}

func (p *plugin) NewHttpContext(uint32) types.HttpContext { return &stream{policy: p.policy} }

type stream struct {
	types.DefaultHttpContext
	policy   *policy.Policy
	answered bool
}

// OnHttpRequestHeaders holds the headers until the body is in, so the
// model headers can still be set and content-length fixed.
func (s *stream) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	if endOfStream {
		// No body: nothing to read, and no client copy of the model
		// headers may stand in.
		for _, h := range policy.OwnHeaders() {
			logErr(proxywasm.RemoveHttpRequestHeader(h))
		}
		return types.ActionContinue
	}
	return types.ActionPause
}

func (s *stream) OnHttpRequestBody(size int, endOfStream bool) types.Action {
	if s.answered {
		return types.ActionPause
	}
	if r := s.policy.CheckSize(size); r != nil {
		s.reply(r)
		return types.ActionPause
	}
	if !endOfStream {
		return types.ActionPause
	}
	body, err := proxywasm.GetHttpRequestBody(0, size)
	if err != nil {
		proxywasm.LogErrorf("infergate payload: reading the request body: %v", err)
		return types.ActionContinue
	}
	res := s.policy.Apply(body)
	if res.Reject != nil {
		s.reply(res.Reject)
		return types.ActionPause
	}
	for _, h := range res.Headers() {
		logErr(proxywasm.ReplaceHttpRequestHeader(h[0], h[1]))
	}
	if len(res.Masked) == 0 {
		// A client must not be able to claim its prompt was masked.
		logErr(proxywasm.RemoveHttpRequestHeader(policy.MaskedHeader))
	}
	if res.Body != nil {
		logErr(proxywasm.ReplaceHttpRequestBody(res.Body))
		if _, err := proxywasm.GetHttpRequestHeader("content-length"); err == nil {
			logErr(proxywasm.ReplaceHttpRequestHeader("content-length", strconv.Itoa(len(res.Body))))
		}
	}
	// Since Envoy 1.33 a Wasm filter's header changes do not re-pick the
	// route unless it asks.
	if _, err := proxywasm.CallForeignFunction("clear_route_cache", nil); err != nil {
		proxywasm.LogWarnf("infergate payload: clear_route_cache: %v (the proxy may route on stale headers)", err)
	}
	return types.ActionContinue
}

func (s *stream) reply(r *policy.Rejection) {
	s.answered = true
	headers, body := r.Response()
	logErr(proxywasm.SendHttpResponse(uint32(r.Status), headers, body, -1))
}

// OnHttpStreamDone yields once per request: without it the Go wasip1
// runtime's collector can stop completing cycles and the guest heap grows
// without bound (see the soak test).
func (s *stream) OnHttpStreamDone() { runtime.Gosched() }

func logErr(err error) {
	if err != nil {
		proxywasm.LogErrorf("infergate payload: host call failed: %v", err)
	}
}
