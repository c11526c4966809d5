package payload

import (
	"strings"
	"testing"

	"github.com/infergate/infergate/inference/policy"
)

func TestModelLabels(t *testing.T) {
	long := strings.Repeat("m", maxLabelBytes+1)
	edge := strings.Repeat("m", maxLabelBytes)
	l := newModelLabels(&policy.Config{Models: policy.Models{
		Bases: []policy.BaseModel{{Name: "llama", Adapters: []string{"sql-lora", long, edge}}},
		Allow: []string{"gpt-4o", "meta-llama/*", "other", "bad\xff"},
	}})
	for model, want := range map[string]string{
		"llama": "llama", "sql-lora": "sql-lora", "gpt-4o": "gpt-4o", edge: edge, // configured
		long:                      "other", // configured, but over the bound
		"meta-llama/":             "other", // a prefix entry names no model
		"meta-llama/Llama-3.1-8B": "other",
		"meta-llama/*":            "other",
		"unknown":                 "other",
		"":                        "other",
		"other":                   "other",
		"bad\xff":                 "other", // not UTF-8: Prometheus would refuse it
	} {
		if got := l.of(model); got != want {
			t.Errorf("label of %.20q = %.20q, want %.20q", model, got, want)
		}
	}
	if got := newModelLabels(nil).of("llama"); got != "other" {
		t.Errorf("without a configuration: %q, want other", got)
	}
	for rule, want := range map[string]string{"email": "email", edge: edge, long: "other"} {
		if got := ruleLabel(rule); got != want {
			t.Errorf("ruleLabel(%.20q) = %.20q, want %.20q", rule, got, want)
		}
	}
}
