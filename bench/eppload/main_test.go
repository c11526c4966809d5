package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
)

// TestChatBody: the body is valid JSON of exactly the size asked for, cut
// into the chunks asked for, or refused when too small.
func TestChatBody(t *testing.T) {
	for _, tc := range []struct {
		size, chunk, chunks int
	}{
		{1024, 0, 1},
		{65536, 16384, 4},
		{65537, 16384, 5},
		{300, 1000, 1},
	} {
		b, err := chatBody("m", tc.size, tc.chunk)
		if err != nil {
			t.Fatalf("size %d: %v", tc.size, err)
		}
		whole := bytes.Join(b.chunks, nil)
		if len(whole) != tc.size || len(b.chunks) != tc.chunks || len(b.bodies) != tc.chunks || b.size() != tc.size {
			t.Errorf("size %d chunk %d: %d bytes in %d chunks, want %d in %d", tc.size, tc.chunk, len(whole), len(b.chunks), tc.size, tc.chunks)
		}
		for i, m := range b.bodies {
			if rb := m.GetRequestBody(); !bytes.Equal(rb.GetBody(), b.chunks[i]) || rb.GetEndOfStream() != (i == len(b.bodies)-1) {
				t.Errorf("size %d: body message %d does not carry chunk %d, end of stream only on the last", tc.size, i, i)
			}
		}
		var cl string
		for _, h := range b.headers.GetRequestHeaders().GetHeaders().GetHeaders() {
			if h.GetKey() == "content-length" {
				cl = string(h.GetRawValue())
			}
		}
		if cl != strconv.Itoa(tc.size) {
			t.Errorf("size %d: content-length %q", tc.size, cl)
		}
		var v struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal(whole, &v); err != nil || v.Model != "m" {
			t.Errorf("size %d: not a chat request for m: %v", tc.size, err)
		}
	}
	if _, err := chatBody("m", 150, 0); err == nil {
		t.Error("a 150-byte chat request: want an error")
	}
}
