package server

import (
	"bytes"
	"maps"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// viewOf is what a stream reads of m, through the generated getters: the
// reference the hand decoder is held to.
func viewOf(m *extprocv3.ProcessingRequest) inbound {
	headers := func(hm *corev3.HeaderMap) Headers {
		h := Headers{}
		for _, hv := range hm.GetHeaders() {
			v := hv.GetValue()
			if len(hv.GetRawValue()) > 0 {
				v = string(hv.GetRawValue())
			}
			h[strings.ToLower(hv.GetKey())] = v
		}
		return h
	}
	v := inbound{metadata: m.GetMetadataContext(), protocol: m.GetProtocolConfig()}
	switch r := m.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		v.kind, v.headers, v.endOfStream = kindRequestHeaders, headers(r.RequestHeaders.GetHeaders()), r.RequestHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		v.kind, v.headers, v.endOfStream = kindResponseHeaders, headers(r.ResponseHeaders.GetHeaders()), r.ResponseHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_RequestBody:
		v.kind, v.body, v.endOfStream = kindRequestBody, r.RequestBody.GetBody(), r.RequestBody.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseBody:
		v.kind, v.body, v.endOfStream = kindResponseBody, r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream()
	case *extprocv3.ProcessingRequest_RequestTrailers:
		v.kind = kindRequestTrailers
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		v.kind = kindResponseTrailers
	}
	return v
}

// sameView reports how got differs from want, "" when it does not.
func sameView(got, want inbound) string {
	switch {
	case got.kind != want.kind:
		return "kind"
	case !maps.Equal(got.headers, want.headers):
		return "headers"
	case !bytes.Equal(got.body, want.body):
		return "body"
	case got.endOfStream != want.endOfStream:
		return "end of stream"
	case (got.metadata == nil) != (want.metadata == nil) || !proto.Equal(got.metadata, want.metadata):
		return "metadata"
	case (got.protocol == nil) != (want.protocol == nil) || !proto.Equal(got.protocol, want.protocol):
		return "protocol configuration"
	}
	return ""
}

func headerValues(kv ...string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for i := 0; i+2 < len(kv)+1; i += 3 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], Value: kv[i+1], RawValue: []byte(kv[i+2])})
	}
	return hm
}

func marshal(t testing.TB, ms ...proto.Message) []byte {
	var b []byte
	for _, m := range ms {
		mb, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, mb...)
	}
	return b
}

// inboundCases are ProcessingRequests as Envoy sends them, and
// concatenations of them, which proto reads as one message merged.
func inboundCases(t testing.TB) map[string][]byte {
	md, err := structpb.NewStruct(map[string]any{"x-gateway-destination-endpoint": "10.0.0.1:8000"})
	if err != nil {
		t.Fatal(err)
	}
	reqHeaders := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerValues(":method", "", "POST", ":path", "", "/v1/chat/completions", "Content-Type", "", "application/json",
				"x-old", "value only", "", "x-both", "value", "raw wins", "x-dup", "", "first", "x-DUP", "", "second", "x-empty", "", ""),
		}},
		ProtocolConfig:  &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": md}},
		Attributes:      map[string]*structpb.Struct{"envoy.filters.http.ext_proc": md},
	}
	body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m"}`), EndOfStream: true}}}
	cases := map[string][]byte{
		"empty": nil,
		"request headers, protocol configuration, metadata and attributes": marshal(t, reqHeaders),
		"request headers ending the stream, no map": marshal(t, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}}),
		"request body":                  marshal(t, body),
		"empty body chunk not the last": marshal(t, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{}}}),
		"response headers": marshal(t, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerValues(":status", "", "200", "content-type", "text/event-stream", ""), EndOfStream: false}}}),
		"response body": marshal(t, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: []byte("data: {}\n\n"), EndOfStream: true}}}),
		"request trailers": marshal(t, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{
			Trailers: headerValues("grpc-status", "0", "")}}}),
		"response trailers":  marshal(t, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}),
		"observability mode": marshal(t, &extprocv3.ProcessingRequest{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}),
		// Concatenated: the oneof's last member wins, the same member and
		// the other message fields merge.
		"headers then body":   marshal(t, reqHeaders, body),
		"body then headers":   marshal(t, body, reqHeaders),
		"headers merged":      marshal(t, reqHeaders, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerValues("x-dup", "", "third", "x-more", "", "more"), EndOfStream: true}}}),
		"end of stream stays": marshal(t, body, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("x")}}}),
		"many headers": marshal(t, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerValues(strings.Split(strings.Repeat("X-Header-Name,value,raw value,", 40)+"last,,", ",")...)}}}),
	}
	return cases
}

