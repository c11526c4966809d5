package inference

import (
	"encoding/json"
	"runtime"
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
		{"json over a mebibyte", "application/json", `{"pad":"` + strings.Repeat("x", 3<<20) + `","usage":{"prompt_tokens":1}}`, Usage{1, 0, 1}, true},
		{"usage first, white space", "application/json", " {\n \"usage\" : { \"input_tokens\" : 4 , \"output_tokens\":2 } ,\n \"content\":[]}", Usage{4, 2, 6}, true},
		{"escaped key", "application/json", `{"\u0075sage":{"prompt_tokens":3,"completion_tokens":1}}`, Usage{3, 1, 4}, true},
		{"nested usage is not the answer's", "application/json",
			`{"choices":[{"message":{"content":"{\"usage\":{\"prompt_tokens\":9}}","usage":{"prompt_tokens":8}}}],"x":"}\\"}`, Usage{}, false},
		{"strings with braces and quotes", "application/json",
			`{"a":"}{[\"],:","b":["usage",{"usage":1}],"usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":0}}}`,
			Usage{5, 6, 11}, true},
		{"usage null", "application/json", `{"usage":null}`, Usage{}, false},
		{"usage not an object", "application/json", `{"usage":"a lot"}`, Usage{}, false},
		{"truncated body", "application/json", `{"usage":{"prompt_tokens":1`, Usage{}, false},
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

// TestUsageReaderHoldsNoAnswer: a large non-streamed answer is metered
// without the reader holding it (an answer in flight must not cost its
// size).
func TestUsageReaderHoldsNoAnswer(t *testing.T) {
	body := []byte(`{"choices":[{"message":{"content":"` + strings.Repeat("token ", 1<<20) + `"}}],"usage":{"prompt_tokens":10,"completion_tokens":1048576}}`)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	u := NewUsageReader("application/json")
	for b := body; len(b) > 0; {
		n := min(64<<10, len(b))
		u.Write(b[:n])
		b = b[n:]
	}
	got, found := u.Usage()
	runtime.ReadMemStats(&after)
	if want := (Usage{10, 1 << 20, 1<<20 + 10}); !found || got != want {
		t.Fatalf("got %+v %v, want %+v", got, found, want)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<10 {
		t.Errorf("reading a %d-byte answer allocated %d bytes", len(body), alloc)
	}
}

// FuzzUsageReader: on any JSON object the streaming reader finds what
// decoding the whole document finds under its "usage" key (exactly that
// key, the last if repeated), however the body is cut into chunks.
func FuzzUsageReader(f *testing.F) {
	f.Add(`{"usage":{"prompt_tokens":1,"completion_tokens":2}}`, 3)
	f.Add(`{"a":["usage",{"usage":{"prompt_tokens":4}}],"usage":{"input_tokens":5}}`, 1)
	f.Add(`{"\u0075sage":{"total_tokens":7},"s":"\"}"}`, 2)
	f.Fuzz(func(t *testing.T, doc string, chunk int) {
		var top map[string]json.RawMessage
		if json.Unmarshal([]byte(doc), &top) != nil || top == nil {
			return
		}
		want := UsageReader{}
		if v, ok := top["usage"]; ok {
			want.readUsage(v)
		}
		chunk = max(1, chunk%64)
		u := NewUsageReader("application/json")
		for b := []byte(doc); len(b) > 0; {
			n := min(chunk, len(b))
			u.Write(b[:n])
			b = b[n:]
		}
		got, found := u.Usage()
		wantUsage, wantFound := want.Usage()
		if got != wantUsage || found != wantFound {
			t.Fatalf("streamed %+v %v, whole %+v %v", got, found, wantUsage, wantFound)
		}
	})
}
