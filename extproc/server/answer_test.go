package server

import (
	"fmt"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
)

func overwrite(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: name, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}

// TestAnswerMessages builds answers one after another in one reused
// answer, as a stream does, and checks each against the message written
// out in full: nothing of an earlier answer may show in a later one.
func TestAnswerMessages(t *testing.T) {
	six := make([]Header, 6)
	sixWant := make([]*corev3.HeaderValueOption, 6)
	for i := range six {
		six[i] = Header{Name: fmt.Sprintf("x-h%d", i), Value: fmt.Sprintf("value %d", i)}
		sixWant[i] = overwrite(six[i].Name, six[i].Value)
	}
	tests := []struct {
		name  string
		build func(a *answer) *extprocv3.ProcessingResponse
		want  *extprocv3.ProcessingResponse
	}{{
		name: "request headers, a destination and a removal",
		build: func(a *answer) *extprocv3.ProcessingResponse {
			return a.headersResponse(&Decision{ClearRouteCache: true, RemoveHeaders: []string{"x-old"},
				SetHeaders: []Header{{Name: "x-gateway-destination-endpoint", Value: "10.0.0.1:8000"}, {Name: "x-b", Value: ""}}}, true)
		},
		want: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders:    []*corev3.HeaderValueOption{overwrite("x-gateway-destination-endpoint", "10.0.0.1:8000"), overwrite("x-b", "")},
				RemoveHeaders: []string{"x-old"},
			}},
		}}},
	}, {
		name:  "response headers unchanged",
		build: func(a *answer) *extprocv3.ProcessingResponse { return a.headersResponse(&Decision{}, false) },
		want: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{},
		}}},
	}, {
		name: "more headers than the answer holds inline",
		build: func(a *answer) *extprocv3.ProcessingResponse {
			return a.headersResponse(&Decision{SetHeaders: six}, false)
		},
		want: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: sixWant}},
		}}},
	}, {
		name: "one header after more",
		build: func(a *answer) *extprocv3.ProcessingResponse {
			return a.headersResponse(&Decision{SetHeaders: []Header{{Name: "x-model", Value: "m"}}}, true)
		},
		want: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{overwrite("x-model", "m")}}},
		}}},
	}, {
		name: "a request body chunk, the last",
		build: func(a *answer) *extprocv3.ProcessingResponse {
			return a.streamedBody([]byte(`{"model":"m"}`), true, true)
		},
		want: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(`{"model":"m"}`), EndOfStream: true},
			}}},
		}}},
	}, {
		name: "a response body chunk, not the last",
		build: func(a *answer) *extprocv3.ProcessingResponse {
			return a.streamedBody([]byte("data: x\n\n"), false, false)
		},
		want: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte("data: x\n\n")},
			}}},
		}}},
	}, {
		name:  "request headers after body chunks",
		build: func(a *answer) *extprocv3.ProcessingResponse { return a.headersResponse(&Decision{}, true) },
		want: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{},
		}}},
	}}
	var p answers
	a := p.get()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.build(a)
			// What goes on the wire: marshalled, and read back.
			b, err := proto.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			back := &extprocv3.ProcessingResponse{}
			if err := proto.Unmarshal(b, back); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(back, tt.want) {
				t.Fatalf("got  %v\nwant %v", back, tt.want)
			}
		})
	}
}

// TestAnswerPutForgetsWhatItReferred checks that an answer back in the
// pool holds no body and no header of the exchange it served: a body may
// be large, and has left the memory budget.
func TestAnswerPutForgetsWhatItReferred(t *testing.T) {
	var p answers
	a := p.get()
	a.streamedBody(make([]byte, 1<<20), true, true)
	a.headersResponse(&Decision{SetHeaders: []Header{{Name: "x-a", Value: "b"}}}, true)
	p.put(a)
	if a.chunk.Body != nil || a.resp.Response != nil || a.values[0].Key != "" || a.options[0].Header != nil {
		t.Fatalf("the pooled answer still refers to its exchange's messages: %+v", a)
	}
	if len(a.raw) != 0 {
		t.Fatalf("the pooled answer's value buffer holds %d bytes", len(a.raw))
	}
}
