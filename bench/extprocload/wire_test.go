package extprocload

import (
	"bytes"
	"encoding/binary"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestFieldNumbers: the numbers the driver reads are those of the
// messages' descriptors.
func TestFieldNumbers(t *testing.T) {
	number := func(m proto.Message, name protoreflect.Name) protowire.Number {
		f := m.ProtoReflect().Descriptor().Fields().ByName(name)
		if f == nil {
			t.Fatalf("%T has no field %s", m, name)
		}
		return protowire.Number(f.Number())
	}
	for _, tc := range []struct {
		got  protowire.Number
		want protowire.Number
		name string
	}{
		{fieldResponseRequestHeaders, number(&extprocv3.ProcessingResponse{}, "request_headers"), "request_headers"},
		{fieldResponseRequestBody, number(&extprocv3.ProcessingResponse{}, "request_body"), "request_body"},
		{fieldResponseImmediate, number(&extprocv3.ProcessingResponse{}, "immediate_response"), "immediate_response"},
		{fieldHeadersOrBodyResponse, number(&extprocv3.HeadersResponse{}, "response"), "HeadersResponse.response"},
		{fieldHeadersOrBodyResponse, number(&extprocv3.BodyResponse{}, "response"), "BodyResponse.response"},
		{fieldCommonHeaderMutation, number(&extprocv3.CommonResponse{}, "header_mutation"), "header_mutation"},
		{fieldCommonBodyMutation, number(&extprocv3.CommonResponse{}, "body_mutation"), "body_mutation"},
		{fieldHeaderMutationSetHeaders, number(&extprocv3.HeaderMutation{}, "set_headers"), "set_headers"},
		{fieldBodyMutationStreamed, number(&extprocv3.BodyMutation{}, "streamed_response"), "streamed_response"},
		{fieldStreamedBodyEndOfStream, number(&extprocv3.StreamedBodyResponse{}, "end_of_stream"), "end_of_stream"},
		{fieldImmediateStatus, number(&extprocv3.ImmediateResponse{}, "status"), "ImmediateResponse.status"},
		{fieldHTTPStatusCode, number(&typev3.HttpStatus{}, "code"), "HttpStatus.code"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: the driver reads field %d, the descriptor says %d", tc.name, tc.got, tc.want)
		}
	}
}

// TestAnswerRead: what the driver reads of an encoded answer is what the
// generated code reads of it, for the answers pickers and payload
// processors give, with fields the driver skips around them.
func TestAnswerRead(t *testing.T) {
	set := func(n int) *extprocv3.HeaderMutation {
		hm := &extprocv3.HeaderMutation{RemoveHeaders: []string{"x-drop"}}
		for range n {
			hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte("10.0.0.1:8000")}})
		}
		return hm
	}
	metadata, err := structpb.NewStruct(map[string]any{"envoy.lb": map[string]any{"x-gateway-destination-endpoint": "10.0.0.1:8000"}})
	if err != nil {
		t.Fatal(err)
	}
	streamed := func(eos bool) *extprocv3.ProcessingResponse {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(`{"model":"m"}`), EndOfStream: eos}}}}}}}
	}
	for _, tc := range []struct {
		name string
		msg  *extprocv3.ProcessingResponse
	}{
		{"pick with metadata", &extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
				Status: extprocv3.CommonResponse_CONTINUE_AND_REPLACE, HeaderMutation: set(2), ClearRouteCache: true}}},
			DynamicMetadata: metadata,
		}},
		{"headers answered, none set", &extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: set(0)}}}}},
		{"headers answered, empty", &extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}},
		{"body chunk", streamed(false)},
		{"last body chunk", streamed(true)},
		{"body replaced whole", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("{}")}}}}}}},
		{"immediate 429", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests}, Body: []byte("shed"), Details: "x"}}}},
		{"immediate without status", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{}}}},
		{"response headers", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: set(1)}}}}},
	} {
		b, err := proto.Marshal(tc.msg)
		if err != nil {
			t.Fatal(err)
		}
		want := answer{
			headers:     tc.msg.GetRequestHeaders() != nil,
			setHeaders:  len(tc.msg.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()),
			streamedEnd: tc.msg.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream(),
			immediate:   tc.msg.GetImmediateResponse() != nil,
			status:      uint64(tc.msg.GetImmediateResponse().GetStatus().GetCode()),
		}
		a := answer{setHeaders: 99, streamedEnd: true} // left from an earlier message
		if err := a.read(b); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if a != want {
			t.Errorf("%s: read %+v, want %+v", tc.name, a, want)
		}
	}
}

// TestAnswerReadMalformed: a truncated answer is an error, not a guess.
func TestAnswerReadMalformed(t *testing.T) {
	b, err := proto.Marshal(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "k"}}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n < len(b); n++ {
		var a answer
		if err := a.read(b[:n]); err == nil {
			t.Errorf("the first %d of %d bytes: read %+v, want an error", n, len(b), a)
		}
	}
}

// TestFrame: a gRPC message is its uncompressed flag, its length, then
// the message.
func TestFrame(t *testing.T) {
	m := HeadersMessage(10)
	want, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Frame(m)
	if err != nil {
		t.Fatal(err)
	}
	if f[0] != 0 || int(binary.BigEndian.Uint32(f[1:5])) != len(want) || !bytes.Equal(f[5:], want) {
		t.Errorf("framed % x, want 00, length %d, then the message", f[:5], len(want))
	}
}
