package wasmtest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

var (
	// ErrStalled is returned by Do when the plugin paused the request at its last frame without
	// answering it: Envoy would hold such a request until a timeout.
	ErrStalled = errors.New("wasmtest: request stalled: the plugin paused at end of stream and did not answer")
	// ErrContentLength is returned by Do when the forwarded content-length does not match the
	// forwarded body. Envoy does not fix content-length after a plugin changes the body; a plugin that
	// rewrites bodies has to remove it in its request-headers callback.
	ErrContentLength = errors.New("wasmtest: forwarded content-length does not match the forwarded body")
)

// Request is a whole request for Do.
type Request struct {
	Method    string // default GET without a body, POST with one
	Path      string // default "/"
	Authority string // default "wasmtest"
	// Headers follow the pseudo-headers. Unless they include content-length or transfer-encoding,
	// a request with a body gets a content-length, as an HTTP/1.1 client would send.
	Headers   [][2]string
	Body      []byte
	ChunkSize int // the body is delivered in chunks of this size; 0 = one chunk
	// ChunkSizes, when set, are the sizes of the chunks the body is delivered
	// in, in order, instead of ChunkSize; they must add up to len(Body).
	ChunkSizes []int
}

// Result is what Do observed.
type Result struct {
	Headers           [][2]string // request headers as forwarded upstream (or as left, after a local response)
	Body              []byte      // request body as forwarded upstream
	Local             *LocalResponse
	RouteCacheCleared int
	// HeadersSent: the request headers went upstream (a request callback
	// returned Continue), before any local response.
	HeadersSent bool
}

// Do runs one request through a new stream the way Envoy feeds it: headers, then the body in
// chunks, stopping at a local response; then Done.
func (h *Host) Do(ctx context.Context, req Request) (_ *Result, err error) {
	s, err := h.NewStream(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if doneErr := s.Done(); doneErr != nil && err == nil {
			err = doneErr
		}
	}()

	if _, err := s.RequestHeaders(req.headers(), len(req.Body) == 0); err != nil {
		return nil, err
	}
	cs, err := req.chunks()
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		if s.LocalResponse() != nil {
			break
		}
		if _, err := s.RequestBody(c.data, c.last); err != nil {
			return nil, err
		}
	}

	res := &Result{
		Headers:           s.RequestHeaderMap(),
		Body:              s.ForwardedRequestBody(),
		Local:             s.LocalResponse(),
		RouteCacheCleared: s.RouteCacheCleared(),
		HeadersSent:       s.RequestHeadersSent(),
	}
	if res.Local != nil {
		return res, nil
	}
	if !s.RequestComplete() {
		return nil, ErrStalled
	}
	for _, p := range res.Headers {
		if p[0] == "content-length" && p[1] != strconv.Itoa(len(res.Body)) {
			return nil, fmt.Errorf("%w: content-length %s, body %d bytes", ErrContentLength, p[1], len(res.Body))
		}
	}
	return res, nil
}

func (r Request) headers() [][2]string {
	method, path, authority := r.Method, r.Path, r.Authority
	if method == "" {
		method = "GET"
		if len(r.Body) > 0 {
			method = "POST"
		}
	}
	if path == "" {
		path = "/"
	}
	if authority == "" {
		authority = "wasmtest"
	}
	hs := [][2]string{{":method", method}, {":scheme", "http"}, {":authority", authority}, {":path", path}}
	hs = append(hs, r.Headers...)
	if len(r.Body) > 0 && !hasAny(hs, "content-length", "transfer-encoding") {
		hs = append(hs, [2]string{"content-length", strconv.Itoa(len(r.Body))})
	}
	return hs
}

func hasAny(hs [][2]string, keys ...string) bool {
	for _, h := range hs {
		for _, k := range keys {
			if strings.EqualFold(h[0], k) {
				return true
			}
		}
	}
	return false
}

// chunks cuts the body as the request asks.
func (r Request) chunks() ([]chunk, error) {
	if r.ChunkSizes == nil {
		return chunks(r.Body, r.ChunkSize), nil
	}
	out := make([]chunk, 0, len(r.ChunkSizes))
	off := 0
	for _, n := range r.ChunkSizes {
		if n < 0 || off+n > len(r.Body) {
			return nil, fmt.Errorf("wasmtest: chunk sizes %v do not cut a %d-byte body", r.ChunkSizes, len(r.Body))
		}
		out = append(out, chunk{data: r.Body[off : off+n]})
		off += n
	}
	if off != len(r.Body) {
		return nil, fmt.Errorf("wasmtest: chunk sizes %v do not cut a %d-byte body", r.ChunkSizes, len(r.Body))
	}
	if len(out) > 0 {
		out[len(out)-1].last = true
	}
	return out, nil
}

type chunk struct {
	data []byte
	last bool
}

func chunks(body []byte, size int) []chunk {
	if len(body) == 0 {
		return nil
	}
	if size <= 0 || size > len(body) {
		size = len(body)
	}
	out := make([]chunk, 0, (len(body)+size-1)/size)
	for off := 0; off < len(body); off += size {
		end := min(off+size, len(body))
		out = append(out, chunk{data: body[off:end], last: end == len(body)})
	}
	return out
}
