package wasmtest

import (
	"context"

	"github.com/tetratelabs/wazero/api"
)

func (h *Host) proxyGetProperty(ctx context.Context, mod api.Module, stack []uint64) {
	path, ok := readString(mod, u32(stack[0]), u32(stack[1]))
	if !ok {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	v, found := h.properties[path]
	if !found {
		ret(stack, statusNotFound)
		return
	}
	ret(stack, h.returnBytes(ctx, mod, v, u32(stack[2]), u32(stack[3])))
}

func (h *Host) proxySetProperty(_ context.Context, mod api.Module, stack []uint64) {
	path, ok1 := readString(mod, u32(stack[0]), u32(stack[1]))
	value, ok2 := readBytes(mod, u32(stack[2]), u32(stack[3]))
	if !ok1 || !ok2 {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	h.properties[path] = value
	ret(stack, statusOK)
}

// proxyCallForeignFunction knows only clear_route_cache, which in Envoy re-picks the route after a
// header change and returns no data; like proxy-wasm-cpp-host it still writes (0, 0) to the
// out-parameters. Unknown names are NotFound, as in Envoy.
func (h *Host) proxyCallForeignFunction(_ context.Context, mod api.Module, stack []uint64) {
	name, ok := readString(mod, u32(stack[0]), u32(stack[1]))
	if _, argsOK := view(mod, u32(stack[2]), u32(stack[3])); !ok || !argsOK {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	h.foreign[name]++
	if name != "clear_route_cache" {
		ret(stack, statusNotFound)
		return
	}
	if s := h.activeStream(); s != nil {
		s.routeCacheCleared++
	}
	if ptrPtr, sizePtr := u32(stack[4]), u32(stack[5]); (ptrPtr != 0 && !writeU32(mod, ptrPtr, 0)) ||
		(sizePtr != 0 && !writeU32(mod, sizePtr, 0)) {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	ret(stack, statusOK)
}

func (h *Host) proxyDefineMetric(_ context.Context, mod api.Module, stack []uint64) {
	name, ok := readString(mod, u32(stack[1]), u32(stack[2]))
	if !ok {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	id, st := h.metrics.define(metricType(u32(stack[0])), name)
	if st == statusOK && !writeU32(mod, u32(stack[3]), id) {
		st = statusInvalidMemoryAccess
	}
	ret(stack, st)
}

// The metric value parameters are real i64s, so they are not masked.
func (h *Host) proxyIncrementMetric(_ context.Context, _ api.Module, stack []uint64) {
	ret(stack, h.metrics.increment(u32(stack[0]), int64(stack[1])))
}

func (h *Host) proxyRecordMetric(_ context.Context, _ api.Module, stack []uint64) {
	ret(stack, h.metrics.record(u32(stack[0]), stack[1]))
}

func (h *Host) proxyGetMetric(_ context.Context, mod api.Module, stack []uint64) {
	v, st := h.metrics.get(u32(stack[0]))
	if st == statusOK && !writeU64(mod, u32(stack[1]), v) {
		st = statusInvalidMemoryAccess
	}
	ret(stack, st)
}

func (h *Host) proxyGetSharedData(ctx context.Context, mod api.Module, stack []uint64) {
	key, ok := readString(mod, u32(stack[0]), u32(stack[1]))
	if !ok {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	v, found := h.shared.get(key)
	if !found {
		ret(stack, statusNotFound)
		return
	}
	if !writeU32(mod, u32(stack[4]), v.cas) {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	ret(stack, h.returnBytes(ctx, mod, v.data, u32(stack[2]), u32(stack[3])))
}

func (h *Host) proxySetSharedData(_ context.Context, mod api.Module, stack []uint64) {
	key, ok1 := readString(mod, u32(stack[0]), u32(stack[1]))
	value, ok2 := view(mod, u32(stack[2]), u32(stack[3]))
	if !ok1 || !ok2 {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	ret(stack, h.shared.set(key, value, u32(stack[4])))
}
