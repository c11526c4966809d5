package scheduling

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

func adapters(names ...string) map[string]struct{} {
	m := map[string]struct{}{}
	for _, n := range names {
		m[n] = struct{}{}
	}
	return m
}

func TestScorers(t *testing.T) {
	q := func(n int) *datastore.Metrics { return &datastore.Metrics{WaitingQueueSize: n} }
	run := func(n int) *datastore.Metrics { return &datastore.Metrics{RunningRequests: n} }
	kv := func(f float64) *datastore.Metrics { return &datastore.Metrics{KVCacheUsage: f} }
	lora := func(active, waiting []string, maxActive int) *datastore.Metrics {
		return &datastore.Metrics{ActiveAdapters: adapters(active...), WaitingAdapters: adapters(waiting...), MaxActiveAdapters: maxActive}
	}
	cases := []struct {
		name    string
		scorer  string
		model   string
		metrics []*datastore.Metrics
		want    []float64
	}{
		{"queue min-max", "queue-scorer", "", []*datastore.Metrics{q(0), q(5), q(10)}, []float64{1, 0.5, 0}},
		{"queue all equal", "queue-scorer", "", []*datastore.Metrics{q(3), q(3)}, []float64{1, 1}},
		{"queue unknown gets the mean", "queue-scorer", "", []*datastore.Metrics{q(0), nil, q(10)}, []float64{1, 0.5, 0}},
		{"queue all unknown", "queue-scorer", "", []*datastore.Metrics{nil, nil}, []float64{0.5, 0.5}},
		{"running min-max", "running-requests-size-scorer", "", []*datastore.Metrics{run(2), run(4), run(6)}, []float64{1, 0.5, 0}},
		{"kv", "kv-cache-utilization-scorer", "", []*datastore.Metrics{kv(0), kv(0.25), kv(1)}, []float64{1, 0.75, 0}},
		{"kv unknown", "kv-cache-utilization-scorer", "", []*datastore.Metrics{kv(0.2), nil, kv(0.6)}, []float64{0.8, 0.6, 0.4}},
		{"lora", "lora-affinity-scorer", "a1", []*datastore.Metrics{
			lora([]string{"a1"}, nil, 1),           // active
			lora([]string{"b"}, nil, 2),            // room to load
			lora([]string{"b"}, []string{"a1"}, 1), // waiting
			lora([]string{"b"}, nil, 1),            // full
		}, []float64{1, 0.8, 0.6, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eps := make([]Endpoint, len(tc.metrics))
			for i, m := range tc.metrics {
				eps[i] = ep(fmt.Sprintf("10.0.0.%d:8000", i), m, nil)
			}
			scores := make([]float64, len(eps))
			build(t, tc.scorer, "").(Scorer).Score(context.Background(), &Request{Model: tc.model}, eps, scores)
			for i := range scores {
				if math.Abs(scores[i]-tc.want[i]) > 1e-9 {
					t.Fatalf("scores %v, want %v", scores, tc.want)
				}
			}
		})
	}
}
