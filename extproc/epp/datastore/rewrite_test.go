package datastore

import "testing"

func TestModelRewrite(t *testing.T) {
	s := New()
	if _, ok := s.ModelRewrite("sql-lora"); ok {
		t.Fatal("a new store rewrites")
	}
	s.SetModelRewrites([]ModelRewrite{
		{Models: []string{"sql-lora"}, Targets: []RewriteTarget{{Model: "sql-lora-v1", Weight: 90}, {Model: "sql-lora-v2", Weight: 10}}},
		{Models: []string{"off"}, Targets: []RewriteTarget{{Model: "x", Weight: 0}, {Model: "y", Weight: -3}}},
		{Targets: []RewriteTarget{{Model: "default-model", Weight: 1}}}, // every other model
	})
	cases := []struct {
		model string
		draw  int
		want  string
		ok    bool
	}{
		{"sql-lora", 0, "sql-lora-v1", true},
		{"sql-lora", 89, "sql-lora-v1", true},
		{"sql-lora", 90, "sql-lora-v2", true},
		{"off", 0, "", false},                       // all weights 0 or less: no rewrite, and no later rule
		{"chat", 0, "default-model", true},          // catch-all rule
		{"default-model", 0, "default-model", true}, // the picker leaves a model rewritten to itself alone
	}
	for _, tc := range cases {
		rule, ok := s.ModelRewrite(tc.model)
		if !ok {
			t.Fatalf("%s: no rule applies", tc.model)
		}
		got, ok := rule.Pick(func(n int) int { return tc.draw % n })
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s draw %d: got %q %v, want %q %v", tc.model, tc.draw, got, ok, tc.want, tc.ok)
		}
	}
	s.SetModelRewrites(nil)
	if _, ok := s.ModelRewrite("sql-lora"); ok {
		t.Error("cleared rules still apply")
	}
}

func TestObjective(t *testing.T) {
	s := New()
	if o, ok := s.Objective("batch"); ok || o.Priority != 0 {
		t.Fatalf("a new store has objective %+v", o)
	}
	s.SetObjectives([]Objective{{Name: "batch", Priority: -1}, {Name: "chat", Priority: 10}, {Name: "batch", Priority: -2}})
	cases := []struct {
		name     string
		priority int
		ok       bool
	}{{"batch", -2, true}, {"chat", 10, true}, {"", 0, false}, {"other", 0, false}}
	for _, tc := range cases {
		if o, ok := s.Objective(tc.name); o.Priority != tc.priority || ok != tc.ok || (ok && o.Name != tc.name) {
			t.Errorf("Objective(%q) = %+v, %v; want priority %d, %v", tc.name, o, ok, tc.priority, tc.ok)
		}
	}
}

// BenchmarkRequestReads is what the picker reads of the store for every
// request besides the endpoints: the objective's priority and the rewrite
// rule of the model, with a few of each in effect.
func BenchmarkRequestReads(b *testing.B) {
	s := New()
	s.SetObjectives([]Objective{{Name: "batch", Priority: -1}, {Name: "chat", Priority: 10}, {Name: "bulk", Priority: -5}})
	s.SetModelRewrites([]ModelRewrite{
		{Models: []string{"sql-lora"}, Targets: []RewriteTarget{{Model: "sql-lora-v1", Weight: 90}, {Model: "sql-lora-v2", Weight: 10}}},
		{Models: []string{"chat-lora"}, Targets: []RewriteTarget{{Model: "chat-lora-v3", Weight: 1}}},
	})
	b.ReportAllocs()
	for b.Loop() {
		o, _ := s.Objective("chat")
		r, ok := s.ModelRewrite("meta-llama/Llama-3.1-8B-Instruct")
		if o.Priority != 10 || ok || r.Targets != nil {
			b.Fatal("wrong reads")
		}
	}
}
