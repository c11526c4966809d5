package server

import (
	"bytes"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// TestCodecPoolsChunksInTheirOwnTier: a streamed body chunk of the largest
// size the server sends is marshalled into a buffer of at most 64 KiB (gRPC's
// own codec takes 1 MiB for it), comes back intact, and small messages and
// wrong types behave as with gRPC's codec.
func TestCodecPoolsChunksInTheirOwnTier(t *testing.T) {
	c, err := newCodec()
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{0, 100, 20_000, MaxChunkBytes} {
		chunk := bytes.Repeat([]byte{'x'}, size)
		msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: true}}}
		data, err := c.Marshal(msg)
		if err != nil {
			t.Fatalf("%d B: %v", size, err)
		}
		if len(data) != 1 || cap(data[0].ReadOnlyData()) > 64<<10 {
			t.Errorf("%d B: marshalled into %d buffers, the first of capacity %d; want one of at most 64 KiB", size, len(data), cap(data[0].ReadOnlyData()))
		}
		var back extprocv3.ProcessingRequest
		if err := c.Unmarshal(data, &back); err != nil {
			t.Fatalf("%d B: %v", size, err)
		}
		if !bytes.Equal(back.GetRequestBody().GetBody(), chunk) || !back.GetRequestBody().GetEndOfStream() {
			t.Errorf("%d B: the chunk did not come back intact", size)
		}
		data.Free()
	}
	if _, err := c.Marshal("not a message"); err == nil {
		t.Error("marshalling a string: want an error")
	}
	if c.Name() != "proto" {
		t.Errorf("codec name %q, want proto (the content-subtype gateways send)", c.Name())
	}
}
