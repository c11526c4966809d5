package inference

import (
	"strings"
	"testing"
)

// TestUnreadText: the path of the first string neither read by Texts nor
// under a key known to hold no text, or "".
func TestUnreadText(t *testing.T) {
	cases := []struct{ name, body, want string }{
		{"openai chat with tools",
			`{"model":"m","user":"u1","stop":["\n"],"service_tier":"auto","tool_choice":{"type":"function","function":{"name":"weather"}},"stream":true,"stream_options":{"include_usage":true},"response_format":{"type":"json_object"},"logit_bias":{"50256":-100},"metadata":{"team":"a","nested":{"k":"v"}},
			"tools":[{"type":"function","function":{"name":"weather","description":"d","strict":true,"parameters":{"type":"object","title":"W","properties":{"city":{"type":"string","description":"c","examples":["Paris"]},"unit":{"type":"string","enum":["c","f"],"default":"c"}},"required":["city"]}}}],
			"messages":[{"role":"system","content":"s"},{"role":"user","name":"bob","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral","ttl":"5m"}},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBOR","detail":"low"}},{"type":"input_audio","input_audio":{"data":"UklGRg","format":"wav"}}]},
			{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]}`,
			""},
		{"responses with function_call_output",
			`{"model":"m","instructions":"be brief","previous_response_id":"resp_1","truncation":"auto","include":["reasoning.encrypted_content"],"reasoning":{"effort":"low","summary":"auto"},"text":{"verbosity":"low"},"prompt_cache_key":"k",
			"input":[{"role":"user","content":[{"type":"input_text","text":"q"},{"type":"input_image","image_url":"https://x/a.png","detail":"auto"},{"type":"input_file","file_id":"f1","filename":"a.pdf","file_data":"JVBER"}]},
			{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"thought"}],"encrypted_content":"gAAA"},
			{"type":"function_call","id":"fc_1","call_id":"c","name":"f","arguments":"{}","status":"completed"},{"type":"function_call_output","call_id":"c","output":"42"}]}`,
			""},
		{"anthropic with documents and thinking",
			`{"model":"claude","max_tokens":1024,"stop_sequences":["END"],"metadata":{"user_id":"u"},"thinking":{"type":"enabled","budget_tokens":512},"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],
			"tools":[{"name":"run","description":"d","input_schema":{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}}],"tool_choice":{"type":"tool","name":"run"},
			"messages":[{"role":"user","content":[{"type":"document","source":{"data":"plain","media_type":"text/plain","type":"text"},"title":"T","context":"C","citations":{"enabled":true}},
			{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBER"}},{"type":"document","source":{"type":"url","url":"https://x/a.pdf"}},
			{"type":"document","source":{"type":"content","content":[{"type":"text","text":"part"}]}},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}}]},
			{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"sig"},{"type":"redacted_thinking","data":"enc"},{"type":"tool_use","id":"t","name":"run","input":{"cmd":"ls"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"out","is_error":false}]}]}`,
			""},
		{"completions with suffix", `{"model":"m","prompt":"p","suffix":"s","n":2,"echo":false,"logprobs":null}`, ""},
		{"embeddings", `{"model":"e","input":["a","b"],"encoding_format":"float","dimensions":256}`, ""},
		{"numbers, booleans and null under unknown keys are not text", `{"model":"m","prompt":"p","x":1,"y":[true,null,-2.5e3],"z":{"w":false}}`, ""},
		{"unknown top-level string", `{"model":"m","prompt":"p","metadata_x":"hi"}`, "metadata_x"},
		{"unknown nested field in a message", `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"user","content":"x","foo":"bar"}]}`, "messages[1].foo"},
		{"tool schema pattern is read (tools are read whole)",
			`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"city":{"type":"string","pattern":"^[A-Z]"}}}}}]}`,
			""},
		{"object in tool schema examples is read",
			`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"city":{"type":"string","examples":["ok",{"name":"n","zip":"1"}]}}}}}]}`,
			""},
		{"a request parameter key nested is like any other", `{"model":"m","messages":[{"role":"user","content":"hi","user":"smuggled"}]}`, "messages[0].user"},
		{"known key with an object value: the object is weighed", `{"model":"m","text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"}}}}`, "text.format.name"},
		{"response_format schema name", `{"model":"m","response_format":{"type":"json_schema","json_schema":{"name":"n"}}}`, "response_format.json_schema.name"},
		{"chat_template_kwargs and documents are read whole", `{"model":"m","messages":[],"chat_template_kwargs":{"enable_thinking":false,"persona":"x","d":{"k":["v"]}},"documents":[{"id":"1","text":"t"}]}`, ""},
		{"assistant reasoning_content and refusal are read", `{"model":"m","messages":[{"role":"assistant","content":"a","reasoning_content":"r","refusal":"no"}]}`, ""},
		{"a role outside the fields read is unread", `{"model":"m","prompt":"p","vars":{"role":"x"}}`, "vars.role"},
		{"anthropic search result citation", `{"model":"m","messages":[{"role":"assistant","content":[{"type":"text","text":"t","citations":[{"type":"char_location","cited_text":"c"}]}]}]}`, "messages[0].content[0].citations[0].cited_text"},
		{"first of a repeated prompt field is not what Texts reads", `{"model":"m","prompt":"a","prompt":"b"}`, "prompt"},
		{"string in an array under an unknown key", `{"model":"m","prompt":"p","tags":[1,"t"]}`, "tags[1]"},
		{"escaped known key passes", `{"m\u006fdel":"m","prompt":"p","t\u0079pe":"x"}`, ""},
		{"escaped unknown key is decoded in the path", `{"model":"m","f\u006fo":"x"}`, "foo"},
		{"odd keys are quoted", `{"model":"m","a.b":{"":"x"}}`, `["a.b"][""]`},
		{"data under an unknown key with no text type passes", `{"model":"m","x":{"data":"AAAA"}}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Parse([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if got := b.UnreadText(); got != tc.want {
				t.Errorf("UnreadText() = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestNonTextKeysUnique: a key is in the table once, so its scope and
// reach are not decided by table order.
func TestNonTextKeysUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range nonTextKeys {
		if seen[k.name] {
			t.Errorf("%q twice", k.name)
		}
		seen[k.name] = true
	}
}

// FuzzUnreadText: on any valid body the check ends without panic, and an
// unknown string field put first is the one named.
func FuzzUnreadText(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"p","x":"y"}`,
		`{"messages":[{"content":[{"data":"a","type":"text"},{"source":{"type":"base64","data":"b"}}]}],"metadata":{"k":"v"}}`,
		`{"tools":[{"function":{"parameters":{"properties":{"c":{"enum":["a"],"pattern":"p"}}}}}]}`,
		`{"":[[["s"]]],"a.b":{"\u0000":1}}`,
		`{}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		b, err := Parse([]byte(body))
		if err != nil {
			return
		}
		_ = b.UnreadText()
		at := strings.IndexByte(body, '{') + 1
		sep := ","
		if strings.TrimLeft(body[at:], " \t\r\n")[0] == '}' {
			sep = ""
		}
		b, err = Parse([]byte(body[:at] + `"zz_unknown":"x"` + sep + body[at:]))
		if err != nil {
			t.Fatal(err)
		}
		if p := b.UnreadText(); p != "zz_unknown" {
			t.Fatalf("UnreadText() = %q, want zz_unknown", p)
		}
	})
}
