package wasmtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/wasm/wasmtest"
)

// The plugin is built and loaded once per test binary: a cold wasip1 build takes ~15 s and a
// compile without the cache ~1.5 s, against milliseconds for a request.
type fixture struct {
	wasm     []byte
	cacheDir string
	host     *wasmtest.Host
	log      *lockedBuffer
}

var fx fixture

const defaultConfig = `{"header":"x-test","reject_path":"/deny","suffix":"!"}`

func TestMain(m *testing.M) {
	code, err := setup(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	home, err := os.UserHomeDir()
	if err != nil {
		return 0, err
	}
	fx.cacheDir = filepath.Join(home, ".cache", "infergate", "wazero")
	if err := os.MkdirAll(fx.cacheDir, 0o755); err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "wasmtest-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	pkg, err := filepath.Abs(filepath.Join("testdata", "plugin"))
	if err != nil {
		return 0, err
	}
	out := filepath.Join(dir, "plugin.wasm")
	if err := wasmtest.Build(ctx, pkg, out); err != nil {
		return 0, err
	}
	if fx.wasm, err = os.ReadFile(out); err != nil {
		return 0, err
	}
	fx.log = &lockedBuffer{}
	fx.host, err = wasmtest.Load(ctx, fx.wasm, wasmtest.Options{
		PluginConfig:        []byte(defaultConfig),
		CompilationCacheDir: fx.cacheDir,
		Properties:          map[string][]byte{wasmtest.PropertyPath("plugin_name"): []byte("wasmtest-plugin")},
		Log:                 fx.log,
	})
	if err != nil {
		return 0, fmt.Errorf("loading the test plugin: %w", err)
	}
	defer fx.host.Close(context.Background())
	return m.Run(), nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func pseudo(method, path string) [][2]string {
	return [][2]string{{":method", method}, {":scheme", "http"}, {":authority", "wasmtest"}, {":path", path}}
}

func header(hs [][2]string, key string) (string, bool) {
	for _, h := range hs {
		if h[0] == key {
			return h[1], true
		}
	}
	return "", false
}

func TestRequestBodyRewrittenWhateverTheChunking(t *testing.T) {
	body := []byte("the quick brown fox jumps over") // 30 bytes
	cumulative := func(sizes ...int) string {
		var s []string
		for _, n := range sizes {
			s = append(s, strconv.Itoa(n))
		}
		return strings.Join(s, ",")
	}
	var ones []int
	for i := 1; i <= len(body); i++ {
		ones = append(ones, i)
	}
	tests := []struct {
		name      string
		chunkSize int
		wantSizes string // what the plugin was told on each body call: the total buffered so far
	}{
		{"one chunk", 0, "30"},
		{"three chunks", 10, cumulative(10, 20, 30)},
		{"uneven chunks", 7, cumulative(7, 14, 21, 28, 30)},
		{"one-byte chunks", 1, cumulative(ones...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			before := fx.host.ForeignFunctionCalls("clear_route_cache")
			res, err := fx.host.Do(ctx, wasmtest.Request{Path: "/v1/chat", Body: body, ChunkSize: tt.chunkSize})
			if err != nil {
				t.Fatal(err)
			}
			if res.Local != nil {
				t.Fatalf("unexpected local response %+v", res.Local)
			}
			if got, want := string(res.Body), "THE QUICK BROWN FOX JUMPS OVER!"; got != want {
				t.Errorf("forwarded body %q, want %q", got, want)
			}
			want := append(pseudo("POST", "/v1/chat"),
				[2]string{"x-num-headers", "5"}, // 4 pseudo-headers and content-length, which the plugin then removed
				[2]string{"x-test", "30"},
				[2]string{"x-body-sizes", tt.wantSizes},
			)
			if !slices.Equal(res.Headers, want) {
				t.Errorf("forwarded headers\n got %q\nwant %q", res.Headers, want)
			}
			if res.RouteCacheCleared != 1 {
				t.Errorf("route cache cleared %d times on the stream, want 1", res.RouteCacheCleared)
			}
			if got := fx.host.ForeignFunctionCalls("clear_route_cache") - before; got != 1 {
				t.Errorf("clear_route_cache called %d times, want 1", got)
			}
		})
	}
}

// After Continue on a body chunk Envoy forwards it, so the next call sees only new data, and headers
// changed after they went upstream do not reach it.
func TestStreamingBodySeesOnlyNewChunks(t *testing.T) {
	ctx := t.Context()
	body := []byte("abcdefghijklmnopqrstuvwxyz0123")
	s, err := fx.host.NewStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Done()
	hs := append(pseudo("POST", "/stream"), [2]string{"x-wasmtest-stream", "1"})
	if act, err := s.RequestHeaders(hs, false); err != nil || act != wasmtest.ActionContinue {
		t.Fatalf("request headers: %v, %v; want Continue", act, err)
	}
	for i := 0; i < len(body); i += 10 {
		act, err := s.RequestBody(body[i:i+10], i+10 == len(body))
		if err != nil || act != wasmtest.ActionContinue {
			t.Fatalf("chunk %d: %v, %v; want Continue", i/10, act, err)
		}
	}
	if got, want := string(s.ForwardedRequestBody()), strings.ToUpper(string(body)); got != want {
		t.Errorf("forwarded body %q, want %q", got, want)
	}
	if v, ok := header(s.RequestHeaderMap(), "x-late"); ok {
		t.Errorf("x-late: %s reached upstream although it was set after the headers went", v)
	}
	prefix := fmt.Sprintf("debug: stream %d: body chunk", s.ID())
	var seen []string
	for _, l := range fx.host.Logs() {
		if strings.HasPrefix(l, prefix) {
			seen = append(seen, strings.TrimPrefix(l, prefix))
		}
	}
	want := []string{" size=10 eos=false", " size=10 eos=false", " size=10 eos=true"}
	if !slices.Equal(seen, want) {
		t.Errorf("body calls %q, want %q", seen, want)
	}
}

func TestRequestWithoutBody(t *testing.T) {
	before := fx.host.ForeignFunctionCalls("clear_route_cache")
	res, err := fx.host.Do(t.Context(), wasmtest.Request{Path: "/v1/models"})
	if err != nil {
		t.Fatal(err)
	}
	want := append(pseudo("GET", "/v1/models"), [2]string{"x-num-headers", "4"})
	if !slices.Equal(res.Headers, want) {
		t.Errorf("forwarded headers\n got %q\nwant %q", res.Headers, want)
	}
	if len(res.Body) != 0 || res.Local != nil || res.RouteCacheCleared != 0 {
		t.Errorf("body %q, local %+v, route cache cleared %d; want none", res.Body, res.Local, res.RouteCacheCleared)
	}
	if got := fx.host.ForeignFunctionCalls("clear_route_cache") - before; got != 0 {
		t.Errorf("clear_route_cache called %d times, want 0", got)
	}
}

func TestLocalResponse(t *testing.T) {
	for _, body := range []string{"", `{"prompt":"hi"}`} {
		t.Run(fmt.Sprintf("body=%d", len(body)), func(t *testing.T) {
			res, err := fx.host.Do(t.Context(), wasmtest.Request{Path: "/deny", Body: []byte(body), ChunkSize: 3})
			if err != nil {
				t.Fatal(err)
			}
			l := res.Local
			if l == nil {
				t.Fatal("no local response")
			}
			if l.Status != 403 || l.GRPCStatus != -1 {
				t.Errorf("status %d grpc %d, want 403 and -1", l.Status, l.GRPCStatus)
			}
			wantHeaders := [][2]string{{"content-type", "application/json"}, {"x-rejected-by", "wasmtest"}}
			if !slices.Equal(l.Headers, wantHeaders) {
				t.Errorf("local response headers %q, want %q", l.Headers, wantHeaders)
			}
			var got map[string]string
			if err := json.Unmarshal(l.Body, &got); err != nil || got["error"] != "denied" || got["path"] != "/deny" {
				t.Errorf("local response body %s (%v)", l.Body, err)
			}
			if len(res.Body) != 0 {
				t.Errorf("%q went upstream despite the local response", res.Body)
			}
			if _, ok := header(res.Headers, "x-body-sizes"); ok {
				t.Error("the body reached the plugin after its local response")
			}
		})
	}
}

func TestStreamEndsAtLocalResponse(t *testing.T) {
	s, err := fx.host.NewStream(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RequestHeaders(pseudo("POST", "/deny"), false); err != nil {
		t.Fatal(err)
	}
	if s.LocalResponse() == nil {
		t.Fatal("no local response")
	}
	if _, err := s.RequestBody([]byte("x"), true); !errors.Is(err, wasmtest.ErrStreamEnded) {
		t.Errorf("body after local response: %v, want ErrStreamEnded", err)
	}
	if err := s.Done(); err != nil {
		t.Fatal(err)
	}
	if err := s.Done(); !errors.Is(err, wasmtest.ErrStreamDone) {
		t.Errorf("second Done: %v, want ErrStreamDone", err)
	}
}

func TestResponsePath(t *testing.T) {
	s, err := fx.host.NewStream(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Done()
	if _, err := s.RequestHeaders(pseudo("GET", "/"), true); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		call func() (wasmtest.Action, error)
		want wasmtest.Action
	}{
		{"headers", func() (wasmtest.Action, error) {
			return s.ResponseHeaders([][2]string{{":status", "200"}, {"Content-Type", "text/plain"}, {"content-length", "5"}}, false)
		}, wasmtest.ActionContinue},
		{"first chunk", func() (wasmtest.Action, error) { return s.ResponseBody([]byte("he"), false) }, wasmtest.ActionPause},
		{"last chunk", func() (wasmtest.Action, error) { return s.ResponseBody([]byte("llo"), true) }, wasmtest.ActionContinue},
	}
	for _, st := range steps {
		if act, err := st.call(); err != nil || act != st.want {
			t.Fatalf("%s: %v, %v; want %v", st.name, act, err, st.want)
		}
	}
	wantHeaders := [][2]string{{":status", "200"}, {"content-type", "text/plain"}, {"x-wasmtest", "seen"}}
	if got := s.ResponseHeaderMap(); !slices.Equal(got, wantHeaders) {
		t.Errorf("response headers %q, want %q", got, wantHeaders)
	}
	if got := string(s.ForwardedResponseBody()); got != "[hello]" {
		t.Errorf("response body %q, want %q (prepend and append on the buffered body)", got, "[hello]")
	}
}

// The plugin waits for end of stream on the body, which trailers deliver instead: Continue on the
// trailers sends the buffered body on untouched. The host must not lose or duplicate it.
func TestTrailersForwardBufferedBody(t *testing.T) {
	s, err := fx.host.NewStream(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Done()
	if _, err := s.RequestHeaders(pseudo("POST", "/grpc"), false); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"ab", "c"} {
		if act, err := s.RequestBody([]byte(c), false); err != nil || act != wasmtest.ActionPause {
			t.Fatalf("body %q: %v, %v; want Pause", c, act, err)
		}
	}
	if s.RequestComplete() || len(s.ForwardedRequestBody()) != 0 {
		t.Fatal("request went upstream before the trailers")
	}
	if act, err := s.RequestTrailers([][2]string{{"grpc-timeout", "1S"}}); err != nil || act != wasmtest.ActionContinue {
		t.Fatalf("trailers: %v, %v; want Continue", act, err)
	}
	if got := string(s.ForwardedRequestBody()); got != "abc" || !s.RequestComplete() {
		t.Errorf("forwarded %q, complete %v; want \"abc\", true", got, s.RequestComplete())
	}
}

func TestDoReportsBrokenRequests(t *testing.T) {
	tests := []struct {
		name   string
		header string
		want   error
	}{
		{"paused at end of stream", "x-wasmtest-hold", wasmtest.ErrStalled},
		{"body changed, content-length kept", "x-wasmtest-keep-content-length", wasmtest.ErrContentLength},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := fx.host.Do(t.Context(), wasmtest.Request{
				Headers: [][2]string{{tt.header, "1"}},
				Body:    []byte("some body"),
			})
			if !errors.Is(err, tt.want) {
				t.Errorf("Do: %v, want %v", err, tt.want)
			}
		})
	}
}

func TestLogsAndProperties(t *testing.T) {
	res, err := fx.host.Do(t.Context(), wasmtest.Request{})
	if err != nil || res.Local != nil {
		t.Fatal(err, res.Local)
	}
	logs := fx.host.Logs()
	for _, want := range []string{
		"info: plugin_name=wasmtest-plugin",
		"info: shared queue: error status returned by host: unimplemented", // a stubbed import
		"info: shared data started=yes cas=1",
		"info: started: header=x-test reject_path=/deny",
	} {
		if !slices.Contains(logs, want) {
			t.Errorf("log line %q missing from %q", want, logs[:min(len(logs), 10)])
		}
	}
	if last := logs[len(logs)-1]; !strings.HasPrefix(last, "debug: stream ") || !strings.HasSuffix(last, " done") {
		t.Errorf("last log line %q, want the OnHttpStreamDone line", last)
	}
	if w := fx.log.String(); !strings.Contains(w, "info: plugin_name=wasmtest-plugin\n") || !strings.HasSuffix(w, logs[len(logs)-1]+"\n") {
		t.Errorf("Options.Log did not receive the same lines:\n%s", w[max(0, len(w)-300):])
	}
}

func TestTickPeriodRecorded(t *testing.T) {
	if got := fx.host.TickPeriod(); got != 5*time.Second {
		t.Errorf("tick period %v, want 5s", got)
	}
}

func TestBuild(t *testing.T) {
	ctx := t.Context()
	// Relative to the module root, whatever the working directory; -trimpath makes it reproducible.
	out := filepath.Join(t.TempDir(), "plugin.wasm")
	if err := wasmtest.Build(ctx, "./wasm/wasmtest/testdata/plugin", out); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, fx.wasm) {
		t.Errorf("module-relative build differs from the absolute one (%d vs %d bytes, %v)", len(got), len(fx.wasm), err)
	}
	err := wasmtest.Build(ctx, "./wasm/wasmtest/testdata/missing", out)
	if err == nil || !strings.Contains(err.Error(), "testdata/missing") {
		t.Errorf("building a missing package: %v; want an error with go's output", err)
	}
}

func TestCancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := fx.host.Do(ctx, wasmtest.Request{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Do with a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := fx.host.Do(t.Context(), wasmtest.Request{}); err != nil {
		t.Errorf("the host is unusable after a cancelled call: %v", err)
	}
}

func TestCounterMetric(t *testing.T) {
	before, ok := fx.host.Metric("wasmtest_requests_total")
	if !ok {
		t.Fatal("metric wasmtest_requests_total not defined")
	}
	for range 3 {
		if _, err := fx.host.Do(t.Context(), wasmtest.Request{}); err != nil {
			t.Fatal(err)
		}
	}
	if after, _ := fx.host.Metric("wasmtest_requests_total"); after-before != 3 {
		t.Errorf("counter moved by %d, want 3", after-before)
	}
}

func TestLoadFailsWhenPluginRejectsConfig(t *testing.T) {
	tests := []struct {
		name, config, wantLog string
	}{
		{"empty (the SDK reads an empty buffer as NotFound)", "", "critical: reading plugin configuration: error status returned by host: not found"},
		{"not JSON", "{", "critical: parsing plugin configuration"},
		{"missing header", `{"reject_path":"/deny"}`, "critical: plugin configuration: header is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := wasmtest.Load(t.Context(), fx.wasm, wasmtest.Options{
				PluginConfig:        []byte(tt.config),
				CompilationCacheDir: fx.cacheDir,
			})
			if err == nil {
				h.Close(t.Context())
				t.Fatal("Load succeeded")
			}
			if !errors.Is(err, wasmtest.ErrPluginStart) || !strings.Contains(err.Error(), tt.wantLog) {
				t.Errorf("Load: %v; want ErrPluginStart mentioning %q", err, tt.wantLog)
			}
		})
	}
}

