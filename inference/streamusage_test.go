package inference

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestStreamUsageEdit(t *testing.T) {
	for _, c := range []struct {
		name, body string
		edit       bool
		options    string // stream_options after the edit, as compact JSON
	}{
		{"not streaming", `{"model":"m","messages":[]}`, false, ""},
		{"stream false", `{"model":"m","stream":false}`, false, ""},
		{"no stream_options", `{"model":"m","stream":true}`, true, `{"include_usage":true}`},
		{"white space first", " \n {\"model\":\"m\",\"stream\":true}", true, `{"include_usage":true}`},
		{"asked not to", `{"model":"m","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`, true, `{"continuous_usage_stats":true,"include_usage":true}`},
		{"null options", `{"model":"m","stream":true,"stream_options":null}`, true, `{"include_usage":true}`},
		{"already asks", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := Parse([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			e, ok := b.StreamUsageEdit()
			if ok != c.edit {
				t.Fatalf("edit %t, want %t", ok, c.edit)
			}
			if !ok {
				return
			}
			out := b.Rewrite([]Edit{e})
			var got struct {
				Model         string          `json:"model"`
				Stream        bool            `json:"stream"`
				StreamOptions json.RawMessage `json:"stream_options"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("rewritten body is not JSON: %v\n%s", err, out)
			}
			if got.Model != "m" || !got.Stream || string(got.StreamOptions) != c.options {
				t.Fatalf("rewritten to %s", out)
			}
			if _, err := Parse(out); err != nil {
				t.Fatalf("rewritten body does not parse again: %v", err)
			}
		})
	}
}

// TestUsageChunkFilter feeds a stream cut at every byte and checks the
// usage-only event, and only it, is gone.
func TestUsageChunkFilter(t *testing.T) {
	const (
		first  = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n"
		second = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\r\n\r\n"
		usage  = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2,\"total_tokens\":13}}\n\n"
		done   = "data: [DONE]\n\n"
	)
	for _, c := range []struct {
		name, in, want string
	}{
		{"usage chunk dropped", first + second + usage + done, first + second + done},
		{"no usage chunk", first + second + done, first + second + done},
		{"usage on a chunk with choices kept", first + strings.Replace(usage, `"choices":[]`, `"choices":[{"delta":{}}]`, 1) + done, first + strings.Replace(usage, `"choices":[]`, `"choices":[{"delta":{}}]`, 1) + done},
		{"stream ends without a newline", first + strings.TrimRight(usage, "\n"), first},
	} {
		t.Run(c.name, func(t *testing.T) {
			for cut := 0; cut <= len(c.in); cut++ {
				var f UsageChunkFilter
				got := string(f.Write([]byte(c.in[:cut]), false)) + string(f.Write([]byte(c.in[cut:]), true))
				if got != c.want {
					t.Fatalf("cut at %d:\n got %q\nwant %q", cut, got, c.want)
				}
			}
		})
	}
}

// TestStreamAsServersReadIt: "stream" is a stream whenever the model
// server (pydantic, lax mode) reads it as true.
func TestStreamAsServersReadIt(t *testing.T) {
	for _, c := range []struct {
		value  string
		stream bool
	}{
		{`true`, true}, {`1`, true}, {`1.0`, true}, {`"true"`, true}, {`"True"`, true}, {`"1"`, true},
		{`"yes"`, true}, {`"on"`, true}, {`"t"`, true}, {`"Y"`, true},
		{`false`, false}, {`0`, false}, {`2`, false}, {`"false"`, false}, {`"0"`, false}, {`"no"`, false},
		{`"tru\u0065"`, true}, {`null`, false}, {`[]`, false}, {`{}`, false},
	} {
		b, err := Parse([]byte(`{"model":"m","stream":` + c.value + `}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Stream(); got != c.stream {
			t.Errorf("stream %s: Stream() = %t, want %t", c.value, got, c.stream)
		}
		if _, edit := b.StreamUsageEdit(); edit != c.stream {
			t.Errorf("stream %s: usage edit %t, want %t", c.value, edit, c.stream)
		}
	}
}
