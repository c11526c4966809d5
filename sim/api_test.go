package sim

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

const base = DefaultModel

func TestGenerateJSON(t *testing.T) {
	ts := start(t, Config{Name: "sim-0", LoRAAdapters: []string{"sql-lora"}, TimeScale: 1000})
	tests := []struct {
		name, path, body string
		object           string
		promptTokens     int
		completionTokens int
	}{
		{
			name: "completion string", path: "/v1/completions",
			body:   `{"model":"` + base + `","prompt":"0123456789","max_tokens":3}`,
			object: "text_completion", promptTokens: 3, completionTokens: 3,
		},
		{
			name: "completion array uses default max tokens", path: "/v1/completions",
			body:   `{"model":"sql-lora","prompt":["abcd","efgh"]}`,
			object: "text_completion", promptTokens: 2, completionTokens: DefaultMaxTokens,
		},
		{
			name: "chat string content", path: "/v1/chat/completions",
			body:   `{"model":"` + base + `","messages":[{"role":"system","content":"abcd"},{"role":"user","content":"efghi"}],"max_tokens":2}`,
			object: "chat.completion", promptTokens: 3, completionTokens: 2,
		},
		{
			name: "chat content parts and max_completion_tokens", path: "/v1/chat/completions",
			body:   `{"model":"` + base + `","messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"efgh"}]}],"max_tokens":9,"max_completion_tokens":4}`,
			object: "chat.completion", promptTokens: 2, completionTokens: 4,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := ts.post(t, context.Background(), tt.path, tt.body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if got := resp.Header.Get("Content-Type"); got != "application/json" {
				t.Errorf("Content-Type = %q", got)
			}
			r := decode[wireResponse](t, body)
			if r.Object != tt.object || r.ID == "" || r.Model == "" {
				t.Errorf("envelope = %+v", r)
			}
			if len(r.Choices) != 1 || r.Choices[0].FinishReason == nil || *r.Choices[0].FinishReason != "length" {
				t.Fatalf("choices = %s", body)
			}
			var text string
			if c := r.Choices[0]; tt.object == "chat.completion" {
				if c.Message == nil || c.Message.Role != "assistant" {
					t.Fatalf("message = %s", body)
				}
				text = c.Message.Content
			} else if c.Text != nil {
				text = *c.Text
			}
			if want := outputText(ts.tok, tt.completionTokens); text != want {
				t.Errorf("text = %q, want %q", text, want)
			}
			u := r.Usage
			if u == nil || u.PromptTokens != tt.promptTokens || u.CompletionTokens != tt.completionTokens ||
				u.TotalTokens != tt.promptTokens+tt.completionTokens || u.PromptTokensDetails == nil {
				t.Errorf("usage = %s", body)
			}
		})
	}
}

