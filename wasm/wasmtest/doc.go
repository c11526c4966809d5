// Package wasmtest is a test stand-in for Envoy's Wasm HTTP filter: a proxy-wasm ABI 0.2.x host on
// wazero that loads a plugin built by the standard Go toolchain (GOOS=wasip1, -buildmode=c-shared,
// github.com/proxy-wasm/proxy-wasm-go-sdk) and drives it call by call the way Envoy does, so that a
// plugin's behaviour can be tested in `go test` without an Envoy binary.
//
// What it reproduces from Envoy (source/extensions/common/wasm and proxy-wasm-cpp-host):
//   - Start-up: WASI reactor `_initialize`, the proxy_abi_version_0_2_* export check,
//     proxy_on_context_create(root, 0), proxy_on_vm_start, proxy_on_configure; a false return fails Load.
//     The plugin and VM configuration buffers are readable only during start-up, as in Envoy.
//   - Per stream: proxy_on_context_create(id, root), the request and response header/body/trailer
//     callbacks, then proxy_on_done, proxy_on_log, proxy_on_delete.
//   - Body buffering: after a body callback returns Pause (StopIterationAndBuffer) the next chunk is
//     appended to the buffered body and the callback sees the total buffered size; after Continue the
//     buffered data goes upstream and the next callback sees only the new chunk.
//   - Headers go upstream when a callback in that direction first returns Continue. Header changes
//     made after that are not forwarded (the accessors return the snapshot), which is what happens
//     in Envoy and a classic plugin bug.
//   - Header maps: keys lowercased, get returns the first value, replace keeps one entry, remove
//     removes all; proxy_set_buffer_bytes accepts exactly the three forms Envoy's Buffer::copyFrom
//     does (replace all, prepend, append) and returns BadArgument for the ranges the spec allows but
//     Envoy rejects.
//   - Memory handed to the guest is allocated by its proxy_on_memory_allocate export, re-entrantly;
//     empty results are written as a null pointer and size 0 without allocating.
//   - WASI stdout and stderr become log lines at info and error, as proxy-wasm-cpp-host does, so a
//     Go panic in the guest shows up in Logs.
//   - The clear_route_cache foreign function (Envoy needs it after header changes since 1.33).
//
// What it does not do: outbound HTTP/gRPC calls, shared queues, timers (the tick period is recorded,
// proxy_on_tick is never called), TCP filters, flow control and watermarks, buffer limits (no 413),
// routing, Envoy's own headers (x-request-id, x-forwarded-*), running a local reply back through the
// response callbacks, or more than one VM and one worker thread. Actions other than Continue (0) and
// Pause (1) are reported as errors rather than emulated. Imports it does not implement return
// Unimplemented (12), so any plugin links.
//
// Options.Fault makes chosen host calls return an error status without acting, so that a plugin's
// handling of failed host calls can be tested; the host itself never fails a valid call.
//
// Soak tests should load the plugin with Options.Clock set to SteppingClock: the Go wasip1 heap
// runaway that runtime.Gosched() in OnHttpStreamDone prevents appears only when guest time runs
// fast, and real clocks hide it in a test-length run.
//
// A Host is safe for concurrent use; calls into the guest are serialised, as on one Envoy worker.
package wasmtest
