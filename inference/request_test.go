package inference

import (
	"encoding/json"
	"errors"
	"strings"
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
		{"responses instructions", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"q"}]}],"instructions":"be brief"}`, "m", "be briefq", nil, false},
		{"embeddings", `{"model":"e","input":["a","b"]}`, "e", "ab", nil, false},
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

// referencePrompt is the prompt as encoding/json sees the same fields:
// the oracle the one-pass walker is checked against.
func referencePrompt(raw []byte) (string, bool) {
	var b struct {
		Prompt   json.RawMessage `json:"prompt"`
		Messages json.RawMessage `json:"messages"`
		System   json.RawMessage `json:"system"`
		Input    json.RawMessage `json:"input"`
		Instr    json.RawMessage `json:"instructions"`
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(raw, &top) != nil {
		return "", false
	}
	// Exact-key lookups, as the walker does (encoding/json struct decoding
	// would also accept other casings).
	b.Prompt, b.Messages, b.System, b.Input, b.Instr = top["prompt"], top["messages"], top["system"], top["input"], top["instructions"]
	var sb strings.Builder
	for _, v := range []json.RawMessage{b.System, b.Instr, b.Prompt, b.Input, b.Messages} {
		refText(&sb, v, true)
	}
	return sb.String(), true
}

func refText(sb *strings.Builder, raw json.RawMessage, collect bool) {
	if len(raw) == 0 {
		return
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if collect {
			sb.WriteString(s)
		}
		return
	}
	var arr []json.RawMessage
	if json.Unmarshal(raw, &arr) == nil {
		for _, e := range arr {
			refText(sb, e, collect)
		}
		return
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return
	}
	// Object fields in document order matter; decode keys in order.
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	_, _ = dec.Token() // {
	for dec.More() {
		kt, _ := dec.Token()
		k, _ := kt.(string)
		var v json.RawMessage
		_ = dec.Decode(&v)
		refText(sb, v, collect && (k == "text" || k == "content"))
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello"}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x\u00e9"},{"type":"image_url","image_url":{"url":"u"}}]}]}`,
		`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"q"}],"stream":true}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"t"}]}]}`,
		`{"model":"m","prompt":["a","b"],"messages":[{"content":{"text":"nested","content":"c"}}]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		got, err := ParseRequest([]byte(body))
		if err != nil {
			return
		}
		want, ok := referencePrompt([]byte(body))
		if !ok {
			t.Fatalf("parsed a body encoding/json rejects")
		}
		if got.Prompt != want {
			t.Fatalf("prompt %q, reference %q", got.Prompt, want)
		}
	})
}
