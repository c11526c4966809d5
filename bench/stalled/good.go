package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// goodRun is what the well-behaved requests of one interval met.
type goodRun struct {
	lat      []time.Duration // of the requests forwarded
	attempts int
	// refused counts immediate answers (503 processor-overloaded and
	// the like); failed, streams that broke or timed out.
	refused, failed int
}

// share is the fraction of attempts forwarded (an HTTP 200 at the
// gateway, the request not refused by the processor).
func (g goodRun) share() float64 {
	if g.attempts == 0 {
		return 0
	}
	return float64(len(g.lat)) / float64(g.attempts)
}

// timeGood sends well-behaved requests one after another for d (a 1 KiB
// chat body with an e-mail to mask, in one chunk).
func timeGood(ctx context.Context, conn *grpc.ClientConn, d time.Duration) goodRun {
	text := strings.Repeat("Summarise the quarterly report in three bullet points. ", 17) + " Mail jane@example.com."
	b := []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, text))
	var g goodRun
	for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
		start := time.Now()
		g.attempts++
		switch forwarded, err := oneRequest(ctx, conn, b); {
		case err != nil:
			g.failed++
		case !forwarded:
			g.refused++
		default:
			g.lat = append(g.lat, time.Since(start))
		}
	}
	return g
}

// oneRequest runs one request's request path: headers, then the body in
// one message; forwarded is false when the processor answered at once.
func oneRequest(ctx context.Context, conn *grpc.ClientConn, b []byte) (forwarded bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return false, err
	}
	if err := st.Send(headers(0)); err != nil {
		return false, err
	}
	if err := st.Send(body(b, true)); err != nil {
		return false, err
	}
	r, err := st.Recv()
	if err != nil {
		return false, fmt.Errorf("well-behaved request: %w", err)
	}
	if r.GetImmediateResponse() != nil {
		return false, nil
	}
	// Headers answer, then the body re-emitted: read to its end.
	for !r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
		if r, err = st.Recv(); err != nil {
			return false, fmt.Errorf("well-behaved request body: %w", err)
		}
	}
	_ = st.CloseSend()
	if _, err := st.Recv(); err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	return true, nil
}

// headers is the request-headers message of a chat request; a
// content-length is sent when contentLength > 0.
func headers(contentLength int) *extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
		{Key: "content-type", RawValue: []byte("application/json")},
	}
	if contentLength > 0 {
		hs = append(hs, &corev3.HeaderValue{Key: "content-length", RawValue: fmt.Append(nil, contentLength)})
	}
	return &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}},
	}
}

func body(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func pct(lat []time.Duration, p int) string {
	if len(lat) == 0 {
		return "—"
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(10 * time.Microsecond).String()
}

// responseHeaders is the response-headers message of a JSON answer.
func responseHeaders() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte("application/json")}}}}}}
}

func responseBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}
