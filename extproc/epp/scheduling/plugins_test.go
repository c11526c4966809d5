package scheduling

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

func ep(addr string, m *datastore.Metrics, labels map[string]string) Endpoint {
	return Endpoint{Endpoint: &datastore.Endpoint{Spec: datastore.Spec{Address: addr, Labels: labels}}, Metrics: m}
}

func build(t testing.TB, typ string, params string) Plugin {
	t.Helper()
	var raw json.RawMessage
	if params != "" {
		raw = json.RawMessage(params)
	}
	p, err := Builtins()[typ](typ, raw)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

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

func TestLabelSelectorFilter(t *testing.T) {
	eps := []Endpoint{
		ep("10.0.0.1:1", nil, map[string]string{"gpu": "a100", "zone": "a"}),
		ep("10.0.0.2:1", nil, map[string]string{"gpu": "h100", "zone": "b"}),
		ep("10.0.0.3:1", nil, map[string]string{"gpu": "a100"}),
	}
	cases := []struct {
		params string
		want   []string
	}{
		{`{"matchLabels":{"gpu":"a100"}}`, []string{"10.0.0.1:1", "10.0.0.3:1"}},
		{`{"matchExpressions":[{"key":"zone","operator":"Exists"}]}`, []string{"10.0.0.1:1", "10.0.0.2:1"}},
		{`{"matchExpressions":[{"key":"zone","operator":"DoesNotExist"}]}`, []string{"10.0.0.3:1"}},
		{`{"matchExpressions":[{"key":"gpu","operator":"In","values":["h100","b200"]}]}`, []string{"10.0.0.2:1"}},
		{`{"matchLabels":{"gpu":"a100"},"matchExpressions":[{"key":"zone","operator":"NotIn","values":["a"]}]}`, []string{"10.0.0.3:1"}},
		{`{"matchLabels":{"gpu":"tpu"}}`, nil},
	}
	for _, tc := range cases {
		t.Run(tc.params, func(t *testing.T) {
			got := build(t, "label-selector-filter", tc.params).(Filter).Filter(context.Background(), &Request{}, eps)
			if len(got) != len(tc.want) {
				t.Fatalf("kept %d endpoints, want %v", len(got), tc.want)
			}
			for i := range got {
				if got[i].Address != tc.want[i] {
					t.Fatalf("kept %s, want %v", got[i].Address, tc.want)
				}
			}
		})
	}
	if _, err := Builtins()["label-selector-filter"]("f", json.RawMessage(`{"matchExpressions":[{"key":"a","operator":"Near"}]}`)); err == nil {
		t.Error("unknown operator accepted")
	}
}

func scored(scores ...float64) []Scored {
	out := make([]Scored, len(scores))
	for i, s := range scores {
		out[i] = Scored{Endpoint: ep(fmt.Sprintf("10.0.0.%d:8000", i), nil, nil), Score: s}
	}
	return out
}

// lockedRand is a seeded, goroutine-safe source for deterministic tests.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) Float64() float64 { l.mu.Lock(); defer l.mu.Unlock(); return l.r.Float64() }
func (l *lockedRand) IntN(n int) int   { l.mu.Lock(); defer l.mu.Unlock(); return l.r.IntN(n) }
func (l *lockedRand) Shuffle(n int, swap func(i, j int)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.r.Shuffle(n, swap)
}

func seeded() *lockedRand { return &lockedRand{r: rand.New(rand.NewPCG(1, 2))} }

func TestHeaderTestingFilter(t *testing.T) {
	eps := []Endpoint{
		ep("10.0.0.1:8000", nil, nil),
		ep("10.0.0.1:8001", nil, nil), // a second data-parallel rank of the same pod
		ep("10.0.0.2:8000", nil, nil),
		ep("[fd00::3]:8000", nil, nil),
	}
	cases := []struct {
		name   string
		header *string
		want   []string
	}{
		{"no header keeps all", nil, []string{"10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "[fd00::3]:8000"}},
		{"empty header keeps all", ptr(" "), []string{"10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "[fd00::3]:8000"}},
		{"exact ip:port", ptr("10.0.0.2:8000"), []string{"10.0.0.2:8000"}},
		{"ip alone keeps every rank", ptr("10.0.0.1"), []string{"10.0.0.1:8000", "10.0.0.1:8001"}},
		{"list with spaces", ptr(" 10.0.0.1:8001 , 10.0.0.2:8000"), []string{"10.0.0.1:8001", "10.0.0.2:8000"}},
		{"ipv6 spelt differently", ptr("[fd00:0::3]:8000"), []string{"[fd00::3]:8000"}},
		{"wrong port", ptr("10.0.0.2:9000"), nil},
		{"unknown ip", ptr("256.256.256.256"), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := &Request{Headers: map[string]string{}}
			if tc.header != nil {
				req.Headers[EndpointSelectionHeader] = *tc.header
			}
			got := build(t, HeaderTestingFilterType, "").(Filter).Filter(context.Background(), req, eps)
			var addrs []string
			for _, e := range got {
				addrs = append(addrs, e.Address)
			}
			if fmt.Sprint(addrs) != fmt.Sprint(tc.want) {
				t.Fatalf("kept %v, want %v", addrs, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestMaxScorePicker(t *testing.T) {
	p := build(t, "max-score-picker", `{"maxNumOfEndpoints":2}`).(Picker)
	SetRand(p, seeded())
	got := p.Pick(context.Background(), scored(0.2, 0.9, 0.5))
	if len(got) != 2 || got[0].Score != 0.9 || got[1].Score != 0.5 {
		t.Fatalf("picked %v", got)
	}
	// Ties break at random: over many picks each tied endpoint wins.
	one := build(t, "max-score-picker", "").(Picker)
	SetRand(one, seeded())
	wins := map[string]int{}
	for range 200 {
		wins[one.Pick(context.Background(), scored(0.7, 0.7, 0.1))[0].Address]++
	}
	if wins["10.0.0.0:8000"] < 50 || wins["10.0.0.1:8000"] < 50 || wins["10.0.0.2:8000"] != 0 {
		t.Fatalf("tie-break wins %v", wins)
	}
}

func TestRandomPickerDistinct(t *testing.T) {
	p := build(t, "random-picker", `{"maxNumOfEndpoints":3}`).(Picker)
	SetRand(p, seeded())
	for range 50 {
		got := p.Pick(context.Background(), scored(1, 0, 0, 0, 0))
		seen := map[string]bool{}
		for _, g := range got {
			if seen[g.Address] {
				t.Fatalf("duplicate in %v", got)
			}
			seen[g.Address] = true
		}
		if len(got) != 3 {
			t.Fatalf("picked %d", len(got))
		}
	}
}

func TestWeightedRandomPickerFollowsScores(t *testing.T) {
	p := build(t, "weighted-random-picker", "").(Picker)
	SetRand(p, seeded())
	wins := map[string]int{}
	const n = 4000
	for range n {
		wins[p.Pick(context.Background(), scored(0.75, 0.25, 0))[0].Address]++
	}
	// Expected shares 0.75 / 0.25 / 0; allow a generous band.
	if share := float64(wins["10.0.0.0:8000"]) / n; share < 0.68 || share > 0.82 {
		t.Fatalf("share of the 0.75 endpoint = %.3f", share)
	}
	if wins["10.0.0.2:8000"] != 0 {
		t.Fatal("a zero-score endpoint won while positive ones existed")
	}
	// All zero: uniform, nobody starves.
	zero := map[string]int{}
	for range 300 {
		zero[p.Pick(context.Background(), scored(0, 0, 0))[0].Address]++
	}
	if len(zero) != 3 {
		t.Fatalf("all-zero picks %v", zero)
	}
}

// wild is a scorer that misbehaves, to check the framework clamps.
type wild struct{ named }

func (wild) Score(_ context.Context, _ *Request, _ []Endpoint, s []float64) {
	s[0], s[1], s[2] = 7, -3, math.NaN()
}

func TestProfileClampsAndWeights(t *testing.T) {
	prof := &Profile{
		Name: "p",
		Scorers: []WeightedScorer{
			{Scorer: wild{named{"wild", "wild"}}, Weight: 2},
			{Scorer: build(t, "queue-scorer", "").(Scorer), Weight: 1},
		},
		Picker: build(t, "max-score-picker", `{"maxNumOfEndpoints":3}`).(Picker),
	}
	eps := []Endpoint{ep("a:1", &datastore.Metrics{}, nil), ep("b:1", &datastore.Metrics{}, nil), ep("c:1", &datastore.Metrics{}, nil)}
	res, err := prof.Run(context.Background(), &Request{}, eps)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, s := range res.Targets {
		got[s.Address] = s.Score
	}
	if got["a:1"] != 3 || got["b:1"] != 1 || got["c:1"] != 1 {
		t.Fatalf("scores %v; want a=2*1+1, b=2*0+1, c=2*0(NaN)+1", got)
	}
	if len(res.Candidates) != 3 {
		t.Fatalf("candidates %d, want all 3", len(res.Candidates))
	}
}

func TestFilterRemovingAllStopsTheProfile(t *testing.T) {
	prof := &Profile{Name: "p", Filters: []Filter{build(t, "label-selector-filter", `{"matchLabels":{"x":"y"}}`).(Filter)}, Picker: build(t, "max-score-picker", "").(Picker)}
	s := &Scheduler{Handler: build(t, "single-profile-handler", "").(ProfileHandler), Profiles: map[string]*Profile{"p": prof}}
	if _, err := s.Schedule(context.Background(), &Request{}, []Endpoint{ep("a:1", nil, nil)}); err == nil {
		t.Fatal("want ErrNoCandidates")
	}
}

// BenchmarkSchedule measures one decision of the default profile (queue 2,
// kv-cache 2, lora-affinity 1, max-score picker) over n endpoints.
func BenchmarkSchedule(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			s := &Scheduler{
				Handler: build(b, "single-profile-handler", "").(ProfileHandler),
				Profiles: map[string]*Profile{"default": {
					Name: "default",
					Scorers: []WeightedScorer{
						{Scorer: build(b, "queue-scorer", "").(Scorer), Weight: 2},
						{Scorer: build(b, "kv-cache-utilization-scorer", "").(Scorer), Weight: 2},
						{Scorer: build(b, "lora-affinity-scorer", "").(Scorer), Weight: 1},
					},
					Picker: build(b, "max-score-picker", "").(Picker),
				}},
			}
			eps := make([]Endpoint, n)
			for i := range eps {
				eps[i] = ep(fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256), &datastore.Metrics{
					WaitingQueueSize: i % 7, RunningRequests: i % 5, KVCacheUsage: float64(i%10) / 10,
					ActiveAdapters: adapters("a"), MaxActiveAdapters: 2, UpdatedAt: time.Now(),
				}, nil)
			}
			req := &Request{Model: "a"}
			work := make([]Endpoint, n)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				copy(work, eps)
				if _, err := s.Schedule(context.Background(), req, work); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestPromptIsParsedOnDemand(t *testing.T) {
	r := &Request{Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)}
	if r.prompt != nil {
		t.Fatal("prompt parsed before anyone asked")
	}
	if r.Prompt() != "hi" || r.Prompt() != "hi" {
		t.Fatalf("prompt %q", r.Prompt())
	}
	if (&Request{}).Prompt() != "" {
		t.Fatal("body-less request has a prompt")
	}
}

// TestRequestAttrs: a plugin reads what another stored under its key, the
// last value stored wins, and a key nobody stored reads nil.
func TestRequestAttrs(t *testing.T) {
	var r Request
	r.SetAttr("a", 1)
	r.SetAttr("b", "two")
	r.SetAttr("a", 3)
	for _, tc := range []struct {
		key  string
		want any
	}{{"a", 3}, {"b", "two"}, {"c", nil}} {
		if got := r.Attr(tc.key); got != tc.want {
			t.Errorf("Attr(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
	if len(r.attrs) != 2 {
		t.Errorf("%d values held, want 2", len(r.attrs))
	}
}
