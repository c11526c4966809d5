package inference

import (
	"strings"
	"testing"
)

func TestUsageReader(t *testing.T) {
	cases := []struct {
		name, contentType, body string
		want                    Usage
		found                   bool
	}{
		{"openai json", "application/json",
			`{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`,
			Usage{12, 5, 17}, true},
		{"openai sse with include_usage", "text/event-stream; charset=utf-8",
			"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\n\ndata: [DONE]\n\n",
			Usage{7, 3, 10}, true},
		{"anthropic sse", "text/event-stream",
			"event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n" +
				"event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"usage\"}}\r\n\r\n" +
				"event: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\r\n\r\n",
			Usage{25, 15, 40}, true},
		{"responses api sse", "text/event-stream",
			"data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":4,\"total_tokens\":13}}}",
			Usage{9, 4, 13}, true},
		{"no usage", "text/event-stream", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", Usage{}, false},
		{"json without usage", "application/json", `{"data":[{"embedding":[0.1]}]}`, Usage{}, false},
		{"oversized json", "application/json", `{"pad":"` + strings.Repeat("x", MaxUsageBuffer) + `","usage":{"prompt_tokens":1}}`, Usage{}, false},
	}
	for _, tc := range cases {
		for _, chunk := range []int{1, 7, 1 << 30} {
			u := NewUsageReader(tc.contentType)
			for b := tc.body; len(b) > 0; {
				n := min(chunk, len(b))
				u.Write([]byte(b[:n]))
				b = b[n:]
			}
			got, found := u.Usage()
			if got != tc.want || found != tc.found {
				t.Errorf("%s, chunks of %d: got %+v %v, want %+v %v", tc.name, chunk, got, found, tc.want, tc.found)
			}
		}
	}
}
