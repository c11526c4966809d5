package datalayer

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

func set(names ...string) map[string]struct{} {
	s := map[string]struct{}{}
	for _, n := range names {
		s[n] = struct{}{}
	}
	return s
}

func TestEngineMappings(t *testing.T) {
	cases := []struct {
		name, engine, fixture string
		want                  datastore.Metrics
	}{
		{
			name: "vllm", engine: datastore.EngineVLLM, fixture: "vllm.txt",
			want: datastore.Metrics{
				WaitingQueueSize: 3, RunningRequests: 7, KVCacheUsage: 0.5,
				BlockSize: 16, NumGPUBlocks: 27197,
				// The newest LoRA series wins; names are trimmed.
				MaxActiveAdapters: 4,
				ActiveAdapters:    set("sql-lora", "chat-lora"),
				WaitingAdapters:   set("tweet-lora"),
				Tokens:            datastore.TokenCounters{Prompt: 48213, PrefixQueries: 48213, PrefixHits: 30112},
			},
		},
		{
			name: "empty engine is vllm", engine: "", fixture: "vllm.txt",
			want: datastore.Metrics{
				WaitingQueueSize: 3, RunningRequests: 7, KVCacheUsage: 0.5,
				BlockSize: 16, NumGPUBlocks: 27197, MaxActiveAdapters: 4,
				ActiveAdapters: set("sql-lora", "chat-lora"), WaitingAdapters: set("tweet-lora"),
				Tokens: datastore.TokenCounters{Prompt: 48213, PrefixQueries: 48213, PrefixHits: 30112},
			},
		},
		{
			name: "older vllm falls back to gpu_cache_usage_perc", engine: datastore.EngineVLLM, fixture: "vllm_old.txt",
			want: datastore.Metrics{WaitingQueueSize: 0, RunningRequests: 1, KVCacheUsage: 0.0625, Tokens: datastore.NoTokenCounters},
		},
		{
			name: "sglang", engine: datastore.EngineSGLang, fixture: "sglang.txt",
			want: datastore.Metrics{WaitingQueueSize: 8, RunningRequests: 11, KVCacheUsage: 0.71, BlockSize: 1, NumGPUBlocks: 412345,
				// Counters of several ranks add up.
				Tokens: datastore.TokenCounters{Prompt: 3500, PrefixQueries: -1, PrefixHits: -1}},
		},
		{
			name: "trtllm-serve", engine: datastore.EngineTRTLLMServe, fixture: "trtllm_serve.txt",
			want: datastore.Metrics{WaitingQueueSize: 12, RunningRequests: 64, KVCacheUsage: 0.8125, BlockSize: 32, NumGPUBlocks: 8192, Tokens: datastore.NoTokenCounters},
		},
		{
			name: "triton tensorrt-llm", engine: datastore.EngineTritonTensorRTLLM, fixture: "triton_trtllm.txt",
			want: datastore.Metrics{WaitingQueueSize: 7, RunningRequests: 11, KVCacheUsage: 0.29296875, BlockSize: 64, NumGPUBlocks: 4096, Tokens: datastore.NoTokenCounters},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestServer(t, serveText(fixture(t, tc.fixture)))
			s, _ := newTestScraper(t, Options{})
			e := endpoint(ts.addr, tc.engine)

			before := time.Now()
			if err := s.ScrapeOnce(context.Background(), e); err != nil {
				t.Fatalf("ScrapeOnce: %v", err)
			}
			got := e.Metrics()
			if got == nil {
				t.Fatal("no metrics published")
			}
			if got.UpdatedAt.Before(before) || got.UpdatedAt.After(time.Now()) {
				t.Errorf("UpdatedAt %v not within the scrape", got.UpdatedAt)
			}
			g := *got
			g.UpdatedAt = time.Time{}
			if !reflect.DeepEqual(g, tc.want) {
				t.Errorf("metrics\n got %+v\nwant %+v", g, tc.want)
			}
			if e.ScrapeError() != "" {
				t.Errorf("ScrapeError = %q after success", e.ScrapeError())
			}
		})
	}
}

// A page of another engine lacks the required series; the error names them.
func TestMissingSeries(t *testing.T) {
	cases := []struct {
		engine, fixture string
		missing         []string
	}{
		{datastore.EngineVLLM, "sglang.txt", []string{"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc"}},
		{datastore.EngineSGLang, "vllm.txt", []string{"sglang:num_queue_reqs", "sglang:token_usage"}},
		{datastore.EngineTritonTensorRTLLM, "trtllm_serve.txt", []string{"nv_trt_llm_request_metrics{request_type=waiting}"}},
		// Histograms are not values, even if their name matches.
		{datastore.EngineTRTLLMServe, "vllm_old.txt", []string{"trtllm_num_requests_running"}},
	}
	for _, tc := range cases {
		t.Run(tc.engine, func(t *testing.T) {
			ts := newTestServer(t, serveText(fixture(t, tc.fixture)))
			s, _ := newTestScraper(t, Options{})
			err := s.ScrapeOnce(context.Background(), endpoint(ts.addr, tc.engine))
			se, ok := errors.AsType[*ScrapeError](err)
			if !ok || se.Reason != ReasonMissingSeries {
				t.Fatalf("err = %v, want reason %s", err, ReasonMissingSeries)
			}
			for _, m := range tc.missing {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not name %s", err, m)
				}
			}
		})
	}
}

// Every engine the datastore accepts has a mapping.
func TestEveryEngineMapped(t *testing.T) {
	for _, e := range []string{datastore.EngineVLLM, datastore.EngineSGLang, datastore.EngineTRTLLMServe, datastore.EngineTritonTensorRTLLM} {
		if _, ok := mappingFor(e); !ok {
			t.Errorf("engine %q has no mapping", e)
		}
	}
}
