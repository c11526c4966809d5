package wasmtest

import (
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/sys"
)

// SteppingClock returns a clock for Options.Clock that starts at start and advances by step on
// every reading, like wazero's default fake clock (1 ms per reading) that the SDK's proxytest
// bridge runs plugins with.
//
// Soak tests want it. With Go 1.26 wasip1 plugins the heap runaway that runtime.Gosched() at the
// end of each stream prevents shows up only when guest time runs fast relative to the work
// done: a step of 1 ms took a plugin without the Gosched past 200 MiB within 2,600 requests of
// 64 KiB, and 300 µs past 80 MiB within 6,000, while real clocks kept the same plugin at 7.8 MiB
// over 20,000 requests (and so did jumps of minutes between requests). A soak test with real
// clocks cannot tell whether a plugin has the Gosched.
func SteppingClock(start time.Time, step time.Duration) func() time.Time {
	var n atomic.Int64
	return func() time.Time {
		return start.Add(time.Duration(n.Add(1)) * step)
	}
}

// withClock gives the guest real clocks, or Options.Clock. Never wazero's defaults: their fake
// clocks advance 1 ms per reading, which changes how the Go runtime in the guest behaves (above).
func (h *Host) withClock(cfg wazero.ModuleConfig) wazero.ModuleConfig {
	if h.opts.Clock == nil {
		return cfg.WithSysWalltime().WithSysNanotime()
	}
	start := h.opts.Clock()
	return cfg.
		WithWalltime(func() (int64, int32) {
			t := h.opts.Clock()
			return t.Unix(), int32(t.Nanosecond())
		}, sys.ClockResolution(time.Microsecond)).
		WithNanotime(func() int64 { return int64(h.opts.Clock().Sub(start)) }, sys.ClockResolution(1))
}

func (h *Host) now() time.Time {
	if h.opts.Clock != nil {
		return h.opts.Clock()
	}
	return time.Now()
}
