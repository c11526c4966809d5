package server

import (
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// answer holds the messages a stream's answers are built of, taken from
// the server's pool for one exchange of messages and put back after it:
// both transports marshal an answer before Send returns, so nothing reads
// them afterwards. Built anew for every answer, these small messages were
// a fifth of the allocations of a picked request.
type answer struct {
	resp        extprocv3.ProcessingResponse
	reqHeaders  extprocv3.ProcessingResponse_RequestHeaders
	respHeaders extprocv3.ProcessingResponse_ResponseHeaders
	reqBody     extprocv3.ProcessingResponse_RequestBody
	respBody    extprocv3.ProcessingResponse_ResponseBody
	headers     extprocv3.HeadersResponse
	body        extprocv3.BodyResponse
	common      extprocv3.CommonResponse
	mutation    extprocv3.HeaderMutation
	bodyChange  extprocv3.BodyMutation
	streamed    extprocv3.BodyMutation_StreamedResponse
	chunk       extprocv3.StreamedBodyResponse
	withMD      withMetadata
	// The set headers: most answers set one or two (a destination, a
	// model), and more than setInline are allocated.
	options [setInline]corev3.HeaderValueOption
	values  [setInline]corev3.HeaderValue
	set     [setInline]*corev3.HeaderValueOption
	raw     []byte // the set headers' values, kept between answers
}

const (
	setInline = 4
	// rawKept bounds the value buffer an answer keeps in the pool.
	rawKept = 4 << 10
)

// answers is the server's pool of answers.
type answers struct{ pool sync.Pool }

func (p *answers) get() *answer {
	if a, ok := p.pool.Get().(*answer); ok {
		return a
	}
	return new(answer)
}

// put returns a to the pool, without the bodies and headers it referred
// to.
func (p *answers) put(a *answer) {
	raw := a.raw[:0]
	if cap(raw) > rawKept {
		raw = nil
	}
	*a = answer{raw: raw}
	p.pool.Put(a)
}

// headersResponse answers the request headers (request true) or the
// response headers with d's header changes; d's dynamic metadata is
// sendDecision's to add.
func (a *answer) headersResponse(d *Decision, request bool) *extprocv3.ProcessingResponse {
	a.headers = extprocv3.HeadersResponse{Response: a.commonResponse(d)}
	if request {
		a.reqHeaders.RequestHeaders = &a.headers
		a.resp = extprocv3.ProcessingResponse{Response: &a.reqHeaders}
	} else {
		a.respHeaders.ResponseHeaders = &a.headers
		a.resp = extprocv3.ProcessingResponse{Response: &a.respHeaders}
	}
	return &a.resp
}

func (a *answer) commonResponse(d *Decision) *extprocv3.CommonResponse {
	a.common = extprocv3.CommonResponse{ClearRouteCache: d.ClearRouteCache}
	if len(d.SetHeaders) > 0 || len(d.RemoveHeaders) > 0 {
		a.mutation = extprocv3.HeaderMutation{RemoveHeaders: d.RemoveHeaders, SetHeaders: a.setHeaders(d.SetHeaders)}
		a.common.HeaderMutation = &a.mutation
	}
	return &a.common
}

// setHeaders is hs as header options that overwrite, their values copied
// into raw.
func (a *answer) setHeaders(hs []Header) []*corev3.HeaderValueOption {
	if len(hs) == 0 {
		return nil
	}
	options, values, set := a.options[:0], a.values[:0], a.set[:0]
	if len(hs) > setInline {
		options, values, set = make([]corev3.HeaderValueOption, 0, len(hs)), make([]corev3.HeaderValue, 0, len(hs)), make([]*corev3.HeaderValueOption, 0, len(hs))
	}
	a.raw = a.raw[:0]
	for _, h := range hs {
		a.raw = append(a.raw, h.Value...)
	}
	at := 0
	for i, h := range hs {
		end := at + len(h.Value)
		values = append(values, corev3.HeaderValue{Key: h.Name, RawValue: a.raw[at:end:end]})
		options = append(options, corev3.HeaderValueOption{Header: &values[i], AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
		set = append(set, &options[i])
		at = end
	}
	return set
}

// streamedBody is one streamed_response chunk of the request's body
// (request true) or the response's.
func (a *answer) streamedBody(chunk []byte, endOfStream, request bool) *extprocv3.ProcessingResponse {
	a.chunk = extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: endOfStream}
	a.streamed.StreamedResponse = &a.chunk
	a.bodyChange = extprocv3.BodyMutation{Mutation: &a.streamed}
	a.common = extprocv3.CommonResponse{BodyMutation: &a.bodyChange}
	return a.bodyResponse(&a.common, request)
}

// bodyResponse answers a body chunk of the request (request true) or the
// response with common.
func (a *answer) bodyResponse(common *extprocv3.CommonResponse, request bool) *extprocv3.ProcessingResponse {
	a.body = extprocv3.BodyResponse{Response: common}
	if request {
		a.reqBody.RequestBody = &a.body
		a.resp = extprocv3.ProcessingResponse{Response: &a.reqBody}
	} else {
		a.respBody.ResponseBody = &a.body
		a.resp = extprocv3.ProcessingResponse{Response: &a.respBody}
	}
	return &a.resp
}
