// Command plugin is the proxy-wasm plugin the wasmtest host tests drive. It lives under testdata so
// that `go vet ./...` and `go test ./...` skip it; the tests build it with GOOS=wasip1.
//
// Behaviour, all keyed off the plugin configuration (JSON):
//   - request headers: sets x-num-headers to the header count the host passed; answers 403 with a JSON
//     body when :path equals reject_path; pauses when a body follows (and drops content-length,
//     because the body will change) so that the body can be rewritten before anything goes upstream.
//   - request body: waits for end of stream, then sets <header> to the body length and x-body-sizes to
//     the sizes the host reported on each call, replaces the body with its upper-case form plus suffix,
//     and calls clear_route_cache because a header changed.
//   - response: tags the headers and wraps the body in brackets using prepend and append.
//   - stream done: runtime.Gosched(), without which the Go wasip1 GC stops completing (see wasm.md).
//
// Request headers switch on modes the host tests need: x-wasmtest-stream: 1 lets the headers through
// and continues on every body chunk (upper-casing it), setting x-late from the body callback, too
// late to reach upstream;
// x-wasmtest-keep-content-length: 1 keeps content-length although the body changes;
// x-wasmtest-hold: 1 pauses at end of stream and never answers.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

func main() {}

func init() {
	proxywasm.SetPluginContext(func(uint32) types.PluginContext { return &plugin{} })
}

type config struct {
	Header     string `json:"header"`
	RejectPath string `json:"reject_path"`
	Suffix     string `json:"suffix"`
	// SkipGosched leaves out the runtime.Gosched() call, to show the soak test failing without it.
	SkipGosched bool `json:"skip_gosched"`
}

type plugin struct {
	types.DefaultPluginContext
	cfg      config
	requests proxywasm.MetricCounter
}

func (p *plugin) OnPluginStart(int) types.OnPluginStartStatus {
	raw, err := proxywasm.GetPluginConfiguration()
	if err != nil {
		proxywasm.LogCriticalf("reading plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	if err := json.Unmarshal(raw, &p.cfg); err != nil {
		proxywasm.LogCriticalf("parsing plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	if p.cfg.Header == "" {
		proxywasm.LogCritical("plugin configuration: header is required")
		return types.OnPluginStartStatusFailed
	}
	if name, err := proxywasm.GetProperty([]string{"plugin_name"}); err == nil {
		proxywasm.LogInfof("plugin_name=%s", name)
	} else {
		proxywasm.LogInfof("plugin_name: %v", err)
	}
	p.requests = proxywasm.DefineCounterMetric("wasmtest_requests_total")
	// Host features the tests check through the log: a call the host stubs, shared data, ticks.
	if _, err := proxywasm.RegisterSharedQueue("wasmtest"); err != nil {
		proxywasm.LogInfof("shared queue: %v", err)
	}
	must(proxywasm.SetSharedData("started", []byte("yes"), 0))
	if v, cas, err := proxywasm.GetSharedData("started"); err == nil {
		proxywasm.LogInfof("shared data started=%s cas=%d", v, cas)
	}
	must(proxywasm.SetTickPeriodMilliSeconds(5000))
	proxywasm.LogInfof("started: header=%s reject_path=%s", p.cfg.Header, p.cfg.RejectPath)
	return types.OnPluginStartStatusOK
}

func (p *plugin) NewHttpContext(id uint32) types.HttpContext {
	return &stream{id: id, p: p}
}

type stream struct {
	types.DefaultHttpContext
	id              uint32
	p               *plugin
	sizes           []string
	streaming, hold bool
}

func (s *stream) OnHttpRequestHeaders(numHeaders int, endOfStream bool) types.Action {
	s.p.requests.Increment(1)
	must(proxywasm.ReplaceHttpRequestHeader("x-num-headers", strconv.Itoa(numHeaders)))
	path, err := proxywasm.GetHttpRequestHeader(":path")
	if err != nil {
		proxywasm.LogErrorf("reading :path: %v", err)
	}
	if s.p.cfg.RejectPath != "" && path == s.p.cfg.RejectPath {
		body := fmt.Sprintf(`{"error":"denied","path":%q}`, path)
		must(proxywasm.SendHttpResponse(403, [][2]string{
			{"content-type", "application/json"},
			{"x-rejected-by", "wasmtest"},
		}, []byte(body), -1))
		return types.ActionPause
	}
	s.streaming = flag("x-wasmtest-stream")
	s.hold = flag("x-wasmtest-hold")
	if endOfStream {
		return types.ActionContinue
	}
	if !flag("x-wasmtest-keep-content-length") {
		must(proxywasm.RemoveHttpRequestHeader("content-length"))
	}
	if s.streaming {
		return types.ActionContinue
	}
	return types.ActionPause
}

func (s *stream) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	s.sizes = append(s.sizes, strconv.Itoa(bodySize))
	if s.streaming {
		chunk, err := proxywasm.GetHttpRequestBody(0, bodySize)
		if err != nil {
			proxywasm.LogErrorf("reading request body chunk: %v", err)
		}
		proxywasm.LogDebugf("stream %d: body chunk size=%d eos=%t", s.id, bodySize, endOfStream)
		must(proxywasm.ReplaceHttpRequestBody(bytes.ToUpper(chunk)))
		must(proxywasm.ReplaceHttpRequestHeader("x-late", "1"))
		return types.ActionContinue
	}
	if !endOfStream || s.hold {
		return types.ActionPause
	}
	body, err := proxywasm.GetHttpRequestBody(0, bodySize)
	if err != nil {
		proxywasm.LogErrorf("reading request body: %v", err)
		return types.ActionContinue
	}
	must(proxywasm.ReplaceHttpRequestHeader(s.p.cfg.Header, strconv.Itoa(len(body))))
	must(proxywasm.ReplaceHttpRequestHeader("x-body-sizes", strings.Join(s.sizes, ",")))
	out := append(bytes.ToUpper(body), s.p.cfg.Suffix...)
	must(proxywasm.ReplaceHttpRequestBody(out))
	if _, err := proxywasm.CallForeignFunction("clear_route_cache", nil); err != nil {
		proxywasm.LogErrorf("clear_route_cache: %v", err)
	}
	return types.ActionContinue
}

func (s *stream) OnHttpResponseHeaders(_ int, endOfStream bool) types.Action {
	must(proxywasm.AddHttpResponseHeader("x-wasmtest", "seen"))
	if !endOfStream {
		must(proxywasm.RemoveHttpResponseHeader("content-length"))
	}
	return types.ActionContinue
}

func (s *stream) OnHttpResponseBody(_ int, endOfStream bool) types.Action {
	if !endOfStream {
		return types.ActionPause
	}
	must(proxywasm.PrependHttpResponseBody([]byte("[")))
	must(proxywasm.AppendHttpResponseBody([]byte("]")))
	return types.ActionContinue
}

func (s *stream) OnHttpStreamDone() {
	proxywasm.LogDebugf("stream %d done", s.id)
	if !s.p.cfg.SkipGosched {
		runtime.Gosched()
	}
}

func flag(name string) bool {
	v, err := proxywasm.GetHttpRequestHeader(name)
	return err == nil && v == "1"
}

// must logs host errors: a plugin should never panic on one, and the tests read the log.
func must(err error) {
	if err != nil {
		proxywasm.LogErrorf("host call failed: %v", err)
	}
}
