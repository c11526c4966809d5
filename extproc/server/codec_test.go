package server

import (
	"bytes"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
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

// TestCodecAppendsEncodedMetadata: an answer sent with encoded metadata
// reads back as the same answer carrying that metadata, for a small answer
// and for a body chunk marshalled into a pooled buffer.
func TestCodecAppendsEncodedMetadata(t *testing.T) {
	c, err := newCodec()
	if err != nil {
		t.Fatal(err)
	}
	md, err := structpb.NewStruct(map[string]any{"envoy.lb": map[string]any{"x-gateway-destination-endpoint": "10.0.0.1:8000,10.0.0.2:8000"}})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := EncodeMetadata(md)
	if err != nil {
		t.Fatal(err)
	}
	if enc.Struct() != md {
		t.Error("Struct is not the metadata encoded")
	}
	for _, size := range []int{0, 100, MaxChunkBytes} {
		resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{ClearRouteCache: true, BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: bytes.Repeat([]byte{'x'}, size)}}}}}}
		data, err := c.Marshal(&withMetadata{resp: resp, md: enc})
		if err != nil {
			t.Fatalf("%d B: %v", size, err)
		}
		var back extprocv3.ProcessingResponse
		if err := c.Unmarshal(data, &back); err != nil {
			t.Fatalf("%d B: %v", size, err)
		}
		data.Free()
		want := proto.Clone(resp).(*extprocv3.ProcessingResponse)
		want.DynamicMetadata = md
		if !proto.Equal(&back, want) {
			t.Errorf("%d B body: read back %v, want %v", size, &back, want)
		}
	}
}
