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
// with the error instead. Trailers end a request that has them: the
// decision is then made there, on the buffered body. A request whose body
// turns out empty (chunked 0\r\n\r\n, trailers alone) is a request
// without a body, as for the ext_proc processor: it passes, minus any
// client copy of the plugin's headers. If a host call that reads or
// changes the request fails, the plugin answers 500 processing-failed
// rather than let the request go on with the client's own model headers
// or an unmasked body. Token usage from responses is reported only by
// the ext_proc processor: proxy-wasm cannot write dynamic metadata.
package main

import (
	"runtime"
	"strconv"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/infergate/infergate/inference/policy"
	"github.com/infergate/infergate/inference/wire"
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
	size     int // the body buffered so far
}

// OnHttpRequestHeaders drops the client headers that may not go on, then
// holds the headers until the body is in, so the model headers can still
// be set and content-length fixed.
func (s *stream) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	if !s.stripClientHeaders() {
		return types.ActionPause
	}
	if endOfStream {
		return s.bodiless()
	}
	return types.ActionPause
}

func (s *stream) OnHttpRequestBody(size int, endOfStream bool) types.Action {
	if s.answered {
		return types.ActionPause
	}
	s.size = size
	if r := s.policy.CheckSize(size); r != nil {
		s.reply(r)
		return types.ActionPause
	}
	if !endOfStream {
		return types.ActionPause
	}
	if size == 0 {
		// The body turned out empty (chunked 0\r\n\r\n, an empty last
		// DATA frame): a request without one, as the ext_proc processor
		// treats it. Envoy has no bytes to hand over, so reading them
		// would fail.
		return s.bodiless()
	}
	body, err := proxywasm.GetHttpRequestBody(0, size)
	if err != nil {
		return s.fail("reading the request body", err)
	}
	res := s.policy.Apply(body)
	if res.Reject != nil {
		s.reply(res.Reject)
		return types.ActionPause
	}
	for _, h := range res.Headers() {
		if err := proxywasm.ReplaceHttpRequestHeader(h[0], h[1]); err != nil {
			return s.fail("setting "+h[0], err)
		}
	}
	if len(res.Masked) == 0 {
		// A client must not be able to claim its prompt was masked.
		if err := proxywasm.RemoveHttpRequestHeader(wire.MaskedHeader); err != nil {
			return s.fail("removing the client's "+wire.MaskedHeader, err)
		}
	}
	if res.Body != nil {
		if err := proxywasm.ReplaceHttpRequestBody(res.Body); err != nil {
			return s.fail("replacing the request body", err)
		}
		if _, err := proxywasm.GetHttpRequestHeader("content-length"); err == nil {
			if err := proxywasm.ReplaceHttpRequestHeader("content-length", strconv.Itoa(len(res.Body))); err != nil {
				return s.fail("setting content-length", err)
			}
		}
	}
	// Since Envoy 1.33 a Wasm filter's header changes do not re-pick the
	// route unless it asks.
	if _, err := proxywasm.CallForeignFunction("clear_route_cache", nil); err != nil {
		proxywasm.LogWarnf("infergate payload: clear_route_cache: %v (the proxy may route on stale headers)", err)
	}
	return types.ActionContinue
}

// OnHttpRequestTrailers: trailers, not the last body chunk, end a request
// that has them (gRPC-style clients, chunked bodies with trailers), and
// the body callback then never sees its end. The buffered body is still
// readable and replaceable here, so the decision is the same as at the
// end of the body; without this the request would go on undecided, with
// the client's own model headers.
func (s *stream) OnHttpRequestTrailers(int) types.Action {
	return s.OnHttpRequestBody(s.size, true)
}

// bodiless lets a request without a body through (GET /v1/models, or a
// body that turned out empty): nothing to read, nothing to route on, and
// no client copy of the plugin's headers may stand in.
func (s *stream) bodiless() types.Action {
	for _, h := range policy.OwnHeaders() {
		if err := proxywasm.RemoveHttpRequestHeader(h); err != nil {
			return s.fail("removing the client's "+h, err)
		}
	}
	return types.ActionContinue
}

// reasonFailed is the drop reason when a host call failed mid-decision.
const reasonFailed = "processing-failed"

// fail refuses a request the plugin could not finish: a host call failed,
// so going on could forward the client's own model or masked headers, or
// an unmasked body. It answers 500 processing-failed; the request stays
// paused even if that answer cannot be sent (the proxy then times it out).
func (s *stream) fail(what string, err error) types.Action {
	proxywasm.LogErrorf("infergate payload: %s: %v; refusing the request", what, err)
	s.reply(&policy.Rejection{Status: 500, Reason: reasonFailed, Message: "the gateway could not process this request"})
	return types.ActionPause
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
