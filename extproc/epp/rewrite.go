package epp

import "github.com/infergate/infergate/inference"

// rewriteModel returns body with its top-level "model" replaced: a model
// rewrite (datastore.ModelRewrite) applied.
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
