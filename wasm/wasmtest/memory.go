package wasmtest

import (
	"context"
	"fmt"

	"github.com/tetratelabs/wazero/api"
)

// u32 masks a parameter to its 32 bits: wazero leaves the upper half of an i32 in the uint64 stack
// slot undefined.
func u32(v uint64) uint32 { return uint32(v) }

// view returns guest memory without copying. The slice is only valid until the guest runs again or
// its memory grows, so anything that outlives the next allocation must be copied first.
func view(mod api.Module, ptr, size uint32) ([]byte, bool) {
	mem := mod.Memory()
	if mem == nil {
		return nil, false
	}
	return mem.Read(ptr, size)
}

func readString(mod api.Module, ptr, size uint32) (string, bool) {
	b, ok := view(mod, ptr, size)
	return string(b), ok
}

func readBytes(mod api.Module, ptr, size uint32) ([]byte, bool) {
	b, ok := view(mod, ptr, size)
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}

func writeU32(mod api.Module, ptr, v uint32) bool {
	mem := mod.Memory()
	return mem != nil && mem.WriteUint32Le(ptr, v)
}

func writeU64(mod api.Module, ptr uint32, v uint64) bool {
	mem := mod.Memory()
	return mem != nil && mem.WriteUint64Le(ptr, v)
}

// returnBytes hands data to the guest the way proxy-wasm-cpp-host's copyToPointerSize does: allocate
// with the guest's proxy_on_memory_allocate (a re-entrant call into the module), copy, then write
// the pointer and size to the out-parameters. Empty data is written as (0, 0) without allocating;
// the Go SDK's allocator would panic on make([]byte, 0)[0].
//
// Each host call must allocate at most once: until the call returns the guest holds no reference to
// the block, so a GC triggered by a second allocation could free the first.
func (h *Host) returnBytes(ctx context.Context, mod api.Module, data []byte, ptrPtr, sizePtr uint32) status {
	var ptr uint32
	if len(data) > 0 {
		ptr = h.allocate(ctx, uint32(len(data)))
		if ptr == 0 || !mod.Memory().Write(ptr, data) {
			return statusInvalidMemoryAccess
		}
	}
	if !writeU32(mod, ptrPtr, ptr) || !writeU32(mod, sizePtr, uint32(len(data))) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

// allocate calls the guest's allocator. If that call fails the guest is dead (it trapped or
// exited), so it panics: wazero turns a host-function panic into an error from the outer guest call,
// which is where the failure belongs.
func (h *Host) allocate(ctx context.Context, size uint32) uint32 {
	stack := []uint64{uint64(size)}
	if err := h.fn.alloc.CallWithStack(ctx, stack); err != nil {
		panic(fmt.Errorf("proxy_on_memory_allocate(%d): %w", size, err))
	}
	return u32(stack[0])
}