func TestLoadRejectsNonProxyWasmModule(t *testing.T) {
	empty := []byte("\x00asm\x01\x00\x00\x00")
	_, err := wasmtest.Load(t.Context(), empty, wasmtest.Options{})
	if err == nil || !strings.Contains(err.Error(), "proxy_abi_version_0_2_0") {
		t.Errorf("Load of an empty module: %v; want an ABI version error", err)
	}
}

func TestClosedHostRefusesStreams(t *testing.T) {
	h, err := wasmtest.Load(t.Context(), fx.wasm, wasmtest.Options{
		PluginConfig:        []byte(defaultConfig),
		CompilationCacheDir: fx.cacheDir,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.NewStream(t.Context()); err == nil {
		t.Error("NewStream on a closed host succeeded")
	}
}

const (
	soakRequests = 3000
	soakBound    = 64 << 20
)

// soak sends 64 KiB requests until done or until the guest's linear memory passes soakBound.
// Linear memory never shrinks, so its size is the peak heap the plugin needed.
func soak(t *testing.T, h *wasmtest.Host) (start, end uint32, sent int) {
	t.Helper()
	body := bytes.Repeat([]byte("abcdefgh"), 64<<10/8)
	start = h.MemoryBytes()
	begin := time.Now()
	for sent < soakRequests && h.MemoryBytes() < soakBound {
		res, err := h.Do(t.Context(), wasmtest.Request{Path: "/soak", Body: body})
		if err != nil {
			t.Fatalf("request %d: %v", sent, err)
		}
		if len(res.Body) != len(body)+1 {
			t.Fatalf("request %d: forwarded %d bytes, want %d", sent, len(res.Body), len(body)+1)
		}
		sent++
	}
	end = h.MemoryBytes()
	t.Logf("guest memory: %.1f MiB at start, %.1f MiB after %d requests of 64 KiB (%v, %.0f µs/request)",
		float64(start)/(1<<20), float64(end)/(1<<20), sent, time.Since(begin).Round(time.Millisecond),
		float64(time.Since(begin).Microseconds())/float64(sent))
	return start, end, sent
}

// soakHost loads the plugin with guest time running fast (1 ms per clock reading): only then does
// the Go wasip1 heap runaway that runtime.Gosched() in OnHttpStreamDone prevents show up within a
// test's budget (see SteppingClock).
func soakHost(t *testing.T, config string) *wasmtest.Host {
	t.Helper()
	h, err := wasmtest.Load(t.Context(), fx.wasm, wasmtest.Options{
		PluginConfig:        []byte(config),
		CompilationCacheDir: fx.cacheDir,
		Clock:               wasmtest.SteppingClock(time.Now(), time.Millisecond),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	return h
}

func TestSoakGuestMemoryStaysBounded(t *testing.T) {
	_, end, sent := soak(t, soakHost(t, defaultConfig))
	if end >= soakBound {
		t.Errorf("guest memory reached %d MiB after %d requests, bound %d MiB", end>>20, sent, soakBound>>20)
	}
}

// The control for the soak: the same plugin without runtime.Gosched() must fail it, or the soak
// proves nothing. If this starts failing, the Go runtime may no longer need the workaround.
func TestSoakCatchesMissingGosched(t *testing.T) {
	config := strings.Replace(defaultConfig, "{", `{"skip_gosched":true,`, 1)
	_, end, sent := soak(t, soakHost(t, config))
	if end < soakBound {
		t.Errorf("without runtime.Gosched() guest memory stayed at %d MiB over %d requests; the soak no longer detects the GC runaway", end>>20, sent)
	}
}

func BenchmarkRequest1KiB(b *testing.B) {
	ctx := b.Context()
	req := wasmtest.Request{Path: "/bench", Body: bytes.Repeat([]byte("x"), 1024)}
	for b.Loop() {
		if _, err := fx.host.Do(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N), "µs/op")
}
