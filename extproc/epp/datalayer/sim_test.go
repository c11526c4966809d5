package datalayer

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/loopback"
)

// startSim serves a simulator on 127.0.0.1 until the test ends.
func startSim(t *testing.T, cfg sim.Config) (*sim.Server, string) {
	t.Helper()
	srv, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv, loopback.Serve(t, srv.Serve)
}

func TestScrapeSimulator(t *testing.T) {
	ptr := func(v int) *int { return &v }
	usage := 0.42
	cases := []struct {
		name string
		cfg  sim.Config
		fake *sim.FakeMetrics
		want datastore.Metrics
	}{
		{
			name: "idle, defaults",
			cfg:  sim.Config{Name: "sim-idle"},
			want: datastore.Metrics{
				BlockSize: sim.DefaultBlockSize, NumGPUBlocks: sim.DefaultKVCacheTokens / sim.DefaultBlockSize,
				MaxActiveAdapters: sim.DefaultMaxLoRAs,
				ActiveAdapters:    set(), WaitingAdapters: set(),
				// The sim reports all three token counters, at zero while idle.
				Tokens: datastore.TokenCounters{Prompt: 0, PrefixQueries: 0, PrefixHits: 0},
			},
		},
		{
			name: "faked load with LoRA",
			cfg: sim.Config{Name: "sim-lora", MaxNumSeqs: 8, LoRAAdapters: []string{"sql", "chat", "tweet"},
				MaxLoRAs: 2, BlockSize: 32, KVCacheTokens: 32 * 1000},
			fake: &sim.FakeMetrics{Waiting: ptr(9), Running: ptr(8), KVCacheUsage: &usage,
				RunningLoRAs: []string{"sql", "chat"}, WaitingLoRAs: []string{"tweet"}},
			want: datastore.Metrics{
				WaitingQueueSize: 9, RunningRequests: 8, KVCacheUsage: 0.42,
				BlockSize: 32, NumGPUBlocks: 1000, MaxActiveAdapters: 2,
				ActiveAdapters: set("sql", "chat"), WaitingAdapters: set("tweet"),
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv, addr := startSim(t, tc.cfg)
			srv.SetFakeMetrics(tc.fake)
			s, _ := newTestScraper(t, Options{})
			e := endpoint(addr, "") // the simulator speaks vLLM, the default
			if err := s.ScrapeOnce(context.Background(), e); err != nil {
				t.Fatal(err)
			}
			got := *e.Metrics()
			got.UpdatedAt = time.Time{}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("metrics\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// The run loop follows the simulator as its fake metrics change.
func TestRunSeesSimulatorChanges(t *testing.T) {
	srv, addr := startSim(t, sim.Config{Name: "sim-run"})
	store := datastore.New()
	if err := store.Replace([]datastore.Spec{{Address: addr, Name: "sim-run"}}); err != nil {
		t.Fatal(err)
	}
	s, _ := newTestScraper(t, Options{Interval: 10 * time.Millisecond})
	runScraper(t, s, store)

	for _, n := range []int{3, 0, 17} {
		srv.SetFakeMetrics(&sim.FakeMetrics{Waiting: &n})
		eventually(t, time.Second, "waiting queue not followed", func() bool {
			m := store.Get(addr).Metrics()
			return m != nil && m.WaitingQueueSize == n
		})
	}
}
