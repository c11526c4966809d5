package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// slow makes each request take about 1 s of wall time; tests cancel or
// observe it while it runs.
var slow = Config{PrefillOverhead: time.Second, TimeScale: 1}

func TestMetricsNamesAndLabels(t *testing.T) {
	ts := start(t, Config{Model: "m", LoRAAdapters: []string{"l1"}, MaxLoRAs: 2, KVCacheTokens: 1600, BlockSize: 16, TimeScale: 1000})
	prompt := strings.Repeat("a", 4*16*3) // three full blocks
	for range 2 {
		if resp, body := ts.post(t, context.Background(), "/v1/completions", completionBody("m", prompt, 2)); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	fams := ts.scrape(t)
	for name, want := range map[string]float64{
		"vllm:num_requests_waiting":       0,
		"vllm:num_requests_running":       0,
		"vllm:kv_cache_usage_perc":        0,
		"vllm:prefix_cache_queries_total": 2 * 48,
		"vllm:prefix_cache_hits_total":    48,
		"vllm:prompt_tokens_total":        2 * 48,
		"vllm:generation_tokens_total":    2 * 2,
		"vllm:request_success_total":      2,
		"vllm:cache_config_info":          1,
	} {
		if got := gauge(t, fams, name); got != want {
			t.Errorf("%s = %g, want %g", name, got, want)
		}
	}
	for name := range fams {
		for _, m := range fams[name].Metric {
			if labels(m)["model_name"] != "m" {
				t.Errorf("%s lacks model_name=m: %v", name, labels(m))
			}
		}
	}
	if l := labels(single(t, fams, "vllm:cache_config_info")); l["block_size"] != "16" || l["num_gpu_blocks"] != "100" {
		t.Errorf("cache_config_info labels = %v", l)
	}
	lora := single(t, fams, "vllm:lora_requests_info")
	if l := labels(lora); l["max_lora"] != "2" || l["running_lora_adapters"] != "" || l["waiting_lora_adapters"] != "" {
		t.Errorf("lora_requests_info labels = %v", l)
	}
	if ts := lora.Gauge.GetValue(); ts < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("lora_requests_info value %g is not a recent Unix time", ts)
	}
	h := single(t, fams, "vllm:time_to_first_token_seconds").Histogram
	if h == nil || h.GetSampleCount() != 2 || len(h.Bucket) == 0 {
		t.Errorf("TTFT histogram = %v", h)
	}
}

func TestQueueing(t *testing.T) {
	cfg := slow
	cfg.MaxNumSeqs = 1
	ts := start(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		ts.postInBackground(t, ctx, &wg, completionBody(base, "hi", 1))
	}
	waitFor(t, "one running and one waiting", func() bool {
		st := ts.Stats()
		return st.Running == 1 && st.Waiting == 1
	})
	fams := ts.scrape(t)
	if r, w := gauge(t, fams, "vllm:num_requests_running"), gauge(t, fams, "vllm:num_requests_waiting"); r != 1 || w != 1 {
		t.Errorf("metrics show running=%g waiting=%g, want 1 and 1", r, w)
	}
	if u := gauge(t, fams, "vllm:kv_cache_usage_perc"); u <= 0 || u > 1 {
		t.Errorf("kv_cache_usage_perc = %g while a request runs", u)
	}
	cancel()
	wg.Wait()
}

func TestWaitingQueueFull(t *testing.T) {
	cfg := slow
	cfg.MaxNumSeqs, cfg.MaxWaitingQueue = 1, 1
	ts := start(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		ts.postInBackground(t, ctx, &wg, completionBody(base, "hi", 1))
	}
	waitFor(t, "a full queue", func() bool { st := ts.Stats(); return st.Running == 1 && st.Waiting == 1 })
	resp, body := ts.post(t, context.Background(), "/v1/completions", completionBody(base, "hi", 1))
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status = %d, want 429: %s", resp.StatusCode, body)
	}
	if e := decode[wireError](t, body); e.Error == nil || e.Error.Code != 429 {
		t.Errorf("error body = %s", body)
	}
	cancel()
	wg.Wait()
}

