package scheduling

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

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
	if first, again := r.Prompt(), r.Prompt(); first != "hi" || again != "hi" {
		t.Fatalf("prompt %q, then %q", first, again)
	}
	if (&Request{}).Prompt() != "" {
		t.Fatal("body-less request has a prompt")
	}
}

// TestForgetPromptKeepsItsLength: once decided, the request lets go of
// its prompt text but what is told after (the prefix learner's Served)
// still reads its length, even with the body gone too.
func TestForgetPromptKeepsItsLength(t *testing.T) {
	r := &Request{Body: []byte(`{"model":"m","prompt":"twelve bytes"}`)}
	if n := r.PromptLen(); n != 12 {
		t.Fatalf("prompt length %d, want 12", n)
	}
	r.Body = []byte{}
	r.ForgetPrompt()
	if r.prompt != nil || r.Prompt() != "" {
		t.Fatalf("prompt text kept after ForgetPrompt: %q", r.Prompt())
	}
	if n := r.PromptLen(); n != 12 {
		t.Errorf("prompt length after ForgetPrompt %d, want 12", n)
	}
	unread := &Request{Body: []byte(`{"model":"m","prompt":"abc"}`)}
	unread.ForgetPrompt() // never parsed: nothing to let go of, and the length still comes from the body
	if n := unread.PromptLen(); n != 3 {
		t.Errorf("prompt length of a request never parsed %d, want 3", n)
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
