package inference

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

// parseModel is the model of body, read as the processors read it: one
// validating pass, then the model from it.
func parseModel(body []byte) (string, error) {
	b, err := Parse(body)
	if err != nil {
		return "", err
	}
	return b.Model()
}

func TestParseModel(t *testing.T) {
	cases := []struct {
		body, want string
		err        error
	}{
		{`{"model":"m"}`, "m", nil},
		{` { "prompt" : "a,b}" , "model" : "llama" } `, "llama", nil},
		{`{"messages":[{"role":"user","content":"{\"model\":\"fake\"}"}],"model":"real"}`, "real", nil},
		{`{"nested":{"model":"inner"},"model":"outer"}`, "outer", nil},
		{`{"n":1,"t":true,"x":null,"f":-1.5e3,"model":"m2"}`, "m2", nil},
		{`{"model":"a\"b"}`, `a"b`, nil},
		{`{"mod\u0065l":"escaped-key"}`, "escaped-key", nil},
		{`{"model":"caf\u00e9"}`, "café", nil},
		{`{"prompt":"x"}`, "", ErrMissingModel},
		{`{"model":""}`, "", ErrMissingModel},
		{`{"model":3}`, "", ErrMissingModel},
		{`{}`, "", ErrMissingModel},
		{`{"model":`, "", ErrInvalidJSON},
		{`["model","m"]`, "", ErrInvalidJSON},
		{`{"model":"a","model":"b"}`, "b", nil},
		{`{"Model":"x"}`, "", ErrMissingModel},
		{"{\"model\":\"\x9c\"}", "", ErrInvalidJSON},
		{`{"model":"m"} x`, "", ErrInvalidJSON},
		{`{"a":01,"model":"m"}`, "", ErrInvalidJSON},
		{`{"model":"\ud83d\ude00"}`, "😀", nil},
		{``, "", ErrInvalidJSON},
	}
	for _, tc := range cases {
		t.Run(tc.body, func(t *testing.T) {
			got, err := parseModel([]byte(tc.body))
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// FuzzParseModel checks the validating pass against encoding/json: it
// accepts exactly the valid UTF-8 JSON objects and finds the same model.
func FuzzParseModel(f *testing.F) {
	for _, s := range []string{`{"model":"m"}`, `{"a":[1,{"model":"x"}],"model":"y"}`, `{"model":"\u00e9"}`, `{"x":"}"}`,
		`{"model":"a","model":"b"}`, `{"model":"\ud83d\ude00"}`, `{"n":-0.5e+3,"model":"m"}`, `{"model":"\ud800"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		got, err := parseModel([]byte(body))
		valid := json.Valid([]byte(body)) && utf8.ValidString(body)
		var obj map[string]any
		isObject := valid && json.Unmarshal([]byte(body), &obj) == nil
		want, _ := obj["model"].(string)
		switch {
		case !isObject:
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("accepted a body that is not a valid JSON object: %v", err)
			}
		case want == "":
			if !errors.Is(err, ErrMissingModel) {
				t.Fatalf("got %q, %v; want ErrMissingModel", got, err)
			}
		case err != nil || got != want:
			t.Fatalf("got %q, %v; want %q", got, err, want)
		}
	})
}
