package inference

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestTextEdits: new values given to texts become edits of the body. A
// text of the body is replaced by its new value quoted; the texts of one
// encoded document (tool-call arguments) are replaced in the decoded
// document, which replaces the string that held it, encoded again with
// its layout kept; a number of a document given a value becomes a string.
func TestTextEdits(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		// set maps a text's value to its new one.
		set  map[string]string
		want string
	}{
		{"a content string",
			`{"messages":[{"role":"user","content":"my secret"}]}`,
			map[string]string{"my secret": "my [X]"},
			`{"messages":[{"role":"user","content":"my [X]"}]}`},
		{"a new value quoted as JSON requires",
			`{"prompt":"a"}`,
			map[string]string{"a": "q\" b\\ n\n t\t c\x01 ls\u2028 é"},
			`{"prompt":"q\" b\\ n\n t\t c\u0001 ls\u2028 é"}`},
		{"an escaped string replaced whole",
			`{"prompt":"line\none \u0041"}`,
			map[string]string{"line\none A": "[X]"},
			`{"prompt":"[X]"}`},
		{"a string of tool-call arguments, layout kept",
			`{"messages":[{"tool_calls":[{"function":{"arguments":"{\"a\": \"secret\", \"b\": 1}"}}]}]}`,
			map[string]string{"secret": "[X]"},
			`{"messages":[{"tool_calls":[{"function":{"arguments":"{\"a\": \"[X]\", \"b\": 1}"}}]}]}`},
		{"two texts of one document make one edit",
			`{"messages":[{"tool_calls":[{"function":{"arguments":"{\"secret\":\"secret\"}"}}]}]}`,
			map[string]string{"secret": "s"},
			`{"messages":[{"tool_calls":[{"function":{"arguments":"{\"s\":\"s\"}"}}]}]}`},
		{"a number of a document becomes a string",
			`{"messages":[{"tool_calls":[{"function":{"arguments":"{\"n\":[4111111111111111,true]}"}}]}]}`,
			map[string]string{"4111111111111111": "[CARD]"},
			`{"messages":[{"tool_calls":[{"function":{"arguments":"{\"n\":[\"[CARD]\",true]}"}}]}]}`},
		{"escapes inside a document read decoded",
			`{"messages":[{"tool_calls":[{"function":{"arguments":"{\"ssn\":\"078\\u002d05\\u002d1120\"}"}}]}]}`,
			map[string]string{"078-05-1120": "[SSN]"},
			`{"messages":[{"tool_calls":[{"function":{"arguments":"{\"ssn\":\"[SSN]\"}"}}]}]}`},
		{"two documents in a row, then a plain text",
			`{"messages":[{"tool_calls":[{"function":{"arguments":"[\"x\"]"}},{"function":{"arguments":"[\"x\",\"y\"]"}}]},{"content":"x"}]}`,
			map[string]string{"x": "1", "y": "2"},
			`{"messages":[{"tool_calls":[{"function":{"arguments":"[\"1\"]"}},{"function":{"arguments":"[\"1\",\"2\"]"}}]},{"content":"1"}]}`},
		{"a plain text, then a document, then a plain text",
			`{"system":"x","messages":[{"tool_calls":[{"function":{"arguments":"{\"k\":\"x\"}"}}]},{"content":"x"}]}`,
			map[string]string{"x": "a\"b"},
			`{"system":"a\"b","messages":[{"tool_calls":[{"function":{"arguments":"{\"k\":\"a\\\"b\"}"}}]},{"content":"a\"b"}]}`},
		{"no new value, no edit",
			`{"prompt":"x"}`,
			nil,
			`{"prompt":"x"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Parse([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			var te TextEdits
			b.Texts(func(tx Text) bool {
				if v, ok := tc.set[tx.Value()]; ok {
					te.Set(tx, v)
				}
				return true
			})
			got := string(b.Rewrite(te.Edits()))
			if got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			if !json.Valid([]byte(got)) {
				t.Fatalf("not valid JSON: %s", got)
			}
		})
	}
}

// TestTextReadWithoutCopy: Head, Len, Is and WriteValue, which read a
// text without decoding it into a string of its own, agree with Value
// (and Value with encoding/json) for escapes of every kind, and the walk
// finds the end of a string whatever backslashes come before a quote.
func TestTextReadWithoutCopy(t *testing.T) {
	raws := []string{`""`, `"abc"`, `"\n x"`, `"\u0041b"`, `"\ud83d\ude00!"`, `"\ud83d"`, `"\ud83dx"`, `"\ude00"`,
		`"\u00e9t\u00e9"`, `"\\\""`, `"a\/b"`, `"\\"`, `"\\\\"`, `"x\"\\\"y"`, `"\t"`, `"é"`, `"\u2028"`, `"\b\f\r"`}
	body := `{"prompt":[` + strings.Join(raws, ",") + `]}`
	b, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var got []Text
	b.Texts(func(tx Text) bool {
		got = append(got, tx)
		return true
	})
	if len(got) != len(raws) {
		t.Fatalf("walked %d texts, want %d", len(got), len(raws))
	}
	for i, tx := range got {
		var want string
		if err := json.Unmarshal([]byte(raws[i]), &want); err != nil {
			t.Fatal(err)
		}
		if v := tx.Value(); v != want {
			t.Errorf("%s: Value %q, want %q", raws[i], v, want)
		}
		if string(b.s.b[tx.Start:tx.End]) != raws[i] {
			t.Errorf("%s: span covers %s", raws[i], b.s.b[tx.Start:tx.End])
		}
		n, first := tx.Head()
		wantFirst := byte(0)
		if want != "" {
			wantFirst = want[0]
		}
		if n != len(want) || first != wantFirst || tx.Len() != len(want) {
			t.Errorf("%s: Head %d %#x, Len %d; want %d %#x", raws[i], n, first, tx.Len(), len(want), wantFirst)
		}
		var sb strings.Builder
		tx.WriteValue(&sb)
		if sb.String() != want {
			t.Errorf("%s: WriteValue %q, want %q", raws[i], sb.String(), want)
		}
		if !tx.Is(want) || tx.Is(want+"x") {
			t.Errorf("%s: Is disagrees with the value %q", raws[i], want)
		}
	}
}

// TestDocumentNumberRead: a number of an encoded document is a text as
// Python prints the value its json module reads (integers as written,
// floats by repr), read alike by every accessor.
func TestDocumentNumberRead(t *testing.T) {
	for _, c := range []struct{ token, want string }{
		{"-12.5e3", "-12500.0"},
		{"4.111111111111111e15", "4111111111111111.0"},
		{"4111111111111111E0", "4111111111111111.0"},
		{"41111111111111110000", "41111111111111110000"},
		{"1e16", "1e+16"},
		{"0.00001", "1e-05"},
		{"2.50", "2.5"},
		{"-0.0", "-0.0"},
		{"1e999", "Infinity"},
		{"7", "7"},
	} {
		b, err := Parse([]byte(`{"messages":[{"tool_calls":[{"function":{"arguments":"[` + c.token + `]"}}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		b.Texts(func(tx Text) bool {
			n++
			var sb strings.Builder
			tx.WriteValue(&sb)
			l, first := tx.Head()
			if tx.Value() != c.want || sb.String() != c.want || l != len(c.want) || first != c.want[0] || !tx.Is(c.want) {
				t.Errorf("%s read as %q / %q / %d %q, want %q", c.token, tx.Value(), sb.String(), l, first, c.want)
			}
			return true
		})
		if n != 1 {
			t.Fatalf("%s: walked %d texts", c.token, n)
		}
	}
}
