package grpcjs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/inference/wire"
)

// model is what the requests ask for; the payload processor copies it
// into its model header.
const model = "interop-model"

// httpRequest is one HTTP request through a gateway, as Envoy's ext_proc
// filter shows it to a processor configured as gateways configure pickers
// and the payload processor: headers SEND, both bodies
// FULL_DUPLEX_STREAMED, trailers SEND (extprocfilter.DefaultProcessingMode,
// which Envoy requires of FULL_DUPLEX_STREAMED).
type httpRequest struct {
	n     int    // numbers the request: it is in its body and x-request-id
	size  int    // request body bytes
	chunk int    // bytes per request_body message, the last one shorter
	kind  string // the processor: a picker gets the served endpoint on the response path
	// served is the endpoint the picker's pick went to, reported on the
	// response path as Envoy reports it (envoy.lb metadata).
	served string
}

// body is a completion request of exactly r.size bytes (at least 100),
// numbered so that answers crossed between streams would show.
func (r httpRequest) body() []byte {
	head := fmt.Sprintf(`{"model":%q,"max_tokens":8,"prompt":"request %d `, model, r.n)
	tail := `"}`
	return []byte(head + strings.Repeat("a", max(r.size-len(head)-len(tail), 0)) + tail)
}

// requestMessages are the request path: the headers (with the negotiated
// body modes, which Envoy sends on a stream's first message only), then
// the body in chunks, end_of_stream on the last.
func (r httpRequest) requestMessages() []*extprocv3.ProcessingRequest {
	body := r.body()
	hdrs := [][2]string{
		{":authority", "gateway.example"}, {":path", "/v1/completions"}, {":method", "POST"}, {":scheme", "https"},
		{"content-type", "application/json"}, {"content-length", strconv.Itoa(len(body))},
		{"user-agent", "grpcjs-interop"}, {"x-forwarded-proto", "https"},
		{"x-request-id", fmt.Sprintf("00000000-0000-4000-8000-%012d", r.n)},
	}
	msgs := []*extprocv3.ProcessingRequest{{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(hdrs)}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	}}
	for off := 0; off < len(body); off += r.chunk {
		end := min(off+r.chunk, len(body))
		msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}})
	}
	return msgs
}

// responseBody is the model server's answer, with the usage a payload
// processor reports.
func (r httpRequest) responseBody() []byte {
	return fmt.Appendf(nil, `{"id":"cmpl-%d","object":"text_completion","model":%q,"choices":[{"index":0,"text":"hello","finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}`, r.n, model)
}

// responseMessages are the response path, sent once the request path is
// answered (the upstream cannot answer before it got the request): the
// response headers, then the body in one chunk. A picker is told which
// endpoint served, in envoy.lb metadata on every message of the path.
func (r httpRequest) responseMessages() []*extprocv3.ProcessingRequest {
	body := r.responseBody()
	var md *corev3.Metadata
	if r.kind == kindPicker {
		md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{wire.LBNamespace: {
			Fields: map[string]*structpb.Value{wire.ServedEndpointKey: structpb.NewStringValue(r.served)}}}}
	}
	hdrs := [][2]string{{":status", "200"}, {"content-type", "application/json"}, {"content-length", strconv.Itoa(len(body))}}
	return []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(hdrs)}}, MetadataContext: md},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}, MetadataContext: md},
	}
}

// headerMap is headers as Envoy sends them by default: lower-case names,
// the bytes in raw_value, value empty.
func headerMap(h [][2]string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for _, kv := range h {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	return m
}

// outcome is what one stream got: its answers as received, its status.
type outcome struct {
	headers  map[string]string // the response headers' metadata, as grpc-js passes it on
	answers  [][]byte
	code     int
	details  string
	trailers map[string]string
	ms       float64 // from the call's start to its status, as grpc-js saw it
	// atDeadline: the stream ended at its deadline, by either end.
	atDeadline bool
}

// progress tracks which answers a stream has had, as Envoy's filter does
// to know when a path is complete.
type progress struct {
	reqHeaders, reqBody, respHeaders, respBody, immediate bool
}

func (p *progress) see(b []byte) error {
	var m extprocv3.ProcessingResponse
	if err := proto.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("an answer that is not a ProcessingResponse: %w", err)
	}
	eos := func(br *extprocv3.BodyResponse) bool {
		return br.GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream()
	}
	switch r := m.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		p.reqHeaders = true
	case *extprocv3.ProcessingResponse_RequestBody:
		p.reqBody = p.reqBody || eos(r.RequestBody)
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		p.respHeaders = true
	case *extprocv3.ProcessingResponse_ResponseBody:
		p.respBody = p.respBody || eos(r.ResponseBody)
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		p.immediate = true
	default:
		return fmt.Errorf("an answer Envoy does not expect here: %v", &m)
	}
	return nil
}

// errEnded is a stream that ended before the path it was on was answered.
var errEnded = errors.New("the stream ended early")

