package wasmtest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

const i32, i64 = api.ValueTypeI32, api.ValueTypeI64

type hostFunc struct {
	params []api.ValueType
	fn     api.GoModuleFunc
}

// envFunctions are the env.proxy_* imports this host implements, with the signatures the Go SDK
// declares in proxywasm/internal/abi_hostcalls.go. Every parameter is i32 except the metric values.
func (h *Host) envFunctions() map[string]hostFunc {
	p := func(n int) []api.ValueType { return slices.Repeat([]api.ValueType{i32}, n) }
	return map[string]hostFunc{
		"proxy_log":                          {p(3), h.proxyLog},
		"proxy_get_log_level":                {p(1), h.proxyGetLogLevel},
		"proxy_get_current_time_nanoseconds": {p(1), h.proxyGetCurrentTime},
		"proxy_set_tick_period_milliseconds": {p(1), h.proxySetTickPeriod},
		"proxy_get_buffer_bytes":             {p(5), h.proxyGetBufferBytes},
		"proxy_set_buffer_bytes":             {p(5), h.proxySetBufferBytes},
		"proxy_get_header_map_pairs":         {p(3), h.proxyGetHeaderMapPairs},
		"proxy_set_header_map_pairs":         {p(3), h.proxySetHeaderMapPairs},
		"proxy_get_header_map_value":         {p(5), h.proxyGetHeaderMapValue},
		"proxy_replace_header_map_value":     {p(5), h.proxyReplaceHeaderMapValue},
		"proxy_add_header_map_value":         {p(5), h.proxyAddHeaderMapValue},
		"proxy_remove_header_map_value":      {p(3), h.proxyRemoveHeaderMapValue},
		"proxy_send_local_response":          {p(8), h.proxySendLocalResponse},
		"proxy_continue_stream":              {p(1), h.proxyContinueStream},
		"proxy_close_stream":                 {p(1), h.proxyCloseStream},
		"proxy_get_property":                 {p(4), h.proxyGetProperty},
		"proxy_set_property":                 {p(4), h.proxySetProperty},
		"proxy_call_foreign_function":        {p(6), h.proxyCallForeignFunction},
		"proxy_define_metric":                {p(4), h.proxyDefineMetric},
		"proxy_increment_metric":             {[]api.ValueType{i32, i64}, h.proxyIncrementMetric},
		"proxy_record_metric":                {[]api.ValueType{i32, i64}, h.proxyRecordMetric},
		"proxy_get_metric":                   {p(2), h.proxyGetMetric},
		"proxy_get_shared_data":              {p(5), h.proxyGetSharedData},
		"proxy_set_shared_data":              {p(5), h.proxySetSharedData},
		"proxy_done":                         {p(0), h.proxyDone},
		"proxy_set_effective_context":        {p(1), h.proxySetEffectiveContext},
	}
}

// instantiateImports provides env and, so that any plugin links, an Unimplemented stub for every
// other function the module imports from a module this host does not know (WASI aside). The Go
// linker drops unused wasmimports, so which stubs appear depends on the plugin.
func (h *Host) instantiateImports(ctx context.Context, compiled wazero.CompiledModule) error {
	builders := map[string]wazero.HostModuleBuilder{"env": h.rt.NewHostModuleBuilder("env")}
	implemented := h.envFunctions()
	for name, f := range implemented {
		builders["env"].NewFunctionBuilder().
			WithGoModuleFunction(h.faulty(name, f.fn), f.params, []api.ValueType{i32}).
			Export(name)
	}
	for _, def := range compiled.ImportedFunctions() {
		module, name, _ := def.Import()
		if module == "wasi_snapshot_preview1" {
			continue
		}
		if _, ok := implemented[name]; ok && module == "env" {
			continue
		}
		b, ok := builders[module]
		if !ok {
			b = h.rt.NewHostModuleBuilder(module)
			builders[module] = b
		}
		b.NewFunctionBuilder().
			WithGoModuleFunction(unimplemented(len(def.ResultTypes())), def.ParamTypes(), def.ResultTypes()).
			Export(name)
	}
	for module, b := range builders {
		if _, err := b.Instantiate(ctx); err != nil {
			return fmt.Errorf("wasmtest: instantiating host module %s: %w", module, err)
		}
	}
	return nil
}

// faulty wraps a host function with Options.Fault.
func (h *Host) faulty(name string, fn api.GoModuleFunc) api.GoModuleFunc {
	fault := h.opts.Fault
	if fault == nil {
		return fn
	}
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		if st := fault(name); st != 0 {
			ret(stack, status(st))
			return
		}
		fn(ctx, mod, stack)
	}
}

func unimplemented(results int) api.GoModuleFunc {
	return func(_ context.Context, _ api.Module, stack []uint64) {
		if results > 0 {
			clear(stack[:results])
			stack[0] = uint64(statusUnimplemented)
		}
	}
}

// ret stores a host call's status in the result slot.
func ret(stack []uint64, s status) { stack[0] = uint64(s) }

func (h *Host) proxyLog(_ context.Context, mod api.Module, stack []uint64) {
	level := u32(stack[0])
	msg, ok := readString(mod, u32(stack[1]), u32(stack[2]))
	switch {
	case !ok:
		ret(stack, statusInvalidMemoryAccess)
	case level > 5:
		ret(stack, statusBadArgument)
	default:
		h.logs.add(logLevelName(level), msg)
		ret(stack, statusOK)
	}
}

// proxyGetLogLevel reports trace so that plugins which check the level log everything: a test wants
// to see all of it, where Envoy would report its configured level (info by default).
func (h *Host) proxyGetLogLevel(_ context.Context, mod api.Module, stack []uint64) {
	if !writeU32(mod, u32(stack[0]), 0) {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	ret(stack, statusOK)
}

func (h *Host) proxyGetCurrentTime(_ context.Context, mod api.Module, stack []uint64) {
	if !writeU64(mod, u32(stack[0]), uint64(h.now().UnixNano())) {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	ret(stack, statusOK)
}

func (h *Host) proxySetTickPeriod(_ context.Context, _ api.Module, stack []uint64) {
	h.tickPeriod = time.Duration(u32(stack[0])) * time.Millisecond
	ret(stack, statusOK)
}

func (h *Host) proxyDone(_ context.Context, _ api.Module, stack []uint64) {
	h.doneCalls++
	ret(stack, statusOK)
}

func (h *Host) proxySetEffectiveContext(_ context.Context, _ api.Module, stack []uint64) {
	id := u32(stack[0])
	if _, ok := h.streams[id]; !ok && id != rootContextID {
		ret(stack, statusBadArgument)
		return
	}
	h.active = id
	ret(stack, statusOK)
}

// activeStream is the stream the current call runs for, or nil for the root context.
func (h *Host) activeStream() *Stream {
	return h.streams[h.active]
}
