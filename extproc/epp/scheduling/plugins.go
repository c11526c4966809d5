package scheduling

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/inference/wire"
)

// Factory builds a plugin instance from its config name and raw JSON
// parameters (nil when absent).
type Factory func(name string, params json.RawMessage) (Plugin, error)

// Builtins returns the plugin types this scheduler provides, by type name.
func Builtins() map[string]Factory {
	return map[string]Factory{
		"label-selector-filter":        newLabelSelectorFilter,
		HeaderTestingFilterType:        simple(HeaderTestingFilterType, func(n named) Plugin { return headerTestingFilter{n} }),
		"queue-scorer":                 simple("queue-scorer", func(n named) Plugin { return queueScorer{n} }),
		"kv-cache-utilization-scorer":  simple("kv-cache-utilization-scorer", func(n named) Plugin { return kvCacheScorer{n} }),
		"running-requests-size-scorer": simple("running-requests-size-scorer", func(n named) Plugin { return runningScorer{n} }),
		"lora-affinity-scorer":         simple("lora-affinity-scorer", func(n named) Plugin { return loraAffinityScorer{n} }),
		"max-score-picker":             pickerFactory("max-score-picker", func(p basePicker) Plugin { return &maxScorePicker{p} }),
		"random-picker":                pickerFactory("random-picker", func(p basePicker) Plugin { return &randomPicker{p} }),
		"weighted-random-picker":       pickerFactory("weighted-random-picker", func(p basePicker) Plugin { return &weightedRandomPicker{p} }),
		PrefixProducerType:             newPrefixProducer,
		"prefix-cache-scorer":          newPrefixScorer,
		"prefix-cache-affinity-filter": newPrefixAffinityFilter,
		"no-hit-lru-scorer":            newNoHitLRUScorer,
		"single-profile-handler":       simple("single-profile-handler", func(n named) Plugin { return singleProfileHandler{n} }),
	}
}

// DecodeParams decodes plugin parameters strictly so a typo is an error,
// not a silently ignored knob.
func DecodeParams(params json.RawMessage, into any) error {
	if len(params) == 0 || string(params) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("parameters: %w", err)
	}
	return nil
}

// simple makes a factory for plugins without parameters.
func simple(typ string, mk func(named) Plugin) Factory {
	return func(name string, params json.RawMessage) (Plugin, error) {
		if err := DecodeParams(params, &struct{}{}); err != nil {
			return nil, err
		}
		return mk(named{typ: typ, name: name}), nil
	}
}

// ---- filters ----

type labelSelectorFilter struct {
	named
	match map[string]string
	exprs []labelExpr
}

type labelExpr struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

func newLabelSelectorFilter(name string, params json.RawMessage) (Plugin, error) {
	var p struct {
		MatchLabels      map[string]string `json:"matchLabels"`
		MatchExpressions []labelExpr       `json:"matchExpressions"`
	}
	if err := DecodeParams(params, &p); err != nil {
		return nil, err
	}
	if len(p.MatchLabels) == 0 && len(p.MatchExpressions) == 0 {
		return nil, fmt.Errorf("parameters: matchLabels or matchExpressions is required")
	}
	for i, e := range p.MatchExpressions {
		switch e.Operator {
		case "In", "NotIn":
			if len(e.Values) == 0 {
				return nil, fmt.Errorf("parameters.matchExpressions[%d]: operator %s needs values", i, e.Operator)
			}
		case "Exists", "DoesNotExist":
		default:
			return nil, fmt.Errorf("parameters.matchExpressions[%d].operator: %q (want In, NotIn, Exists or DoesNotExist)", i, e.Operator)
		}
	}
	return &labelSelectorFilter{named: named{"label-selector-filter", name}, match: p.MatchLabels, exprs: p.MatchExpressions}, nil
}

func (f *labelSelectorFilter) Filter(_ context.Context, _ *Request, eps []Endpoint) []Endpoint {
	out := make([]Endpoint, 0, len(eps))
	for _, e := range eps {
		if f.matches(e.Labels) {
			out = append(out, e)
		}
	}
	return out
}

func (f *labelSelectorFilter) matches(labels map[string]string) bool {
	for k, v := range f.match {
		if labels[k] != v {
			return false
		}
	}
	for _, e := range f.exprs {
		v, ok := labels[e.Key]
		switch e.Operator {
		case "In":
			if !ok || !slices.Contains(e.Values, v) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(e.Values, v) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		}
	}
	return true
}

// HeaderTestingFilterType keeps only the endpoints a request names in
// EndpointSelectionHeader. It exists for tests: conformance suites use it to
// steer requests, and the routing benchmark's oracle to apply its hand
// split through the same path as every other picker. Any client can steer
// its own request with the header, so production profiles leave it out.
const HeaderTestingFilterType = "header-based-testing-filter"

// EndpointSelectionHeader lists the endpoints a request may go to, as a
// comma-separated list of IPs or ip:port. The payload processor removes a
// client's copy, so steering works only on a path without it.
const EndpointSelectionHeader = wire.EndpointSelectionHeader

type headerTestingFilter struct{ named }

