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
		{"chat ignores instructions", `{"model":"m","instructions":"long","messages":[{"role":"user","content":"U"}]}`, "m", "U", nil, false},
		{"text of a non-text part, type first", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","text":"alt","image_url":{"url":"u"}},{"type":"text","text":"x"}]}]}`, "m", "x", nil, false},
		{"text of a non-text part, type last", `{"model":"m","messages":[{"role":"user","content":[{"text":"alt","image_url":{"url":"u"},"type":"image_url"},{"text":"x","type":"text"}]}]}`, "m", "x", nil, false},
		{"text of other non-text parts", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","text":"a"},{"type":"input_audio","text":"b"},{"type":"file","text":"c"},{"text":"d","type":"image"},{"type":"input_text","text":"q"}]}]}`, "m", "q", nil, false},
		{"a part with no type is text", `{"model":"m","messages":[{"role":"user","content":[{"text":"x"}]}]}`, "m", "x", nil, false},
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
				if string(b.s.b[f.Start:f.End]) != string(f.JSON) {
					t.Errorf("%s: span %v is %q, JSON %q", f.Name, f.Span, b.s.b[f.Start:f.End], f.JSON)
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
	if b.Messages != nil {
		b.Instr = nil // a chat request: the chat API reads no instructions
	}
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
	// Object fields in document order matter; decode keys in order. A
	// text before the object's type waits for the object's end; a text
	// after a type that is not a text type is not counted.
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	_, _ = dec.Token() // {
	isText, sawType := false, false
	var waiting []string
	for dec.More() {
		kt, _ := dec.Token()
		k, _ := kt.(string)
		var v json.RawMessage
		_ = dec.Decode(&v)
		var str string
		isString := json.Unmarshal(v, &str) == nil
		switch {
		case k == "type":
			if isString {
				sawType = true
				isText = isText || str == "text" || strings.HasSuffix(str, "_text")
			}
		case collect && k == "text" && !isText && !sawType && isString:
			waiting = append(waiting, str)
		case collect && k == "text":
			refText(sb, v, isText || !sawType)
		default:
			refText(sb, v, collect && k == "content")
		}
	}
	if isText || !sawType {
		for _, w := range waiting {
			sb.WriteString(w)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello"}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x\u00e9"},{"type":"image_url","image_url":{"url":"u"}}]}]}`,
		`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"q"}],"stream":true}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"t"}]}]}`,
		`{"model":"m","prompt":["a","b"],"messages":[{"content":{"text":"nested","content":"c"}}]}`,
		`{"model":"m","messages":[{"content":[{"text":"alt","type":"image_url"},{"text":"t","type":"input_text"},{"type":"input_audio","text":"x"}]}],"instructions":"i"}`,
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

// TestTexts: the strings the guardrails read, in the order Texts visits
// them, and what they leave alone.
func TestTexts(t *testing.T) {
	cases := []struct {
		name, body string
		want       []string
	}{
		{"chat roles are text, image URLs are not",
			`{"model":"m","messages":[{"role":"user","name":"bob","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"http://x/a.png","detail":"high"}}]}]}`,
			[]string{"user", "bob", "hi"}},
		{"tool definitions whole, tool call arguments decoded",
			`{"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"type":"string","description":"pd"}}}}}],"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}]}`,
			[]string{"type", "function", "function", "name", "f", "description", "d", "parameters", "type", "object", "properties", "a", "type", "string", "description", "pd",
				"assistant", "f", "a", "1"}},
		{"schema title, enum, const, examples and default",
			`{"tools":[{"name":"t","input_schema":{"title":"T","properties":{"u":{"enum":["c","f",3],"const":"c","examples":["e1"],"default":"f"}}}}]}`,
			[]string{"name", "t", "input_schema", "title", "T", "properties", "u", "enum", "c", "f", "3", "const", "c", "examples", "e1", "default", "f"}},
		{"arguments decoded: escapes inside read as the model reads them",
			`{"messages":[{"tool_calls":[{"function":{"arguments":"{\"ssn\":\"078\\u002d05\\u002d1120\",\"n\":[4111111111111111,true]}"}}]}]}`,
			[]string{"ssn", "078-05-1120", "n", "4111111111111111"}},
		{"arguments with Python's NaN and Infinity are decoded as Python decodes them",
			`{"messages":[{"tool_calls":[{"function":{"arguments":"{\"ssn\":\"078\\u002d05\\u002d1120\",\"x\":NaN,\"y\":[-Infinity,Infinity]}"}}]}]}`,
			[]string{"ssn", "078-05-1120", "x", "y"}},
		{"arguments holding a JSON string are read as its text",
			`{"messages":[{"tool_calls":[{"function":{"arguments":"\"my ssn is 078\\u002d05\\u002d1120\""}}]}]}`,
			[]string{"my ssn is 078-05-1120"}},
		{"numbers of a tool_use input object are read as printed",
			`{"messages":[{"content":[{"type":"tool_use","id":"t","name":"pay","input":{"card":4.111111111111111e15}}]}]}`,
			[]string{"pay", "card", "4111111111111111.0"}},
		{"arguments that are not a document are read as a string",
			`{"input":[{"type":"function_call","arguments":"{\"a\":"},{"type":"function_call","arguments":"plain"},{"arguments":"{}"}]}`,
			[]string{`{"a":`, "plain", "{}"}},
		{"tool_use input keys",
			`{"messages":[{"content":[{"type":"tool_use","input":{"jane@example.com":{"k":["v"]}}}]}]}`,
			[]string{"jane@example.com", "k", "v"}},
		{"reasoning and refusal",
			`{"messages":[{"role":"assistant","reasoning_content":"rc","reasoning":"r","refusal":"no","content":[{"type":"refusal","refusal":"nope"},{"type":"reasoning","text":"t"}]}]}`,
			[]string{"assistant", "rc", "r", "no", "nope", "t"}},
		{"documents and chat_template_kwargs are trees",
			`{"chat_template_kwargs":{"persona":"p","x":{"y":["z",1]}},"documents":[{"title":"T","text":"body","id":"d1"}],"messages":[{"content":"c"}]}`,
			[]string{"persona", "p", "x", "y", "z", "1", "title", "T", "text", "body", "id", "d1", "c"}},
		{"document of plain text: data, title and context",
			`{"messages":[{"content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"doc body"},"title":"Doc","context":"ctx"}]}]}`,
			[]string{"doc body", "Doc", "ctx"}},
		{"type after data",
			`{"messages":[{"content":[{"type":"document","source":{"data":"doc body","media_type":"text/plain","type":"text"},"title":"Doc"}]}]}`,
			[]string{"doc body", "Doc"}},
		{"data between other fields, type last, after a nested value",
			`{"system":[{"data":"a","x":{"text":"inner"},"data":"b","type":"text"}]}`,
			[]string{"inner", "a", "b"}},
		{"escaped data, type and text keys and value",
			`{"messages":[{"content":[{"source":{"d\u0061ta":"doc body","\u0074ype":"t\u0065xt"},"t\u0069tle":"Doc"}]}]}`,
			[]string{"doc body", "Doc"}},
		{"any repeated type of text counts",
			`{"messages":[{"content":[{"source":{"type":"base64","data":"d","type":"text"}}]}]}`,
			[]string{"d"}},
		{"base64 document source is not read",
			`{"messages":[{"content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0xLjQK5551234567"},"title":"Doc"}]}]}`,
			[]string{"Doc"}},
		{"base64 image, type after data, is not read",
			`{"messages":[{"content":[{"type":"image","source":{"data":"iVBORw0KGgo5551234567","media_type":"image/png","type":"base64"}}]}]}`,
			nil},
		{"url document source is not read",
			`{"messages":[{"content":[{"type":"document","source":{"type":"url","url":"https://x/a.pdf"},"context":"c"}]}]}`,
			[]string{"c"}},
		{"data with no type is not read (input_audio)",
			`{"messages":[{"content":[{"type":"input_audio","input_audio":{"data":"UklGRg","format":"wav"}}]}]}`,
			nil},
		{"a nested object's type does not make data text",
			`{"messages":[{"content":[{"data":"d","source":{"type":"text"}}]}]}`,
			nil},
		{"content document source",
			`{"messages":[{"content":[{"type":"document","source":{"type":"content","content":[{"type":"text","text":"part"}]},"title":"T"}]}]}`,
			[]string{"part", "T"}},
		{"non-string type and data",
			`{"messages":[{"content":[{"type":{"text":"t"},"data":{"text":"x"}},{"type":"text","data":["a",{"text":"b"}]}]}]}`,
			[]string{"t", "x", "a", "b"}},
		{"thinking and tool_use input; signature not read",
			`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"sig"},{"type":"redacted_thinking","data":"enc"},{"type":"tool_use","id":"t","name":"run","input":{"cmd":"ls","data":"x"}}]}]}`,
			[]string{"assistant", "hm", "run", "cmd", "ls", "data", "x"}},
		{"responses function_call_output",
			`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"42"}],"instructions":"be brief"}`,
			[]string{"be brief", "f", "{}", "42"}},
		{"completion with suffix", `{"model":"m","prompt":"p","suffix":"s","metadata":{"text":"m"}}`, []string{"p", "s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Parse([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			b.Texts(func(tx Text) bool {
				in, at := b.s.b, tx.Start
				if tx.doc != nil {
					in, at = tx.doc, tx.at
				}
				if string(in[at:at+len(tx.quoted)]) != string(tx.quoted) {
					t.Errorf("text %q is not at %d", tx.quoted, at)
				}
				got = append(got, tx.Value())
				return true
			})
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestTextsStop: fn returning false stops the walk, also among the data
// strings visited when their object ends.
func TestTextsStop(t *testing.T) {
	b, err := Parse([]byte(`{"system":[{"data":"a","data":"b","type":"text"},{"text":"c"}],"messages":[{"content":"d"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	b.Texts(func(tx Text) bool {
		got = append(got, tx.Value())
		return false
	})
	if !slices.Equal(got, []string{"a"}) {
		t.Errorf("got %q", got)
	}
}
