package epp

import (
	"slices"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/inference"
)

// Rewrites are the model rewrite rules in effect (InferenceModelRewrite,
// e.g. to shift traffic from one adapter version to the next); the first
// rule that matches the requested model applies.
type Rewrites []datastore.ModelRewrite

// pick returns the model a request for model is rewritten to; ok is false
// when no rule applies (or the chosen target is the model itself). intn
// draws a number in [0, n).
func (rs Rewrites) pick(model string, intn func(n int) int) (string, bool) {
	for _, r := range rs {
		if len(r.Models) > 0 && !slices.Contains(r.Models, model) {
			continue
		}
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
				return t.Model, t.Model != model
			}
		}
	}
	return "", false
}

// rewriteModel returns body with its top-level "model" replaced.
func rewriteModel(body []byte, model string) ([]byte, error) {
	b, err := inference.Parse(body)
	if err != nil {
		return nil, err
	}
	sp, ok := b.ModelSpan()
	if !ok {
		return nil, inference.ErrMissingModel
	}
	return b.Rewrite([]inference.Edit{{Span: sp, JSON: inference.AppendQuoted(nil, model)}}), nil
}