// TestInboundReadsWhatProtoReads holds the hand decoder to proto.Unmarshal
// and the generated getters, message by message.
func TestInboundReadsWhatProtoReads(t *testing.T) {
	for name, b := range inboundCases(t) {
		t.Run(name, func(t *testing.T) {
			want := &extprocv3.ProcessingRequest{}
			if err := proto.Unmarshal(b, want); err != nil {
				t.Fatal(err)
			}
			var got inbound
			if err := got.unmarshal(b); err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			if diff := sameView(got, viewOf(want)); diff != "" {
				t.Fatalf("%s differs:\ngot  %+v\nwant %+v", diff, got, viewOf(want))
			}
		})
	}
}

func TestInboundRefusesWhatProtoRefuses(t *testing.T) {
	headers := marshal(t, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: headerValues("x-key", "", "value")}}})
	badKey := bytes.Replace(headers, []byte("x-key"), []byte("x-k\xffy"), 1)
	tests := map[string][]byte{
		"truncated":                 headers[:len(headers)-3],
		"a length past the end":     {0x12, 0x40, 0x0a},
		"a key not UTF-8":           badKey,
		"a tag of field number 0":   {0x00, 0x01},
		"a truncated varint in eos": {0x12, 0x02, 0x18, 0x80},
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			if proto.Unmarshal(b, &extprocv3.ProcessingRequest{}) == nil {
				t.Fatalf("proto reads %q; the case is wrong", b)
			}
			var in inbound
			if err := in.unmarshal(b); err == nil {
				t.Fatalf("unmarshalled %q without an error: %+v", b, in)
			}
		})
	}
}

// FuzzInbound: whatever proto reads, the hand decoder reads alike; on
// anything, it does not panic. (go test runs the seeds; go test -fuzz
// FuzzInbound explores.)
func FuzzInbound(f *testing.F) {
	for _, b := range inboundCases(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got inbound
		err := got.unmarshal(b)
		want := &extprocv3.ProcessingRequest{}
		if proto.Unmarshal(b, want) != nil {
			return // the decoder may read what proto refuses in fields it skips
		}
		if err != nil {
			t.Fatalf("proto reads %q, the decoder does not: %v", b, err)
		}
		if diff := sameView(got, viewOf(want)); diff != "" {
			t.Fatalf("%s differs for %q:\ngot  %+v\nwant %+v", diff, b, got, viewOf(want))
		}
	})
}

// BenchmarkInbound decodes a request's headers message as Envoy sends it
// (a dozen headers), by hand and by proto with the conversion it replaced.
func BenchmarkInbound(b *testing.B) {
	msg := marshal(b, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerValues(
			":authority", "", "gateway.example.com", ":path", "", "/v1/chat/completions", ":method", "", "POST", ":scheme", "", "https",
			"content-type", "", "application/json", "content-length", "", "1024", "user-agent", "", "python-requests/2.32.3",
			"accept", "", "*/*", "x-forwarded-proto", "", "https", "x-request-id", "", "0f6b6c2e-2a8f-4b8e-9d1c-3b1f6c0e9a7d",
			"authorization", "", "Bearer sk-0123456789abcdef", "x-envoy-expected-rq-timeout-ms", "", "300000")}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
	})
	b.Run("inbound", func(b *testing.B) {
		b.ReportAllocs()
		var in inbound
		for b.Loop() {
			if err := in.unmarshal(msg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m := &extprocv3.ProcessingRequest{}
			if err := proto.Unmarshal(msg, m); err != nil {
				b.Fatal(err)
			}
			_ = viewOf(m)
		}
	})
}
