package epp

import (
	"testing"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

func TestRewritesPick(t *testing.T) {
	rs := Rewrites{
		{Models: []string{"sql-lora"}, Targets: []datastore.RewriteTarget{{Model: "sql-lora-v1", Weight: 90}, {Model: "sql-lora-v2", Weight: 10}}},
		{Models: []string{"off"}, Targets: []datastore.RewriteTarget{{Model: "x", Weight: 0}}},
		{Targets: []datastore.RewriteTarget{{Model: "default-model", Weight: 1}}}, // every other model
	}
	cases := []struct {
		model string
		draw  int
		want  string
		ok    bool
	}{
		{"sql-lora", 0, "sql-lora-v1", true},
		{"sql-lora", 89, "sql-lora-v1", true},
		{"sql-lora", 90, "sql-lora-v2", true},
		{"off", 0, "", false},                        // all weights 0: no rewrite
		{"chat", 0, "default-model", true},           // catch-all rule
		{"default-model", 0, "default-model", false}, // already the target
	}
	for _, tc := range cases {
		got, ok := rs.pick(tc.model, func(n int) int { return tc.draw % n })
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s draw %d: got %q %v, want %q %v", tc.model, tc.draw, got, ok, tc.want, tc.ok)
		}
	}
}

func TestRewriteModel(t *testing.T) {
	got, err := rewriteModel([]byte(`{"prompt":"x","mod\u0065l" : "a","stream":true}`), `b"c`)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != `{"prompt":"x","mod\u0065l" : "b\"c","stream":true}` {
		t.Errorf("got %s", got)
	}
	if _, err := rewriteModel([]byte(`{"prompt":"x"}`), "b"); err == nil {
		t.Error("a body without a model was rewritten")
	}
}
