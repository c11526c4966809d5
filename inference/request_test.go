package inference

import (
	"errors"
	"testing"
)

func TestParseRequest(t *testing.T) {
	cases := []struct {
		name, body, model, prompt string
		err                       error
		anyErr                    bool
	}{
		{"completion", `{"model":"m","prompt":"hello"}`, "m", "hello", nil, false},
		{"completion batch", `{"model":"m","prompt":["a","b"]}`, "m", "ab", nil, false},
		{"chat string", `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"U"}]}`, "m", "SU", nil, false},
		{"chat parts", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{}},{"type":"text","text":"y"}]}]}`, "m", "xy", nil, false},
		{"anthropic", `{"model":"claude","system":"sys","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, "claude", "syshi", nil, false},
		{"responses", `{"model":"m","input":"q"}`, "m", "q", nil, false},
		{"missing model", `{"prompt":"x"}`, "", "", ErrMissingModel, false},
		{"empty model", `{"model":"","prompt":"x"}`, "", "", ErrMissingModel, false},
		{"not json", `{"model":`, "", "", nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseRequest([]byte(tc.body))
			switch {
			case tc.err != nil:
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			case tc.anyErr:
				if err == nil {
					t.Fatal("want an error")
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if r.Model != tc.model || r.Prompt != tc.prompt {
				t.Errorf("got model %q prompt %q", r.Model, r.Prompt)
			}
		})
	}
}
