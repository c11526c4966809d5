package scheduling

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// Picker plugin types.
const (
	MaxScorePickerType       = "max-score-picker"
	RandomPickerType         = "random-picker"
	WeightedRandomPickerType = "weighted-random-picker"
)

// basePicker is what every picker has: its identity, how many endpoints
// it answers and its randomness.
type basePicker struct {
	named
	max int
	rnd rng
}

// newPicker makes the constructor of a picker type; its parameter says how
// many endpoints it answers, best first (the pick and its fallbacks).
func newPicker(mk func(basePicker) Plugin) constructor {
	return func(id named, params json.RawMessage) (Plugin, error) {
		p := struct {
			MaxNumOfEndpoints int `json:"maxNumOfEndpoints"`
		}{MaxNumOfEndpoints: 1}
		if err := DecodeParams(params, &p); err != nil {
			return nil, err
		}
		if p.MaxNumOfEndpoints < 1 {
			return nil, fmt.Errorf("parameters.maxNumOfEndpoints: must be at least 1, got %d", p.MaxNumOfEndpoints)
		}
		return mk(basePicker{named: id, max: p.MaxNumOfEndpoints, rnd: sharedRand{}}), nil
	}
}

// rng is the randomness source; plugins take one so tests can seed it.
type rng interface {
	Float64() float64
	IntN(n int) int
	Shuffle(n int, swap func(i, j int))
}

var _ rng = (*rand.Rand)(nil)

// sharedRand uses math/rand/v2's goroutine-safe top-level source.
type sharedRand struct{}

func (sharedRand) Float64() float64                   { return rand.Float64() }
func (sharedRand) IntN(n int) int                     { return rand.IntN(n) }
func (sharedRand) Shuffle(n int, swap func(i, j int)) { rand.Shuffle(n, swap) }

// maxScorePicker takes the best scores; equal scores are ordered at random
// so ties spread load instead of always favouring one endpoint.
type maxScorePicker struct{ basePicker }

func (p *maxScorePicker) Pick(_ context.Context, scored []Scored) []Scored {
	if p.max == 1 {
		// One pass; among equal best scores each is kept with probability
		// 1/ties seen so far, which picks uniformly among them.
		best, ties := 0, 1
		for i := 1; i < len(scored); i++ {
			switch {
			case scored[i].Score > scored[best].Score:
				best, ties = i, 1
			case scored[i].Score == scored[best].Score:
				ties++
				if p.rnd.IntN(ties) == 0 {
					best = i
				}
			}
		}
		return scored[best : best+1]
	}
	p.rnd.Shuffle(len(scored), func(i, j int) { scored[i], scored[j] = scored[j], scored[i] })
	sort.SliceStable(scored, func(i, j int) bool { return scored[i].Score > scored[j].Score })
	return scored[:min(p.max, len(scored))]
}

// randomPicker takes endpoints at random, whatever their scores.
type randomPicker struct{ basePicker }

func (p *randomPicker) Pick(_ context.Context, scored []Scored) []Scored {
	p.rnd.Shuffle(len(scored), func(i, j int) { scored[i], scored[j] = scored[j], scored[i] })
	return scored[:min(p.max, len(scored))]
}

// weightedRandomPicker draws without replacement with probability
// proportional to score (A-Res: key = U^(1/w), largest keys win). When no
// endpoint has a positive score it draws uniformly.
type weightedRandomPicker struct{ basePicker }

func (p *weightedRandomPicker) Pick(_ context.Context, scored []Scored) []Scored {
	keys := make([]float64, len(scored))
	anyPositive := false
	for _, s := range scored {
		if s.Score > 0 {
			anyPositive = true
			break
		}
	}
	for i, s := range scored {
		u := p.rnd.Float64()
		switch {
		case !anyPositive:
			keys[i] = u
		case s.Score <= 0:
			keys[i] = -1 // only after every positive-score endpoint
		default:
			keys[i] = math.Pow(u, 1/s.Score)
		}
	}
	idx := make([]int, len(scored))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return keys[idx[a]] > keys[idx[b]] })
	out := make([]Scored, 0, min(p.max, len(scored)))
	for _, i := range idx[:min(p.max, len(scored))] {
		out = append(out, scored[i])
	}
	return out
}
