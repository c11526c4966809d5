package scheduling

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

func ep(addr string, m *datastore.Metrics, labels map[string]string) Endpoint {
	return Endpoint{Endpoint: &datastore.Endpoint{Spec: datastore.Spec{Address: addr, Labels: labels}}, Metrics: m}
}

func build(t testing.TB, typ string, params string) Plugin {
	t.Helper()
	var raw json.RawMessage
	if params != "" {
		raw = json.RawMessage(params)
	}
	p, err := Builtins()[typ](typ, raw)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBuiltins pins the plugin type names, which configs spell, and
// checks that every built-in plugin reports the type it was built as and
// its instance name.
func TestBuiltins(t *testing.T) {
	want := []string{"approx-prefix-cache-producer", "header-based-testing-filter", "kv-cache-utilization-scorer",
		"label-selector-filter", "lora-affinity-scorer", "max-score-picker", "no-hit-lru-scorer", "prefix-cache-affinity-filter",
		"prefix-cache-scorer", "queue-scorer", "random-picker", "running-requests-size-scorer", "single-profile-handler",
		"weighted-random-picker"}
	builtins := Builtins()
	var got []string
	for typ := range builtins {
		got = append(got, typ)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("types %q, want %q", got, want)
	}
	params := map[string]json.RawMessage{LabelSelectorFilterType: json.RawMessage(`{"matchLabels":{"a":"b"}}`)}
	for typ, f := range builtins {
		p, err := f("instance", params[typ])
		if err != nil {
			t.Errorf("%s: %v", typ, err)
			continue
		}
		if p.Type() != typ || p.Name() != "instance" {
			t.Errorf("%s built as type %q, name %q", typ, p.Type(), p.Name())
		}
	}
}
