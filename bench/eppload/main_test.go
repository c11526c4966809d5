package main

import (
	"bytes"
	"encoding/json"
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
		whole := bytes.Join(b, nil)
		if len(whole) != tc.size || len(b) != tc.chunks || b.size() != tc.size {
			t.Errorf("size %d chunk %d: %d bytes in %d chunks, want %d in %d", tc.size, tc.chunk, len(whole), len(b), tc.size, tc.chunks)
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
