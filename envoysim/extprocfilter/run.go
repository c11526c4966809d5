package extprocfilter

import (
	"errors"
	"io"
	"strconv"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Request is an HTTP request for RunRequest.
type Request struct {
	Method    string // default GET, or POST when there is a body
	Path      string // default "/"
	Authority string // default "localhost"
	Headers   Headers
	// Body is sent chunk by chunk as given; nil means no body (the headers
	// message then carries end_of_stream).
	Body     [][]byte
	Trailers Headers
}

// Response is an upstream response for RunResponse.
type Response struct {
	Status   int // default 200
	Headers  Headers
	Body     [][]byte
	Trailers Headers
	// Served is the ip:port reported as envoy.lb/x-gateway-destination-endpoint-served.
	Served string
}

// Result is what one path of an exchange produced.
type Result struct {
	// Headers after the server's mutations (":status" on the response path).
	Headers Headers
	// Body is the processed body re-assembled; BodyChunkSizes the size of each
	// chunk the filter passed on (in FULL_DUPLEX_STREAMED, each streamed_response).
	Body           []byte
	BodyChunkSizes []int
	Trailers       Headers
	// DynamicMetadata is everything the server set so far, merged by namespace.
	DynamicMetadata map[string]*structpb.Struct
	ClearRouteCache bool
	// LocalReply is set when the exchange ended with an immediate response or
	// with the error reply of a failed filter.
	LocalReply *LocalReply
	// FailedOpen is the failure that failure_mode_allow let through, if any.
	FailedOpen error
	// Responses is the raw log of server messages so far.
	Responses []*extprocv3.ProcessingResponse
}

func (r Request) headers() Headers {
	method, path, authority := r.Method, r.Path, r.Authority
	if method == "" {
		method = "GET"
		if r.Body != nil {
			method = "POST"
		}
	}
	if path == "" {
		path = "/"
	}
	if authority == "" {
		authority = "localhost"
	}
	h := Headers{{":authority", authority}, {":path", path}, {":method", method}, {":scheme", "http"}}
	for _, kv := range r.Headers {
		h.Add(kv.Key, kv.Value)
	}
	return h
}

func (r Response) headers() Headers {
	status := r.Status
	if status == 0 {
		status = 200
	}
	h := Headers{{":status", strconv.Itoa(status)}}
	for _, kv := range r.Headers {
		h.Add(kv.Key, kv.Value)
	}
	return h
}

func chunksBody(chunks [][]byte, trailers Headers) Body {
	switch {
	case trailers != nil:
		b := &sliceBody{}
		for _, c := range chunks {
			b.chunks = append(b.chunks, Chunk{Data: c})
		}
		b.chunks = append(b.chunks, Chunk{EndOfStream: true, Trailers: trailers})
		return b
	case chunks != nil:
		return BodyFromChunks(chunks...)
	}
	return nil
}

// RunRequest runs the request path to its end and collects the result. Only
// a misuse or the end of the exchange's context is an error; what the filter
// did, local replies included, is in the Result.
func (e *Exchange) RunRequest(req Request) (*Result, error) {
	h, b, err := e.Request(req.headers(), chunksBody(req.Body, req.Trailers))
	return e.collect(&e.req, h, b, err)
}

// RunResponse runs the response path on the exchange's stream, after RunRequest.
func (e *Exchange) RunResponse(resp Response) (*Result, error) {
	h, b, err := e.Response(resp.headers(), chunksBody(resp.Body, resp.Trailers), resp.Served)
	return e.collect(&e.resp, h, b, err)
}

func (e *Exchange) collect(d *direction, h Headers, b Body, err error) (*Result, error) {
	res := &Result{Headers: h}
	if err == nil && b != nil {
		for {
			var c Chunk
			c, err = b.Next(e.ctx)
			if errors.Is(err, io.EOF) {
				err = nil
				break
			}
			if err != nil {
				break
			}
			res.Body = append(res.Body, c.Data...)
			res.BodyChunkSizes = append(res.BodyChunkSizes, len(c.Data))
			if c.Trailers != nil {
				res.Trailers = c.Trailers
			}
			if c.EndOfStream {
				break
			}
		}
	}
	if err != nil && !errors.As(err, &res.LocalReply) {
		return nil, err
	}
	// Wait for the rest of this path, e.g. a trailers response after the body.
	select {
	case <-d.complete:
	case <-e.ctx.Done():
		return nil, e.ctx.Err()
	}
	e.mu.Lock()
	if d.trailersSent && res.LocalReply == nil {
		res.Trailers = d.trailers.Clone()
	}
	if res.LocalReply == nil {
		// A reply that came after the body was passed on still ends the request.
		var lr *LocalReply
		if errors.As(e.term, &lr) {
			res.LocalReply = lr
		}
	}
	res.ClearRouteCache, res.FailedOpen = e.clearRouteCache, e.failedOpen
	res.Responses = append([]*extprocv3.ProcessingResponse(nil), e.log...)
	e.mu.Unlock()
	res.DynamicMetadata = e.DynamicMetadata()
	return res, nil
}