func TestGenerateStream(t *testing.T) {
	ts := start(t, Config{TimeScale: 1000})
	tests := []struct {
		name, path   string
		chat, usage  bool
		streamOption string
	}{
		{name: "completion", path: "/v1/completions"},
		{name: "completion with usage", path: "/v1/completions", usage: true},
		{name: "chat", path: "/v1/chat/completions", chat: true},
		{name: "chat with usage", path: "/v1/chat/completions", chat: true, usage: true},
	}
	const maxTokens = 5
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prompt := `"prompt":"hello world!"`
			if tt.chat {
				prompt = `"messages":[{"role":"user","content":"hello world!"}]`
			}
			body := `{"model":"` + base + `",` + prompt + `,"max_tokens":5,"stream":true`
			if tt.usage {
				body += `,"stream_options":{"include_usage":true}`
			}
			resp, raw := ts.post(t, context.Background(), tt.path, body+"}")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, raw)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type = %q", ct)
			}
			events := sseEvents(t, raw)
			if len(events) == 0 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("stream does not end with [DONE]: %q", events)
			}
			var text strings.Builder
			var finished, usages int
			for i, ev := range events[:len(events)-1] {
				c := decode[wireResponse](t, []byte(ev))
				wantObject := "text_completion"
				if tt.chat {
					wantObject = "chat.completion.chunk"
				}
				if c.Object != wantObject {
					t.Errorf("event %d object = %q", i, c.Object)
				}
				if c.Usage != nil {
					usages++
					if len(c.Choices) != 0 || c.Usage.CompletionTokens != maxTokens || c.Usage.PromptTokens != 3 {
						t.Errorf("usage chunk = %s", ev)
					}
					continue
				}
				if len(c.Choices) != 1 {
					t.Fatalf("event %d has %d choices", i, len(c.Choices))
				}
				ch := c.Choices[0]
				if ch.FinishReason != nil {
					finished++
				}
				switch {
				case tt.chat && i == 0:
					if ch.Delta == nil || ch.Delta.Role != "assistant" {
						t.Errorf("first chat chunk = %s", ev)
					}
				case tt.chat:
					if ch.Delta == nil {
						t.Fatalf("chat chunk without delta: %s", ev)
					}
					if ch.Delta.Content != nil {
						text.WriteString(*ch.Delta.Content)
					}
				case ch.Text != nil:
					text.WriteString(*ch.Text)
				}
			}
			if want := outputText(ts.tok, maxTokens); text.String() != want {
				t.Errorf("streamed text = %q, want %q", text.String(), want)
			}
			if finished != 1 {
				t.Errorf("%d chunks with finish_reason, want 1", finished)
			}
			if want := map[bool]int{true: 1}[tt.usage]; usages != want {
				t.Errorf("%d usage chunks, want %d", usages, want)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	ts := start(t, Config{Name: "sim-err", TimeScale: 1000})
	tests := []struct {
		name, path, body string
		header           string
		want             int
		msg              string
	}{
		{name: "malformed JSON", path: "/v1/completions", body: `{"model":`, want: 400, msg: "invalid JSON"},
		{name: "missing model", path: "/v1/completions", body: `{"prompt":"hi"}`, want: 400, msg: "model"},
		{name: "missing prompt", path: "/v1/completions", body: `{"model":"` + base + `"}`, want: 400, msg: "prompt"},
		{name: "token id prompt", path: "/v1/completions", body: `{"model":"` + base + `","prompt":[1,2]}`, want: 400, msg: "prompt"},
		{name: "zero max_tokens", path: "/v1/completions", body: `{"model":"` + base + `","prompt":"x","max_tokens":0}`, want: 400, msg: "max_tokens"},
		{name: "empty messages", path: "/v1/chat/completions", body: `{"model":"` + base + `","messages":[]}`, want: 400, msg: "messages"},
		{name: "bad content", path: "/v1/chat/completions", body: `{"model":"` + base + `","messages":[{"role":"user","content":7}]}`, want: 400, msg: "content"},
		{name: "unknown model", path: "/v1/completions", body: `{"model":"nope","prompt":"x"}`, want: 404, msg: "nope"},
		{name: "unknown route", path: "/v1/embeddings", body: `{}`, want: 404, msg: "no route"},
		{name: "X-Return-Error 503", path: "/v1/completions", body: `{"model":"` + base + `","prompt":"x"}`, header: "503", want: 503, msg: "503"},
		{name: "X-Return-Error 429", path: "/v1/chat/completions", body: `not even JSON`, header: "429", want: 429, msg: "429"},
		{name: "X-Return-Error invalid", path: "/v1/completions", body: `{}`, header: "teapot", want: 400, msg: "X-Return-Error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var headers []string
			if tt.header != "" {
				headers = []string{"X-Return-Error", tt.header}
			}
			resp, body := ts.post(t, context.Background(), tt.path, tt.body, headers...)
			if resp.StatusCode != tt.want {
				t.Fatalf("status = %d, want %d: %s", resp.StatusCode, tt.want, body)
			}
			e := decode[wireError](t, body)
			if e.Error == nil || e.Error.Code != tt.want || e.Error.Type == "" || !strings.Contains(e.Error.Message, tt.msg) {
				t.Errorf("error body = %s, want message containing %q", body, tt.msg)
			}
			if resp.Header.Get("x-inference-pod") != "sim-err" || resp.Header.Get("x-inference-port") != ts.port {
				t.Errorf("identity headers missing on error: %v", resp.Header)
			}
		})
	}
}

func TestIdentityHeaders(t *testing.T) {
	ts := start(t, Config{Name: "sim-7", TimeScale: 1000})
	for _, path := range []string{"/health", "/metrics", "/v1/models"} {
		resp, _ := ts.get(t, path)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: status %d", path, resp.StatusCode)
		}
		if got := resp.Header.Get("x-inference-pod"); got != "sim-7" {
			t.Errorf("GET %s: x-inference-pod = %q", path, got)
		}
		if got := resp.Header.Get("x-inference-port"); got != ts.port {
			t.Errorf("GET %s: x-inference-port = %q, want %q", path, got, ts.port)
		}
	}
	resp, _ := ts.post(t, context.Background(), "/v1/completions", completionBody(base, "hi", 1))
	if resp.Header.Get("x-inference-pod") != "sim-7" || resp.Header.Get("x-inference-port") != ts.port {
		t.Errorf("completion identity headers = %v", resp.Header)
	}
}

func TestModels(t *testing.T) {
	ts := start(t, Config{Model: "base-model", LoRAAdapters: []string{"a1", "a2"}})
	resp, body := ts.get(t, "/v1/models")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	type entry struct {
		ID     string  `json:"id"`
		Object string  `json:"object"`
		Root   string  `json:"root"`
		Parent *string `json:"parent"`
	}
	list := decode[struct {
		Object string  `json:"object"`
		Data   []entry `json:"data"`
	}](t, body)
	if list.Object != "list" || len(list.Data) != 3 {
		t.Fatalf("models = %s", body)
	}
	if d := list.Data[0]; d.ID != "base-model" || d.Parent != nil || d.Root != "base-model" || d.Object != "model" {
		t.Errorf("base entry = %+v", d)
	}
	for i, name := range []string{"a1", "a2"} {
		d := list.Data[i+1]
		if d.ID != name || d.Root != name || d.Parent == nil || *d.Parent != "base-model" {
			t.Errorf("adapter entry %d = %s", i, body)
		}
	}
}

func TestHealth(t *testing.T) {
	ts := start(t, Config{})
	if resp, _ := ts.get(t, "/health"); resp.StatusCode != http.StatusOK {
		t.Fatalf("health: %d", resp.StatusCode)
	}
}