// collect reads the stream's events into o until done says the path is
// complete, or until the status.
func collect(ctx context.Context, s *jsStream, o *outcome, p *progress, done func() bool) error {
	for !done() {
		ev, err := s.next(ctx)
		if err != nil {
			return err
		}
		switch ev.Ev {
		case "headers":
			o.headers = ev.Metadata
			continue
		case "status":
			o.code, o.details, o.trailers, o.ms = ev.Code, ev.Details, ev.Metadata, ev.MS
			return errEnded
		}
		o.answers = append(o.answers, ev.B64)
		if err := p.see(ev.B64); err != nil {
			return err
		}
	}
	return nil
}

// exchange plays one request through Envoy's filter on stream s: the
// request path without waiting for answers (FULL_DUPLEX_STREAMED), the
// response path once the request path is answered, then the half-close
// Envoy sends when the request is done, and the status. between, when
// set, runs while the upstream would be working: the request answered,
// the stream still open.
func exchange(ctx context.Context, s *jsStream, r httpRequest, between func() error) (outcome, error) {
	var o outcome
	var p progress
	for _, m := range r.requestMessages() {
		if err := s.send(m); err != nil {
			return o, err
		}
	}
	err := collect(ctx, s, &o, &p, func() bool { return p.immediate || (p.reqHeaders && p.reqBody) })
	if err == nil && between != nil {
		err = between()
	}
	if err == nil && !p.immediate {
		for _, m := range r.responseMessages() {
			if err := s.send(m); err != nil {
				return o, err
			}
		}
		err = collect(ctx, s, &o, &p, func() bool { return p.respHeaders && p.respBody })
	}
	if errors.Is(err, errEnded) {
		return o, fmt.Errorf("status %d %q before the exchange was answered (%d answers)", o.code, o.details, len(o.answers))
	}
	if err != nil {
		return o, err
	}
	if err := s.end(); err != nil {
		return o, err
	}
	return o, finish(ctx, s, &o)
}

// finish reads the rest of a stream: any answers, then its status.
func finish(ctx context.Context, s *jsStream, o *outcome) error {
	if err := collect(ctx, s, o, &progress{}, func() bool { return false }); !errors.Is(err, errEnded) {
		return err
	}
	return nil
}

// decoded is what a processor did to a request and its response, from the
// answers of one stream.
type decoded struct {
	reqHeaders  map[string]string // headers set on the request
	reqBody     []byte            // the request body as passed on
	respHeaders map[string]string
	respBody    []byte
	metadata    map[string]*structpb.Struct // dynamic metadata, merged by namespace
	immediate   *extprocv3.ImmediateResponse
}

func decode(answers [][]byte) (*decoded, error) {
	d := &decoded{reqHeaders: map[string]string{}, respHeaders: map[string]string{}, metadata: map[string]*structpb.Struct{}}
	setHeaders := func(into map[string]string, hr *extprocv3.HeadersResponse) {
		for _, h := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
			into[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
		}
	}
	for _, b := range answers {
		var m extprocv3.ProcessingResponse
		if err := proto.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		for ns, s := range m.GetDynamicMetadata().GetFields() {
			if d.metadata[ns] == nil {
				d.metadata[ns] = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			}
			for k, v := range s.GetStructValue().GetFields() {
				d.metadata[ns].Fields[k] = v
			}
		}
		switch r := m.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			setHeaders(d.reqHeaders, r.RequestHeaders)
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			setHeaders(d.respHeaders, r.ResponseHeaders)
		case *extprocv3.ProcessingResponse_RequestBody:
			d.reqBody = append(d.reqBody, r.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		case *extprocv3.ProcessingResponse_ResponseBody:
			d.respBody = append(d.respBody, r.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			d.immediate = r.ImmediateResponse
		}
	}
	return d, nil
}

// checkAnswered checks that a processor did its job on r: the request and
// the response went on unchanged, with the picker's pick or the payload
// processor's model header.
func checkAnswered(r httpRequest, o outcome) error {
	if o.code != 0 {
		return fmt.Errorf("status %d %q, want OK", o.code, o.details)
	}
	d, err := decode(o.answers)
	if err != nil {
		return err
	}
	if d.immediate != nil {
		return fmt.Errorf("answered with an immediate response %v", d.immediate)
	}
	if !bytes.Equal(d.reqBody, r.body()) {
		return fmt.Errorf("the request body came back as %d bytes, not the %d sent (%.60q…)", len(d.reqBody), len(r.body()), d.reqBody)
	}
	if !bytes.Equal(d.respBody, r.responseBody()) {
		return fmt.Errorf("the response body came back as %q, not %q", d.respBody, r.responseBody())
	}
	switch r.kind {
	case kindPicker:
		if got := d.reqHeaders[wire.DestinationEndpointKey]; got != r.served {
			return fmt.Errorf("picked %q (headers %v), want the pool's one endpoint %s", got, d.reqHeaders, r.served)
		}
		if got := d.metadata[wire.LBNamespace].GetFields()[wire.DestinationEndpointKey].GetStringValue(); got != r.served {
			return fmt.Errorf("envoy.lb metadata picks %q, want %s", got, r.served)
		}
	case kindPayload:
		if got := d.reqHeaders["x-gateway-model-name"]; got != model {
			return fmt.Errorf("x-gateway-model-name %q (headers %v), want %q", got, d.reqHeaders, model)
		}
	}
	return nil
}
