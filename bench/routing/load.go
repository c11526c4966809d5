package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/inference/wire"
)

// result is what one request measured. Durations are wall clock.
type result struct {
	status int
	err    error
	// pod is the sim that served the request, as its x-inference-pod
	// header names it.
	pod      string
	streamed bool
	// group is the request's (request.Group); promptBytes the length of
	// the prompt text the sim tokenizes.
	group, promptBytes int
	// ttft runs from sending the request to the first SSE data event;
	// decode from that event to the last one.
	ttft, decode time.Duration
	// From the usage event the simulator appends (stream_options.include_usage).
	prompt, cached, completion int
	// retryAfter is the pause a refusal asked for (retry-after-ms, else
	// retry-after in seconds); zero when it named none.
	retryAfter time.Duration
	// end is when the request completed or failed.
	end time.Time
}

func (r result) ok() bool { return r.err == nil && r.status == http.StatusOK }

// client sends requests and measures them.
type client struct {
	http  *http.Client
	model string
	// timeout bounds one request (wall clock).
	timeout time.Duration
}

func newClient(model string, conns int, timeout time.Duration) *client {
	tr := &http.Transport{
		MaxIdleConns:        conns * 2,
		MaxIdleConnsPerHost: conns * 2,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &client{http: &http.Client{Transport: tr}, model: model, timeout: timeout}
}

func (c *client) close() { c.http.CloseIdleConnections() }

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type body struct {
	Model         string         `json:"model"`
	Prompt        string         `json:"prompt,omitempty"`
	Messages      []message      `json:"messages,omitempty"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
}

func (c *client) encode(r request) ([]byte, string, error) {
	b := body{Model: c.model, MaxTokens: r.MaxTokens}
	if !r.NoStream {
		b.Stream, b.StreamOptions = true, &streamOptions{IncludeUsage: true}
	}
	path := "/v1/completions"
	if r.Chat {
		b.Messages, path = r.Messages, "/v1/chat/completions"
	} else {
		b.Prompt = r.Prompt
	}
	raw, err := json.Marshal(b)
	return raw, path, err
}

var (
	dataPrefix = []byte("data: ")
	doneEvent  = []byte("data: [DONE]")
	usageKey   = []byte(`"usage":{`)
)

// do sends r to its target and reads the whole stream.
func (c *client) do(ctx context.Context, to target, r request) result {
	res := c.send(ctx, to, r)
	res.group, res.promptBytes, res.end = r.Group, len(r.promptText()), time.Now()
	return res
}

func (c *client) send(ctx context.Context, to target, r request) result {
	raw, path, err := c.encode(r)
	if err != nil {
		return result{err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, to.base+path, bytes.NewReader(raw))
	if err != nil {
		return result{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if to.steer != "" {
		req.Header.Set(selectionHeader, to.steer)
	}
	if r.Objective != "" {
		req.Header.Set(wire.ObjectiveHeader, r.Objective)
	}
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	res := result{status: resp.StatusCode, pod: resp.Header.Get("x-inference-pod"), streamed: !r.NoStream}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		res.retryAfter = retryAfter(resp.Header)
		return res
	}
	if r.NoStream {
		var u usageEvent
		if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
			res.err = err
			return res
		}
		res.prompt, res.completion, res.cached = u.Usage.PromptTokens, u.Usage.CompletionTokens, u.Usage.PromptTokensDetails.CachedTokens
		return res
	}
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	var first, last time.Time
	done := false
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 && bytes.HasPrefix(line, dataPrefix) {
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			if bytes.HasPrefix(line, doneEvent) {
				done = true
			} else {
				last = now
				if bytes.Contains(line, usageKey) {
					var u usageEvent
					if json.Unmarshal(line[len(dataPrefix):], &u) == nil {
						res.prompt, res.completion, res.cached = u.Usage.PromptTokens, u.Usage.CompletionTokens, u.Usage.PromptTokensDetails.CachedTokens
					}
				}
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				res.err = err
			}
			break
		}
	}
	if res.err == nil && !done {
		res.err = errors.New("stream ended without [DONE]")
	}
	if !first.IsZero() {
		res.ttft, res.decode = first.Sub(start), last.Sub(first)
	}
	return res
}

// retryAfter reads the pause a refusal asks for, as the OpenAI SDKs do:
// retry-after-ms, else retry-after in whole seconds.
func retryAfter(h http.Header) time.Duration {
	if ms, err := strconv.Atoi(h.Get("retry-after-ms")); err == nil && ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	if s, err := strconv.Atoi(h.Get("retry-after")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 0
}

// usageEvent is the usage part of an answer (or of its last SSE event).
type usageEvent struct {
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// target is where a request goes: the proxy's base URL, and for the
// oracle the sim it steers the picker to.
type target struct{ base, steer string }

// selectionHeader names the endpoints the picker's header-based-testing-filter
// keeps.
const selectionHeader = wire.EndpointSelectionHeader

// router picks a request's target.
type router func(r request) target

// runSessions sends the sessions with at most concurrency in flight, each
// session's requests in order, and returns every result and the wall time.
// The workers start spread evenly over ramp (wall clock), as clients that
// have been running for a while are spread over a request's lifetime.
// Started all at once, the first 32 requests of (a) took 30–55 ms more than
// the model's TTFT even after the warm-up, queueing for the 2 cores, and
// set the p99 of all 1,024.
func (c *client) runSessions(ctx context.Context, sessions []session, concurrency int, ramp time.Duration, route router) ([]result, time.Duration) {
	jobs := make(chan session)
	var (
		mu  sync.Mutex
		all []result
		wg  sync.WaitGroup
	)
	start := time.Now()
	for i := range concurrency {
		wg.Go(func() {
			var local []result
			if sleepCtx(ctx, ramp*time.Duration(i)/time.Duration(concurrency)) != nil {
				return
			}
			for s := range jobs {
				for _, r := range s {
					if ctx.Err() != nil {
						break
					}
					local = append(local, c.do(ctx, route(r), r))
				}
			}
			mu.Lock()
			all = append(all, local...)
			mu.Unlock()
		})
	}
feed:
	for _, s := range sessions {
		select {
		case jobs <- s:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	return all, time.Since(start)
}

// warmUp sends rounds × n concurrent short requests of text no workload
// shares (max_tokens 2), of the sims' tokenizer tok, so that the measured requests find connections
// open and processes past their first-request costs (without it round
// robin's p99 in (a) was 61–79 ms, with it 43–50). Any failure fails the
// run: a stack that cannot answer these cannot be measured.
func (c *client) warmUp(ctx context.Context, route router, tok tokenizer, n, rounds int) error {
	g := newTextGen(0x3a93)
	g.tok = tok
	for range rounds {
		reqs := make([]request, n)
		for i := range reqs {
			reqs[i] = request{Prompt: g.text(warmUpTokens), MaxTokens: 2, Group: -1, Tokenizer: tok}
		}
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i, r := range reqs {
			wg.Go(func() {
				res := c.do(ctx, route(r), r)
				switch {
				case res.err != nil:
					errs[i] = res.err
				case res.status != http.StatusOK:
					errs[i] = fmt.Errorf("warm-up request: HTTP %d", res.status)
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return nil
}

// warmUpTokens is the warm-up prompt length: two KV-cache blocks.
const warmUpTokens = 32

// flood runs workers that send requests back to back until ctx ends:
// tenant A's in (d), the failover run's steady load. After a refusal or a
// failure a worker pauses as a well-behaved client does: as long as the
// answer's Retry-After asks (the picker spreads it), or backoff when it
// names no pause.
type flood struct {
	started atomic.Int64
	wg      sync.WaitGroup
	mu      sync.Mutex
	results []result
}

// requestSource makes request i of an endless stream, the same whoever asks.
type requestSource interface{ request(i int) request }

func (c *client) startFlood(ctx context.Context, gen requestSource, workers int, route router, backoff time.Duration) *flood {
	f := &flood{}
	for range workers {
		f.wg.Go(func() {
			var local []result
			for ctx.Err() == nil {
				r := gen.request(int(f.started.Add(1)))
				res := c.do(ctx, route(r), r)
				if ctx.Err() != nil {
					break // cut at the end of the phase; not counted
				}
				local = append(local, res)
				if !res.ok() {
					pause := res.retryAfter
					if pause == 0 {
						pause = backoff
					}
					_ = sleepCtx(ctx, pause)
				}
			}
			f.mu.Lock()
			f.results = append(f.results, local...)
			f.mu.Unlock()
		})
	}
	return f
}

// wait returns A's finished results once ctx has ended.
func (f *flood) wait() []result {
	f.wg.Wait()
	return f.results
}

// tally counts outcomes.
type tally struct {
	ok, n429, errs int
	firstErr       string
}

func count(rs []result) tally {
	var t tally
	for _, r := range rs {
		switch {
		case r.ok():
			t.ok++
		case r.err == nil && r.status == http.StatusTooManyRequests:
			t.n429++
		default:
			t.errs++
			if t.firstErr == "" {
				if r.err != nil {
					t.firstErr = r.err.Error()
				} else {
					t.firstErr = fmt.Sprintf("HTTP %d", r.status)
				}
			}
		}
	}
	return t
}

// poolSampler polls the sims' gauges while a phase runs: mean KV-cache use
// and waiting requests per pod over the samples.
type poolSampler struct {
	done           chan struct{}
	kv, waiting    float64
	samples, peakW int
}

func samplePool(ctx context.Context, sims []simInfo, every time.Duration) *poolSampler {
	s := &poolSampler{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for ctx.Err() == nil {
			var kv, w float64
			ok := true
			for _, sim := range sims {
				b, err := getBody(ctx, "http://"+sim.addr+"/metrics")
				if err != nil {
					ok = false
					break
				}
				m, err := promSamples(bytes.NewReader(b), "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting")
				if err != nil {
					ok = false
					break
				}
				kv += m["vllm:kv_cache_usage_perc"]
				w += m["vllm:num_requests_waiting"]
				s.peakW = max(s.peakW, int(m["vllm:num_requests_waiting"]))
			}
			if ok {
				s.kv += kv / float64(len(sims))
				s.waiting += w / float64(len(sims))
				s.samples++
			}
			_ = sleepCtx(ctx, every)
		}
	}()
	return s
}

// means returns the mean KV use and waiting requests per pod; call after
// the sampler's context ended.
func (s *poolSampler) means() (kv, waiting float64, peak int) {
	<-s.done
	if s.samples == 0 {
		return math.NaN(), math.NaN(), 0
	}
	return s.kv / float64(s.samples), s.waiting / float64(s.samples), s.peakW
}
