package scheduling

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Factory builds a plugin instance from its config name and raw JSON
// parameters (nil when absent).
type Factory func(name string, params json.RawMessage) (Plugin, error)

// constructor builds a plugin of a type: id holds the type and the
// instance name.
type constructor func(id named, params json.RawMessage) (Plugin, error)

// Builtins returns the plugin types this scheduler provides, by type name.
func Builtins() map[string]Factory {
	constructors := map[string]constructor{
		LabelSelectorFilterType:       newLabelSelectorFilter,
		HeaderTestingFilterType:       simple(func(id named) Plugin { return headerTestingFilter{id} }),
		QueueScorerType:               simple(func(id named) Plugin { return queueScorer{id} }),
		KVCacheUtilizationScorerType:  simple(func(id named) Plugin { return kvCacheScorer{id} }),
		RunningRequestsSizeScorerType: simple(func(id named) Plugin { return runningScorer{id} }),
		LoRAAffinityScorerType:        simple(func(id named) Plugin { return loraAffinityScorer{id} }),
		MaxScorePickerType:            newPicker(func(p basePicker) Plugin { return &maxScorePicker{p} }),
		RandomPickerType:              newPicker(func(p basePicker) Plugin { return &randomPicker{p} }),
		WeightedRandomPickerType:      newPicker(func(p basePicker) Plugin { return &weightedRandomPicker{p} }),
		PrefixProducerType:            newPrefixProducer,
		PrefixCacheScorerType:         newPrefixScorer,
		PrefixAffinityFilterType:      newPrefixAffinityFilter,
		NoHitLRUScorerType:            newNoHitLRUScorer,
		SingleProfileHandlerType:      simple(func(id named) Plugin { return singleProfileHandler{id} }),
	}
	out := make(map[string]Factory, len(constructors))
	for typ, c := range constructors {
		out[typ] = func(name string, params json.RawMessage) (Plugin, error) {
			return c(named{typ: typ, name: name}, params)
		}
	}
	return out
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

// simple makes the constructor of a plugin type without parameters.
func simple(mk func(named) Plugin) constructor {
	return func(id named, params json.RawMessage) (Plugin, error) {
		if err := DecodeParams(params, &struct{}{}); err != nil {
			return nil, err
		}
		return mk(id), nil
	}
}

// named is embedded by every built-in plugin.
type named struct{ typ, name string }

func (n named) Type() string { return n.typ }
func (n named) Name() string { return n.name }
