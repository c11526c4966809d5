package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The public measurement the simulator is calibrated against: one vLLM pod
// serving Qwen3-0.6B with a KV cache of 163,472 tokens in blocks of 16,
// replaying requests that are each one of a set of distinct 2,048-token
// prefixes followed by a unique 128-token suffix, generating 128 tokens, 32
// requests at a time, in random order. It measured a prefix cache hit rate
// (hit tokens / queried tokens) of 44.4% with 128 prefixes × 8 requests and
// 77.6% with 64 prefixes. The second figure is taken as 64 prefixes × 8
// requests, what each pod saw when the 128-prefix workload was split by hand
// between two pods (77.5% for the pair): it stays under the ceiling of
// 7/8 × 2048/2176 = 82.4% for 8 requests a prefix, and vLLM's own caching
// rules, modelled here, give 78% for it but about 83% for 64 prefixes × 16.
const (
	calPrefixTokens = 2048
	calSuffixTokens = 128
	calOutputTokens = 128
	calConcurrency  = 32
	// calTimeScale runs the replay's ~50 simulated seconds in about one;
	// requests then last ~20 ms of wall time, long against the HTTP round
	// trip, so 32 of them still overlap as they would in real time.
	calTimeScale = 50
	// calSeed picks the request order. The hit rate depends on it: over 40
	// orders the model gave 43.9% on average (40.9% to 46.9%) for 128
	// prefixes and 78.3% (77.2% to 79.3%) for 64. This order lands close to
	// both averages (44.1% and 78.4% without HTTP timing in the way), so
	// the test checks the model's calibration rather than an order's luck.
	calSeed = 24
)

func TestCalibrationPrefixCacheHitRate(t *testing.T) {
	workloads := []struct {
		prefixes, repeats int
		measured          float64 // by vLLM, %
		lo, hi            float64 // accepted, %
	}{
		{prefixes: 128, repeats: 8, measured: 44.4, lo: 41, hi: 47},
		{prefixes: 64, repeats: 8, measured: 77.6, lo: 74.5, hi: 80.5},
	}
	for _, w := range workloads {
		t.Run(fmt.Sprintf("%d_prefixes_x%d", w.prefixes, w.repeats), func(t *testing.T) {
			begin := time.Now()
			rate, ttft := replayPrefixWorkload(t, w.prefixes, w.repeats, calSeed)
			t.Logf("%d prefixes × %d requests, %d at a time: hit rate %.1f%% (vLLM measured %.1f%%), mean TTFT %v simulated; %d requests in %v",
				w.prefixes, w.repeats, calConcurrency, rate, w.measured, ttft.Round(100*time.Microsecond), w.prefixes*w.repeats, time.Since(begin).Round(time.Millisecond))
			if rate < w.lo || rate > w.hi {
				t.Errorf("hit rate %.1f%%, want within [%g%%, %g%%]", rate, w.lo, w.hi)
			}
		})
	}
}

// replayPrefixWorkload sends prefixes × repeats completions to a sim with
// the default cache and latency model, calConcurrency at a time, and returns
// the prefix cache hit rate in percent and the mean time to first token.
func replayPrefixWorkload(t *testing.T, prefixes, repeats int, seed uint64) (float64, time.Duration) {
	t.Helper()
	ts := start(t, Config{
		PrefillOverhead:     DefaultPrefillOverhead,
		PrefillTimePerToken: DefaultPrefillTimePerToken,
		InterTokenLatency:   DefaultInterTokenLatency,
		TimeScale:           calTimeScale,
	})
	rng := rand.New(rand.NewPCG(seed, uint64(prefixes)))
	prefixText := make([]string, prefixes)
	for i := range prefixText {
		prefixText[i] = calText(rng, fmt.Sprintf("prefix %d:", i), calPrefixTokens)
	}
	n := prefixes * repeats
	order := make([]int, n) // request i uses prefix order[i]
	for i := range order {
		order[i] = i % prefixes
	}
	rng.Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
	bodies := make([][]byte, n)
	for i, p := range order {
		prompt := prefixText[p] + calText(rng, fmt.Sprintf("request %d:", i), calSuffixTokens)
		b, err := json.Marshal(map[string]any{"model": base, "prompt": prompt, "max_tokens": calOutputTokens})
		if err != nil {
			t.Fatal(err)
		}
		bodies[i] = b
	}

	client := &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: calConcurrency},
		Timeout:   time.Minute,
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range calConcurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := postCompletion(ctx, client, ts.url, bodies[i]); err != nil {
					t.Errorf("request %d: %v", i, err)
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	st := ts.Stats()
	wantQueried := uint64(n * (calPrefixTokens + calSuffixTokens))
	if st.RequestsServed != uint64(n) || st.PrefixQueriedTokens != wantQueried {
		t.Fatalf("Stats = %+v, want %d requests and %d queried tokens", st, n, wantQueried)
	}
	fams := ts.scrape(t)
	if q, h := gauge(t, fams, "vllm:prefix_cache_queries_total"), gauge(t, fams, "vllm:prefix_cache_hits_total"); q != float64(st.PrefixQueriedTokens) || h != float64(st.PrefixHitTokens) {
		t.Errorf("/metrics counts %g queried and %g hit tokens, Stats %d and %d", q, h, st.PrefixQueriedTokens, st.PrefixHitTokens)
	}
	h := single(t, fams, "vllm:time_to_first_token_seconds").Histogram
	ttft := time.Duration(h.GetSampleSum() / float64(h.GetSampleCount()) * float64(time.Second))
	return 100 * float64(st.PrefixHitTokens) / float64(st.PrefixQueriedTokens), ttft
}

// calText returns tokens sim tokens of text that starts with label and goes
// on with random letters, so that texts with distinct labels are distinct.
func calText(rng *rand.Rand, label string, tokens int) string {
	b := make([]byte, tokens*DefaultBytesPerToken)
	n := copy(b, label)
	for i := n; i < len(b); i++ {
		b[i] = 'a' + byte(rng.IntN(26))
	}
	return string(b)
}

func postCompletion(ctx context.Context, client *http.Client, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return nil
}
