package inference

import (
	"encoding/json"
	"errors"
	"math"
	"slices"
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

// TestMaxTokensFields: every cap field is returned with its value as
// written, and only a plain non-negative integer counts.
func TestMaxTokensFields(t *testing.T) {
	type field struct {
		name, json   string
		n            int64
		ok, repeated bool
	}
	cases := []struct {
		name, body string
		want       []field
	}{
		{"none", `{"model":"m"}`, nil},
		{"all three, in field order", `{"max_output_tokens":3,"max_completion_tokens":2000,"max_tokens":10}`,
			[]field{{"max_tokens", "10", 10, true, false}, {"max_completion_tokens", "2000", 2000, true, false}, {"max_output_tokens", "3", 3, true, false}}},
		{"zero", `{"max_tokens":0}`, []field{{"max_tokens", "0", 0, true, false}}},
		{"escaped key", `{"max\u005ftokens":7}`, []field{{"max_tokens", "7", 7, true, false}}},
		{"fraction", `{"max_tokens":2000.0}`, []field{{"max_tokens", "2000.0", 0, false, false}}},
		{"exponent", `{"max_tokens":2e3}`, []field{{"max_tokens", "2e3", 0, false, false}}},
		{"string", `{"max_tokens":"2000"}`, []field{{"max_tokens", `"2000"`, 0, false, false}}},
		{"negative", `{"max_tokens":-1}`, []field{{"max_tokens", "-1", 0, false, false}}},
		{"minus zero", `{"max_tokens":-0}`, []field{{"max_tokens", "-0", 0, false, false}}},
		{"boolean", `{"max_tokens":true}`, []field{{"max_tokens", "true", 0, false, false}}},
		{"null", `{"max_tokens":null}`, []field{{"max_tokens", "null", 0, false, false}}},
		{"object", `{"max_tokens":{}}`, []field{{"max_tokens", "{}", 0, false, false}}},
		{"beyond int64", `{"max_tokens":99999999999999999999}`, []field{{"max_tokens", "99999999999999999999", math.MaxInt64, true, false}}},
		{"repeated key, the last is read", `{"max_tokens":5000,"max_tokens":10}`, []field{{"max_tokens", "10", 10, true, true}}},
		{"nested caps are not the request's", `{"metadata":{"max_tokens":5}}`, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Parse([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			var got []field
			for _, f := range b.MaxTokensFields() {
				if string(b.Raw()[f.Start:f.End]) != string(f.JSON) {
					t.Errorf("%s: span %v is %q, JSON %q", f.Name, f.Span, b.Raw()[f.Start:f.End], f.JSON)
				}
				n, ok := f.Count()
				got = append(got, field{f.Name, string(f.JSON), n, ok, f.Repeated})
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
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