func TestClientCancelFreesSlot(t *testing.T) {
	cfg := slow
	cfg.MaxNumSeqs = 1
	cfg.PrefillOverhead = time.Hour
	ts := start(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 { // one runs, one waits; both leave
		ts.postInBackground(t, ctx, &wg, completionBody(base, strings.Repeat("x", 200), 1))
	}
	waitFor(t, "one running and one waiting", func() bool { st := ts.Stats(); return st.Running == 1 && st.Waiting == 1 })
	if ts.Stats().KVCacheUsage == 0 {
		t.Error("running request holds no KV cache")
	}
	cancel()
	wg.Wait()
	waitFor(t, "the slot to be freed", func() bool {
		st := ts.Stats()
		return st.Running == 0 && st.Waiting == 0 && st.KVCacheUsage == 0
	})
	if got := ts.Stats().RequestsServed; got != 0 {
		t.Errorf("RequestsServed = %d after cancellations", got)
	}
}

func TestStreamDisconnectFreesSlot(t *testing.T) {
	ts := start(t, Config{InterTokenLatency: time.Hour, MaxNumSeqs: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := `{"model":"` + base + `","prompt":"hello","max_tokens":3,"stream":true}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/v1/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// The first token arrives at once; the second would take an hour.
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first event %q: %v", line, err)
	}
	if st := ts.Stats(); st.Running != 1 {
		t.Fatalf("Stats while streaming = %+v", st)
	}
	cancel()
	resp.Body.Close()
	waitFor(t, "the slot to be freed", func() bool { st := ts.Stats(); return st.Running == 0 && st.KVCacheUsage == 0 })
	if resp, body := ts.post(t, context.Background(), "/v1/completions", completionBody(base, "x", 1)); resp.StatusCode != 200 {
		t.Fatalf("next request: %d %s", resp.StatusCode, body)
	}
}

func TestPrefixCacheHits(t *testing.T) {
	ts := start(t, Config{BlockSize: 4, TimeScale: 1000})
	const blockBytes = 4 * 4
	shared := strings.Repeat("s", 3*blockBytes)
	tests := []struct {
		name, prompt string
		wantCached   int
	}{
		{name: "cold", prompt: shared + "tail", wantCached: 0},
		{name: "same prompt hits full blocks only", prompt: shared + "tail", wantCached: 12},
		{name: "shared prefix, different tail", prompt: shared + "other tail!!", wantCached: 12},
		{name: "first block differs", prompt: "X" + shared[1:] + "tail", wantCached: 0},
		{name: "shorter than a block", prompt: "sss", wantCached: 0},
	}
	var queried, hits uint64
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := ts.post(t, context.Background(), "/v1/completions", completionBody(base, tt.prompt, 1))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			r := decode[wireResponse](t, body)
			if got := r.Usage.PromptTokensDetails.CachedTokens; got != tt.wantCached {
				t.Errorf("cached_tokens = %d, want %d", got, tt.wantCached)
			}
			queried += uint64(ts.tok.count(tt.prompt))
			hits += uint64(tt.wantCached)
			if st := ts.Stats(); st.PrefixQueriedTokens != queried || st.PrefixHitTokens != hits {
				t.Errorf("Stats = %+v, want queried %d hits %d", st, queried, hits)
			}
		})
	}
}

func TestPrefixCacheSeparatesAdapters(t *testing.T) {
	ts := start(t, Config{LoRAAdapters: []string{"l"}, TimeScale: 1000})
	prompt := strings.Repeat("p", 4*16*2)
	for i, m := range []string{base, "l", "l"} {
		_, body := ts.post(t, context.Background(), "/v1/completions", completionBody(m, prompt, 1))
		want := []int{0, 0, 32}[i]
		if got := decode[wireResponse](t, body).Usage.PromptTokensDetails.CachedTokens; got != want {
			t.Errorf("request %d (%s): cached_tokens = %d, want %d", i, m, got, want)
		}
	}
}

func TestPrefixCacheEviction(t *testing.T) {
	// Blocks are named by their hashes directly; chaining is blockHashes' job.
	c := newPrefixCache(4)
	hitsOf := func(hashes ...uint64) int {
		n, a := c.allocate(hashes, len(hashes))
		c.release(a)
		return n
	}
	hitsOf(1, 2) // A = 1,2
	hitsOf(3, 4) // B = 3,4, more recent than A
	if n := hitsOf(1); n != 1 {
		t.Fatalf("A's first block: %d hits, want 1", n) // touches block 1
	}
	hitsOf(5) // evicts the least recently used: block 2
	for h, want := range map[uint64]bool{1: true, 2: false, 3: true, 4: true, 5: true} {
		if c.contains(h) != want {
			t.Errorf("block %d cached = %v, want %v", h, !want, want)
		}
	}

	// Pin 1 and 3 in a running sequence, then push through a lot: the pinned
	// blocks must survive and the excess simply goes uncached.
	_, running := c.allocate([]uint64{1, 3}, 2)
	for h := uint64(100); h < 110; h++ {
		hitsOf(h, h+1000, h+2000)
	}
	if !c.contains(1) || !c.contains(3) {
		t.Fatal("a pinned block was evicted")
	}
	if got := c.usage(); got != 0.5 {
		t.Errorf("usage = %g with two of four blocks pinned, want 0.5", got)
	}
	c.release(running)
	if got := c.usage(); got != 0 {
		t.Errorf("usage = %g after release, want 0", got)
	}

	// Reserved blocks (generated tokens) take room from the cache too.
	_, a := c.allocate([]uint64{7}, 4)
	if c.contains(1) || c.contains(3) {
		t.Error("unpinned blocks survived a sequence that needs the whole cache")
	}
	if got := c.usage(); got != 1 {
		t.Errorf("usage = %g, want 1", got)
	}
	c.release(a)
}

func TestOutputBlocksCached(t *testing.T) {
	// Blocks of 4 tokens (16 bytes). A 2-block prompt that generates 9
	// tokens computes 8+9-1 = 16 tokens: 4 full blocks stay cached, so the
	// next turn, which quotes the answer, finds 16 tokens.
	ts := start(t, Config{BlockSize: 4, TimeScale: 1000})
	prompt := strings.Repeat("p", 32)
	cachedOf := func(prompt string, maxTokens int) int {
		t.Helper()
		resp, body := ts.post(t, context.Background(), "/v1/completions", completionBody(base, prompt, maxTokens))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		r := decode[wireResponse](t, body)
		if want := ts.tok.count(prompt) + maxTokens; r.Usage.TotalTokens != want || ts.tok.count(*r.Choices[0].Text) != maxTokens {
			t.Fatalf("usage %+v for %d generated tokens of text %q", r.Usage, maxTokens, *r.Choices[0].Text)
		}
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	if got := cachedOf(prompt, 9); got != 0 {
		t.Fatalf("first turn: cached_tokens = %d, want 0", got)
	}
	next := prompt + outputText(ts.tok, 9) + strings.Repeat("q", 40)
	if got := cachedOf(next, 1); got != 16 {
		t.Errorf("next turn: cached_tokens = %d, want 16 (prompt and answer)", got)
	}
}

func TestFinishCachesOutputAndEvictsItFirst(t *testing.T) {
	c := newPrefixCache(5)
	seq := seqBlocks{prompt: []uint64{1, 2}, output: []uint64{3, 4}, total: 5}
	hits, a, ok := c.tryAllocate(seq, false)
	if !ok || hits != 0 {
		t.Fatalf("tryAllocate = %d, %v", hits, ok)
	}
	if got := c.usage(); got != 1 {
		t.Errorf("usage = %g while running, want 1", got)
	}
	c.finish(a)
	for h := uint64(1); h <= 4; h++ {
		if !c.contains(h) {
			t.Errorf("block %d not cached after finish", h)
		}
	}
	if got := c.usage(); got != 0 {
		t.Errorf("usage = %g after finish, want 0", got)
	}
	// Four new blocks fill the free one and evict the three least recently
	// freed: the end of the finished sequence (output first), not its
	// beginning.
	_, b, _ := c.tryAllocate(seqBlocks{prompt: []uint64{10, 11, 12, 13}, total: 4}, false)
	c.release(b)
	for h, want := range map[uint64]bool{1: true, 2: false, 3: false, 4: false} {
		if c.contains(h) != want {
			t.Errorf("block %d cached = %v, want %v", h, !want, want)
		}
	}

	// An aborted sequence leaves its prompt blocks only.
	_, a, _ = c.tryAllocate(seqBlocks{prompt: []uint64{20}, output: []uint64{21}, total: 2}, false)
	c.release(a)
	if !c.contains(20) || c.contains(21) {
		t.Error("release of an aborted sequence: want prompt cached, output not")
	}
}

func TestAdmissionWaitsForKVCache(t *testing.T) {
	// 4 blocks of 16 tokens; each request needs 3 (32 prompt tokens and 17
	// generated: 48 tokens with KV).
	cfg := slow
	cfg.KVCacheTokens, cfg.BlockSize = 64, 16
	ts := start(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	ts.postInBackground(t, ctx, &wg, completionBody(base, strings.Repeat("a", 128), 17))
	waitFor(t, "the first request to run", func() bool { return ts.Stats().Running == 1 })
	ts.postInBackground(t, ctx, &wg, completionBody(base, strings.Repeat("b", 128), 17))
	waitFor(t, "the second request to wait for blocks", func() bool {
		st := ts.Stats()
		return st.Running == 1 && st.Waiting == 1
	})
	if got := ts.Stats().KVCacheUsage; got != 0.75 {
		t.Errorf("KV usage = %g, want 0.75", got)
	}
	// The same prompt shares the running request's blocks and would fit,
	// but it must not overtake the second request.
	ts.postInBackground(t, ctx, &wg, completionBody(base, strings.Repeat("a", 128), 1))
	waitFor(t, "the third request to arrive", func() bool { st := ts.Stats(); return st.Running+st.Waiting == 3 })
	if st := ts.Stats(); st.Running != 1 || st.Waiting != 2 {
		t.Errorf("Stats = %+v: admission must stay in arrival order", st)
	}
	cancel()
	wg.Wait()

	// A request larger than the whole cache runs once it is alone.
	cfg.PrefillOverhead = 0
	big := start(t, cfg)
	if resp, body := big.post(t, context.Background(), "/v1/completions", completionBody(base, strings.Repeat("c", 512), 100)); resp.StatusCode != 200 {
		t.Fatalf("oversized request: %d %s", resp.StatusCode, body)
	}
}

func TestSequenceBlocks(t *testing.T) {
	tk := newTokenizer(Config{}.WithDefaults())
	for i := range fillerWords[DefaultBytesPerToken-1] {
		if tok := tk.outputToken(i); len(tok) != DefaultBytesPerToken {
			t.Errorf("output token %q is not %d bytes", tok, DefaultBytesPerToken)
		}
	}
	prompt := strings.Repeat("x", 4*16*3+8) // 3 full blocks and 2 tokens
	seq := sequenceBlocks(tk, base, prompt, 30, 16, 100)
	if want := blockHashes(tk, base, prompt, 16); !slices.Equal(seq.prompt, want) {
		t.Errorf("prompt hashes differ from the prompt's own block hashes")
	}
	// 50 prompt tokens and 30 generated: 79 with KV, 4 full blocks, 5 held.
	if len(seq.output) != 1 || seq.total != 5 {
		t.Errorf("output blocks %d, total %d; want 1 and 5", len(seq.output), seq.total)
	}
	if want := blockHashes(tk, base, prompt+outputText(tk, 30), 16)[3]; seq.output[0] != want {
		t.Error("output hash does not continue the chain over prompt and answer")
	}
	if seq := sequenceBlocks(tk, base, prompt, 1<<30, 16, 10); len(seq.output) != 10 || seq.total < 1<<26 {
		t.Errorf("huge max_tokens: %d output hashes (want the limit, 10), total %d", len(seq.output), seq.total)
	}
}

func TestTTFTFollowsCachedTokens(t *testing.T) {
	// 256 prompt tokens × 10 ms = 2.56 s simulated, 128 ms real when
	// uncached; a full hit leaves only the 1 ms (50 µs real) overhead.
	ts := start(t, Config{
		PrefillOverhead: time.Millisecond, PrefillTimePerToken: 10 * time.Millisecond,
		TimeScale: 20,
	})
	prompt := strings.Repeat("q", 4*256)
	timed := func() (time.Duration, int) {
		begin := time.Now()
		resp, body := ts.post(t, context.Background(), "/v1/completions", completionBody(base, prompt, 1))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		return time.Since(begin), decode[wireResponse](t, body).Usage.PromptTokensDetails.CachedTokens
	}
	cold, cached0 := timed()
	warm, cached1 := timed()
	if cached0 != 0 || cached1 != 256 {
		t.Fatalf("cached tokens = %d then %d, want 0 then 256", cached0, cached1)
	}
	if cold < 100*time.Millisecond || warm > cold/2 {
		t.Errorf("cold %v, warm %v: want cold ≥ 100ms and warm < cold/2", cold, warm)
	}
	h := single(t, ts.scrape(t), "vllm:time_to_first_token_seconds").Histogram
	// Reported in simulated seconds: the cold request alone took ≥ 2.56 s.
	if h.GetSampleSum() < 2.5 {
		t.Errorf("TTFT sum = %gs simulated, want ≥ 2.5", h.GetSampleSum())
	}
}

func TestFakeMetrics(t *testing.T) {
	ts := start(t, Config{LoRAAdapters: []string{"a"}, TimeScale: 1000})
	read := func() (waiting, running, kv float64, lora map[string]string) {
		fams := ts.scrape(t)
		return gauge(t, fams, "vllm:num_requests_waiting"), gauge(t, fams, "vllm:num_requests_running"),
			gauge(t, fams, "vllm:kv_cache_usage_perc"), labels(single(t, fams, "vllm:lora_requests_info"))
	}
	w, r, kv := 7, 3, 0.75
	ts.SetFakeMetrics(&FakeMetrics{Waiting: &w, Running: &r, KVCacheUsage: &kv, RunningLoRAs: []string{"a", "b"}})
	w = 100 // SetFakeMetrics must have copied
	if gw, gr, gkv, l := read(); gw != 7 || gr != 3 || gkv != 0.75 ||
		l["running_lora_adapters"] != "a,b" || l["waiting_lora_adapters"] != "" {
		t.Errorf("faked: waiting=%g running=%g kv=%g lora=%v", gw, gr, gkv, l)
	}
	ts.SetFakeMetrics(nil)
	if gw, gr, gkv, l := read(); gw != 0 || gr != 0 || gkv != 0 || l["running_lora_adapters"] != "" {
		t.Errorf("reset: waiting=%g running=%g kv=%g lora=%v", gw, gr, gkv, l)
	}

	// The same over HTTP; unset fields keep their measured values.
	resp, body := ts.post(t, context.Background(), "/admin/fake-metrics", `{"running":2,"waitingLoRAs":["a"]}`)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST fake metrics: %d %s", resp.StatusCode, body)
	}
	if gw, gr, _, l := read(); gw != 0 || gr != 2 || l["waiting_lora_adapters"] != "a" {
		t.Errorf("faked over HTTP: waiting=%g running=%g lora=%v", gw, gr, l)
	}
	for _, bad := range []string{`{"kvCacheUsage":1.5}`, `{"runing":1}`, `{"waiting":-1}`, `[`} {
		if resp, body := ts.post(t, context.Background(), "/admin/fake-metrics", bad); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %s: %d %s, want 400", bad, resp.StatusCode, body)
		}
	}
	req, _ := http.NewRequest(http.MethodDelete, ts.url+"/admin/fake-metrics", nil)
	if resp, _ := do(t, req); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE fake metrics: %d", resp.StatusCode)
	}
	if _, gr, _, l := read(); gr != 0 || l["waiting_lora_adapters"] != "" {
		t.Errorf("after DELETE: running=%g lora=%v", gr, l)
	}
	if st := ts.Stats(); st.Running != 0 {
		t.Errorf("Stats must ignore fakes: %+v", st)
	}
}

func TestLoRAScheduling(t *testing.T) {
	cfg := slow
	cfg.LoRAAdapters, cfg.MaxLoRAs, cfg.MaxNumSeqs = []string{"a", "b"}, 1, 4
	ts := start(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	send := func(model string) {
		ts.postInBackground(t, ctx, &wg, completionBody(model, "hi", 1))
	}
	send("a")
	waitFor(t, "adapter a to run", func() bool { return ts.Stats().Running == 1 })
	send("b")
	waitFor(t, "adapter b to wait", func() bool { return ts.Stats().Waiting == 1 })
	send(base) // the base model is always loaded: it passes b in the queue
	send("a")  // so does a, already running
	waitFor(t, "base and a to run", func() bool { return ts.Stats().Running == 3 })
	l := labels(single(t, ts.scrape(t), "vllm:lora_requests_info"))
	if l["running_lora_adapters"] != "a" || l["waiting_lora_adapters"] != "b" {
		t.Errorf("lora_requests_info labels = %v", l)
	}
	cancel()
	wg.Wait()
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error; empty for valid
	}{
		{name: "zero value", cfg: Config{}},
		{name: "negative seqs", cfg: Config{MaxNumSeqs: -1}, want: "MaxNumSeqs"},
		{name: "negative queue", cfg: Config{MaxWaitingQueue: -1}, want: "MaxWaitingQueue"},
		{name: "negative loras", cfg: Config{MaxLoRAs: -2}, want: "MaxLoRAs"},
		{name: "negative latency", cfg: Config{InterTokenLatency: -time.Millisecond}, want: "InterTokenLatency"},
		{name: "negative time scale", cfg: Config{TimeScale: -1}, want: "TimeScale"},
		{name: "cache smaller than a block", cfg: Config{KVCacheTokens: 8, BlockSize: 16}, want: "KVCacheTokens"},
		{name: "negative block size", cfg: Config{BlockSize: -16}, want: "BlockSize"},
		{name: "duplicate adapter", cfg: Config{LoRAAdapters: []string{"x", "x"}}, want: `"x"`},
		{name: "adapter named like base", cfg: Config{Model: "m", LoRAAdapters: []string{"m"}}, want: "LoRAAdapters"},
		{name: "empty adapter", cfg: Config{LoRAAdapters: []string{""}}, want: "empty"},
		{name: "words tokenizer", cfg: Config{Tokenizer: TokenizerWords}},
		{name: "words with the default bytes per token", cfg: Config{Tokenizer: TokenizerWords, BytesPerToken: 4}},
		{name: "2 bytes a token", cfg: Config{Tokenizer: TokenizerBytes, BytesPerToken: 2}},
		{name: "8 bytes a token", cfg: Config{BytesPerToken: 8}},
		{name: "unknown tokenizer", cfg: Config{Tokenizer: "bpe"}, want: `Tokenizer: must be "bytes" or "words", got "bpe"`},
		{name: "1 byte a token", cfg: Config{BytesPerToken: 1}, want: "BytesPerToken: must be within 2..8, got 1"},
		{name: "9 bytes a token", cfg: Config{BytesPerToken: 9}, want: "BytesPerToken: must be within 2..8, got 9"},
		{name: "negative bytes a token", cfg: Config{BytesPerToken: -4}, want: "BytesPerToken"},
		{name: "bytes per token with words", cfg: Config{Tokenizer: TokenizerWords, BytesPerToken: 3}, want: `BytesPerToken: applies to Tokenizer "bytes" only`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if _, err := New(tt.cfg); err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want error mentioning %s", err, tt.want)
			}
			if _, err := New(tt.cfg); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
	d := Config{}.WithDefaults()
	if d.MaxNumSeqs != 256 || d.MaxLoRAs != 1 || d.MaxWaitingQueue != 1000 || d.DefaultMaxTokens != 16 ||
		d.KVCacheTokens != 163472 || d.BlockSize != 16 || d.TimeScale != 1 || d.Model == "" || d.Name == "" ||
		d.Tokenizer != TokenizerBytes || d.BytesPerToken != 4 {
		t.Errorf("defaults = %+v", d)
	}
}

func TestServeStopsOnCancel(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if _, err := http.Get("http://" + ln.Addr().String() + "/health"); err == nil {
		t.Error("server still answers after Serve returned")
	}
}

func TestHandlerWithoutServe(t *testing.T) {
	// Handler must work under any http.Server, such as one a test builds.
	s, err := New(Config{Name: "h", TimeScale: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s.Handler()}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	body := strings.NewReader(completionBody(base, "hello", 2))
	resp, err := http.Post("http://"+ln.Addr().String()+"/v1/completions", "application/json", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r wireResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d, decode: %v", resp.StatusCode, err)
	}
	if resp.Header.Get("x-inference-pod") != "h" || resp.Header.Get("x-inference-port") == "" {
		t.Errorf("identity headers = %v", resp.Header)
	}
	if s.Stats().RequestsServed != 1 {
		t.Errorf("Stats = %+v", s.Stats())
	}
}

func BenchmarkCompletionRoundTrip(b *testing.B) {
	ts := start(b, Config{})
	body := completionBody(base, strings.Repeat("benchmark prompt ", 64), 16)
	b.ReportAllocs()
	for b.Loop() {
		resp, raw := ts.post(b, context.Background(), "/v1/completions", body)
		if resp.StatusCode != 200 {
			b.Fatalf("status %d: %s", resp.StatusCode, raw)
		}
	}
}
