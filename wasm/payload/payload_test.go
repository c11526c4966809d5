package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/inference/policy/policytest"
	"github.com/infergate/infergate/wasm/wasmtest"
)

// plugin builds the .wasm once per test binary; the go build cache makes
// it cheap after the first time on a machine.
type pluginBuild struct {
	once sync.Once
	wasm []byte
	err  error
}

func (b *pluginBuild) get(t testing.TB) []byte {
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "infergate-wasm-")
		if err != nil {
			b.err = err
			return
		}
		defer os.RemoveAll(dir)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out := filepath.Join(dir, "payload.wasm")
		if b.err = wasmtest.Build(ctx, "./wasm/payload", out); b.err == nil {
			b.wasm, b.err = os.ReadFile(out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.wasm
}

// build is shared by the tests of this binary (read-only after once).
var build pluginBuild

func cacheDir(t testing.TB) string {
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(home, ".cache", "infergate", "wazero")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func load(t testing.TB, config []byte, opts wasmtest.Options) *wasmtest.Host {
	t.Helper()
	opts.PluginConfig = config
	opts.CompilationCacheDir = cacheDir(t)
	h, err := wasmtest.Load(context.Background(), build.get(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

// TestVectors runs the shared vectors through the compiled plugin in the
// proxy-wasm host, with bodies arriving whole and in small chunks.
func TestVectors(t *testing.T) {
	top := t
	hosts := map[string]*wasmtest.Host{}
	policytest.Run(t, func(t *testing.T, v *policytest.Vector, chunk int) policytest.Outcome {
		h := hosts[v.ConfigName]
		if h == nil {
			h = load(top, v.Config, wasmtest.Options{}) // lives as long as the whole test
			hosts[v.ConfigName] = h
		}
		res, err := h.Do(context.Background(), wasmtest.Request{Path: "/v1/chat/completions", Body: v.Body, ChunkSize: chunk,
			Headers: append([][2]string{{"content-type", "application/json"}}, v.HeaderPairs()...)})
		if err != nil {
			t.Fatal(err)
		}
		if res.Local != nil {
			return policytest.Outcome{Status: int(res.Local.Status), Headers: headerMap(res.Local.Headers), Body: res.Local.Body}
		}
		if res.RouteCacheCleared != 1 {
			t.Errorf("clear_route_cache called %d times, want 1", res.RouteCacheCleared)
		}
		return policytest.Outcome{Status: 200, Headers: headerMap(res.Headers), Body: res.Body}
	})
}

func headerMap(hs [][2]string) map[string]string {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		m[h[0]] = h[1]
	}
	return m
}

func TestBadConfigFailsStart(t *testing.T) {
	_, err := wasmtest.Load(context.Background(), build.get(t), wasmtest.Options{
		PluginConfig:        []byte(`{"pii":[{"name":"e","detector":"email","action":"block"}]}`),
		CompilationCacheDir: cacheDir(t),
	})
	if err == nil {
		t.Fatal("an invalid configuration started")
	}
	if !strings.Contains(err.Error(), `pii[0].action`) {
		t.Errorf("error %v does not name the field (the guest logs it)", err)
	}
}

// TestClientCannotSetProcessorHeaders sends the plugin's own headers from
// the client, with a body and without: none of the client's values reach
// the upstream.
func TestClientCannotSetProcessorHeaders(t *testing.T) {
	h := load(t, nil, wasmtest.Options{})
	spoof := [][2]string{{"x-infergate-masked", "email"}, {"x-gateway-model-name", "evil"}, {"x-gateway-base-model-name", "evil"}}
	res, err := h.Do(context.Background(), wasmtest.Request{Body: []byte(`{"model":"m","prompt":"x"}`), Headers: spoof})
	if err != nil {
		t.Fatal(err)
	}
	if got := headerMap(res.Headers); got["x-gateway-model-name"] != "m" || got["x-gateway-base-model-name"] != "m" || got["x-infergate-masked"] != "" {
		t.Errorf("with a body, client values survived: %v", got)
	}
	res, err = h.Do(context.Background(), wasmtest.Request{Headers: spoof})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"x-infergate-masked", "x-gateway-model-name", "x-gateway-base-model-name"} {
		if v, ok := headerMap(res.Headers)[name]; ok {
			t.Errorf("without a body, client-sent %s %q reached the upstream", name, v)
		}
	}
}

func TestOversizedBodyAnsweredBeforeTheEnd(t *testing.T) {
	h := load(t, []byte(`{"limits":{"maxBodyBytes":1000}}`), wasmtest.Options{})
	s, err := h.NewStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Done() }()
	if _, err := s.RequestHeaders([][2]string{{":method", "POST"}, {":path", "/v1/completions"}}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RequestBody(bytes.Repeat([]byte("a"), 1001), false); err != nil {
		t.Fatal(err)
	}
	if lr := s.LocalResponse(); lr == nil || lr.Status != 413 {
		t.Fatalf("local response %+v, want 413 before the end of the body", lr)
	}
}

// TestSoakMemoryStaysFlat sends many 64 KiB masked requests and checks
// the guest's linear memory stays bounded. The clock steps fast on every
// reading: that is what makes the Go wasip1 collector fall behind when the
// plugin does not yield, so this test fails without runtime.Gosched.
func TestSoakMemoryStaysFlat(t *testing.T) {
	cfg := []byte(`{"pii":[{"name":"email","detector":"email","action":"mask"},{"name":"phone","detector":"phone","action":"mask"}]}`)
	h := load(t, cfg, wasmtest.Options{Clock: wasmtest.SteppingClock(time.Unix(1_700_000_000, 0), time.Millisecond)})
	body := policytest.ChatBody(64 << 10)
	n := 3000
	if testing.Short() {
		n = 500
	}
	start := h.MemoryBytes()
	const bound = 64 << 20
	for i := 0; i < n; i++ {
		res, err := h.Do(context.Background(), wasmtest.Request{Body: body, ChunkSize: 16 << 10})
		if err != nil {
			t.Fatal(err)
		}
		if res.Local != nil || bytes.Equal(res.Body, body) {
			t.Fatalf("request %d not masked: %+v", i, res.Local)
		}
		if m := h.MemoryBytes(); m > bound {
			t.Fatalf("guest memory %d MiB after %d requests (started at %d MiB)", m>>20, i+1, start>>20)
		}
	}
	t.Logf("guest memory: %.1f MiB at start, %.1f MiB after %d requests of %d KiB", float64(start)/(1<<20), float64(h.MemoryBytes())/(1<<20), n, len(body)>>10)
}

// BenchmarkRouting is the routing-only path: no guardrails, a 1 KiB chat
// body, headers set, nothing rewritten.
func BenchmarkRouting(b *testing.B) {
	h := load(b, nil, wasmtest.Options{})
	body := policytest.ChatBody(1 << 10)
	req := wasmtest.Request{Path: "/v1/chat/completions", Body: body}
	for b.Loop() {
		if _, err := h.Do(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuardrails masks with every built-in detector over 1 KiB and 64 KiB.
func BenchmarkGuardrails(b *testing.B) {
	cfg := []byte(`{"pii":[{"name":"email","detector":"email","action":"mask"},{"name":"card","detector":"credit-card","action":"mask"},` +
		`{"name":"phone","detector":"phone","action":"mask"},{"name":"ip","detector":"ip","action":"mask"},` +
		`{"name":"ssn","detector":"ssn","action":"mask"},{"name":"iban","detector":"iban","action":"mask"}],` +
		`"deny":[{"name":"injection","contains":["ignore previous instructions"]}]}`)
	h := load(b, cfg, wasmtest.Options{})
	for _, size := range []int{1 << 10, 64 << 10} {
		req := wasmtest.Request{Path: "/v1/chat/completions", Body: policytest.ChatBody(size)}
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			for b.Loop() {
				if _, err := h.Do(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
