package scheduling

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

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

func TestMaxScorePicker(t *testing.T) {
	p := build(t, "max-score-picker", `{"maxNumOfEndpoints":2}`).(Picker)
	setRand(p, seeded())
	got := p.Pick(context.Background(), scored(0.2, 0.9, 0.5))
	if len(got) != 2 || got[0].Score != 0.9 || got[1].Score != 0.5 {
		t.Fatalf("picked %v", got)
	}
	// Ties break at random: over many picks each tied endpoint wins.
	one := build(t, "max-score-picker", "").(Picker)
	setRand(one, seeded())
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
	setRand(p, seeded())
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
	setRand(p, seeded())
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
