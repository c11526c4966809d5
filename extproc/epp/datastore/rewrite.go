package datastore

import "slices"

// ModelRewrite is one model rewrite rule a pool source provides (an
// InferenceModelRewrite rule in Kubernetes): requests for one of Models
// (any model when empty) go to the targets in proportion to their weights.
type ModelRewrite struct {
	Models  []string
	Targets []RewriteTarget
}

// RewriteTarget is a model to rewrite to and its relative weight.
type RewriteTarget struct {
	Model  string
	Weight int
}

// SetModelRewrites replaces the rules in effect, first match first (the
// pool's InferenceModelRewrites, oldest object first). The store keeps
// rules: the caller must not modify them afterwards.
func (s *Store) SetModelRewrites(rules []ModelRewrite) {
	rules = slices.Clip(rules)
	s.rewrites.Store(&rules)
}

// ModelRewrite returns the first rule in effect that applies to model, as
// the reference picker's Datastore.ModelRewriteGet does; ok is false when
// none does.
func (s *Store) ModelRewrite(model string) (ModelRewrite, bool) {
	for _, r := range *s.rewrites.Load() {
		if len(r.Models) == 0 || slices.Contains(r.Models, model) {
			return r, true
		}
	}
	return ModelRewrite{}, false
}

// Pick draws one of the rule's target models in proportion to their
// weights (a negative weight counts as 0); ok is false when every weight
// is 0. intn draws a number in [0, n).
func (r ModelRewrite) Pick(intn func(n int) int) (string, bool) {
	total := 0
	for _, t := range r.Targets {
		total += max(t.Weight, 0)
	}
	if total == 0 {
		return "", false
	}
	n := intn(total)
	for _, t := range r.Targets {
		if n -= max(t.Weight, 0); n < 0 {
			return t.Model, true
		}
	}
	return "", false // unreachable while intn keeps to [0, n)
}