// Filter keeps the named endpoints; a request naming none of the
// candidates keeps none, so it is answered 503 rather than routed
// somewhere the test did not ask for. A request without the header (or
// with an empty one) keeps them all, as the upstream conformance suite's
// picker does: its body-less status probes name no endpoint.
func (headerTestingFilter) Filter(_ context.Context, req *Request, eps []Endpoint) []Endpoint {
	list := req.Headers[EndpointSelectionHeader]
	if strings.TrimSpace(list) == "" {
		return eps
	}
	set := datastore.NewAddressSet()
	set.AddList(list)
	out := make([]Endpoint, 0, 1)
	for _, e := range eps {
		if set.Allows(e.Endpoint) {
			out = append(out, e)
		}
	}
	return out
}

// ---- scorers ----
//
// An endpoint whose metrics are unknown (never scraped, stale, or failing)
// gets the mean of the known scores: it neither wins nor loses on a signal
// it cannot report, so it keeps receiving traffic by the other signals.

// fillUnknown sets the score of every endpoint without metrics to the mean
// of the others (0.5 when none is known).
func fillUnknown(eps []Endpoint, scores []float64) {
	sum, n := 0.0, 0
	for i, e := range eps {
		if e.Metrics != nil {
			sum += scores[i]
			n++
		}
	}
	if n == len(eps) {
		return
	}
	fill := 0.5
	if n > 0 {
		fill = sum / float64(n)
	}
	for i, e := range eps {
		if e.Metrics == nil {
			scores[i] = fill
		}
	}
}

// minMaxLower scores value v low-is-better: (max−v)/(max−min), 1 when all equal.
func minMaxLower(eps []Endpoint, scores []float64, value func(*Endpoint) float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range eps {
		if eps[i].Metrics == nil {
			continue
		}
		v := value(&eps[i])
		lo, hi = min(lo, v), max(hi, v)
	}
	for i := range eps {
		if eps[i].Metrics == nil {
			continue
		}
		if hi == lo {
			scores[i] = 1
			continue
		}
		scores[i] = (hi - value(&eps[i])) / (hi - lo)
	}
	fillUnknown(eps, scores)
}

type queueScorer struct{ named }

func (queueScorer) Score(_ context.Context, _ *Request, eps []Endpoint, scores []float64) {
	minMaxLower(eps, scores, func(e *Endpoint) float64 { return float64(e.Metrics.WaitingQueueSize) })
}

type runningScorer struct{ named }

func (runningScorer) Score(_ context.Context, _ *Request, eps []Endpoint, scores []float64) {
	minMaxLower(eps, scores, func(e *Endpoint) float64 { return float64(e.Metrics.RunningRequests) })
}

type kvCacheScorer struct{ named }

func (kvCacheScorer) Score(_ context.Context, _ *Request, eps []Endpoint, scores []float64) {
	for i, e := range eps {
		if e.Metrics != nil {
			scores[i] = 1 - e.Metrics.KVCacheUsage
		}
	}
	fillUnknown(eps, scores)
}

// loraAffinityScorer prefers servers where the requested adapter already
// runs, then servers with room to load it, then servers where it waits.
type loraAffinityScorer struct{ named }

func (loraAffinityScorer) Score(_ context.Context, req *Request, eps []Endpoint, scores []float64) {
	for i, e := range eps {
		m := e.Metrics
		if m == nil {
			continue
		}
		_, active := m.ActiveAdapters[req.Model]
		_, waiting := m.WaitingAdapters[req.Model]
		switch {
		case active:
			scores[i] = 1
		case len(m.ActiveAdapters) < m.MaxActiveAdapters:
			scores[i] = 0.8
		case waiting:
			scores[i] = 0.6
		default:
			scores[i] = 0
		}
	}
	fillUnknown(eps, scores)
}

// ---- pickers ----

type basePicker struct {
	named
	max int
	rnd rng
}

func pickerFactory(typ string, mk func(basePicker) Plugin) Factory {
	return func(name string, params json.RawMessage) (Plugin, error) {
		p := struct {
			MaxNumOfEndpoints int `json:"maxNumOfEndpoints"`
		}{MaxNumOfEndpoints: 1}
		if err := DecodeParams(params, &p); err != nil {
			return nil, err
		}
		if p.MaxNumOfEndpoints < 1 {
			return nil, fmt.Errorf("parameters.maxNumOfEndpoints: must be at least 1, got %d", p.MaxNumOfEndpoints)
		}
		return mk(basePicker{named: named{typ, name}, max: p.MaxNumOfEndpoints, rnd: sharedRand{}}), nil
	}
}

// SetRand replaces a picker's randomness (tests use a seeded source).
func SetRand(p Picker, r rng) {
	switch p := p.(type) {
	case *maxScorePicker:
		p.rnd = r
	case *randomPicker:
		p.rnd = r
	case *weightedRandomPicker:
		p.rnd = r
	}
}

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

// ---- profile handlers ----

// singleProfileHandler runs the one configured profile once.
type singleProfileHandler struct{ named }

func (singleProfileHandler) Profiles(_ context.Context, _ *Request, all map[string]*Profile, done map[string]*ProfileResult) []*Profile {
	if len(done) > 0 {
		return nil
	}
	for _, p := range all {
		return []*Profile{p}
	}
	return nil
}

func (singleProfileHandler) Primary(done map[string]*ProfileResult) (string, error) {
	for name := range done {
		return name, nil
	}
	return "", fmt.Errorf("single-profile-handler: %w", ErrNoCandidates)
}
