package wasmtest_test

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/infergate/infergate/wasm/wasmtest"
)

// TestFaultFailsHostCalls: a faulted host call returns the given status to the plugin and does
// nothing; other calls are untouched.
func TestFaultFailsHostCalls(t *testing.T) {
	var faulted atomic.Int32
	h, err := wasmtest.Load(t.Context(), fx.wasm, wasmtest.Options{
		PluginConfig:        []byte(defaultConfig),
		CompilationCacheDir: fx.cacheDir,
		Fault: func(call string) uint32 {
			if call == "proxy_replace_header_map_value" {
				faulted.Add(1)
				return 10 // InternalFailure
			}
			return 0
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(t.Context())
	res, err := h.Do(t.Context(), wasmtest.Request{Path: "/v1/models"})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := header(res.Headers, "x-num-headers"); ok {
		t.Errorf("a faulted replace set x-num-headers=%s", v)
	}
	if v, ok := header(res.Headers, ":path"); !ok || v != "/v1/models" {
		t.Errorf(":path %q, %v: the read was faulted too", v, ok)
	}
	if faulted.Load() != 1 {
		t.Errorf("Fault matched %d calls, want 1", faulted.Load())
	}
	if logs := strings.Join(h.Logs(), "\n"); !strings.Contains(logs, "host call failed: error status returned by host: internal failure") {
		t.Errorf("the plugin did not see the failure; logs:\n%s", logs)
	}
}
