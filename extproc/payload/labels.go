package payload

import (
	"strings"
	"unicode/utf8"

	"github.com/infergate/infergate/inference/policy"
)

// Metric label values come only from the configuration, never from what a
// client sent: a client that names a new model for every request would
// otherwise add a series each time, and a 100 kB model name would add
// 100 kB to every scrape.
const (
	// otherLabel is the model label of every model the configuration does
	// not name, and of any configured name or rule longer than
	// maxLabelBytes.
	otherLabel = "other"
	// maxLabelBytes bounds every label value the processor sets.
	maxLabelBytes = 128
)

// modelLabels is the set of model names the metrics may carry as their
// model label: the configured base models and adapters (the file's and the
// adapter ConfigMaps'), and the allow-list entries that are literal names.
// A prefix entry ("meta-llama/*") names no model: what follows the prefix
// is the client's, so those models are counted as otherLabel, as are
// unknown models passed through. Safe for concurrent reads.
type modelLabels map[string]struct{}

func newModelLabels(c *policy.Config) modelLabels {
	l := modelLabels{}
	if c == nil {
		return l
	}
	add := func(name string) {
		if name != otherLabel && boundedLabel(name) {
			l[name] = struct{}{}
		}
	}
	for _, b := range c.Models.Bases {
		add(b.Name)
		for _, a := range b.Adapters {
			add(a)
		}
	}
	for _, a := range c.Models.Allow {
		if !strings.HasSuffix(a, "*") {
			add(a)
		}
	}
	return l
}

// of is the model label for a request's model.
func (l modelLabels) of(model string) string {
	if _, ok := l[model]; ok {
		return model
	}
	return otherLabel
}

// ruleLabel is the rule label of a configured rule name: the name itself,
// unless it is longer than the bound.
func ruleLabel(rule string) string {
	if boundedLabel(rule) {
		return rule
	}
	return otherLabel
}

// boundedLabel reports whether s can be a label value as it is: not empty,
// at most maxLabelBytes, valid UTF-8 (Prometheus refuses anything else).
func boundedLabel(s string) bool {
	return s != "" && len(s) <= maxLabelBytes && utf8.ValidString(s)
}
