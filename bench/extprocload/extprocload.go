// Package extprocload drives an ext_proc processor the way a proxy does:
// one stream per request (headers, the body in chunks, read the answer),
// from many concurrent streams, and measures the answers. bench/eppload and
// bench/reference share it, so that every processor they compare meets the
// same driver.
package extprocload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Request is a request as the driver sends it: its body's chunks, and
// its messages (the headers, then a body message per chunk) encoded once
// by Chat, so that the driver does not build them again for every request
// it sends (they are only read, so every stream may send the same bytes).
type Request struct {
	Chunks [][]byte
	// wire is the messages as gRPC messages (Frame), in the order sent.
	wire [][]byte
}

// Size is the body's length.
func (r Request) Size() int {
	n := 0
	for _, c := range r.Chunks {
		n += len(c)
	}
	return n
}

// Chat is a chat completion for model of exactly size bytes (its user
// message padded with a repeated sentence), cut into chunks of chunk bytes
// (0: one).
func Chat(model string, size, chunk int) (Request, error) {
	const sentence = "Summarise the quarterly report in three bullet points. "
	frame := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"%%s"}],"max_tokens":64}`, model)
	pad := size - (len(frame) - 2)
	if pad < 100 {
		return Request{}, fmt.Errorf("a body of %d bytes is too small for a chat request for model %q", size, model)
	}
	whole := []byte(fmt.Sprintf(frame, strings.Repeat(sentence, pad/len(sentence)+1)[:pad]))
	if chunk <= 0 {
		chunk = len(whole)
	}
	var out Request
	headers, err := Frame(HeadersMessage(len(whole)))
	if err != nil {
		return Request{}, err
	}
	out.wire = append(out.wire, headers)
	for len(whole) > 0 {
		n := min(chunk, len(whole))
		c := whole[:n]
		whole = whole[n:]
		body, err := Frame(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: c, EndOfStream: len(whole) == 0}}})
		if err != nil {
			return Request{}, err
		}
		out.Chunks, out.wire = append(out.Chunks, c), append(out.wire, body)
	}
	return out, nil
}

// HeadersMessage is a request's headers message, with the content-length a
// client sends for a body of size bytes (none for 0), as Envoy forwards it.
func HeadersMessage(size int) *extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
		{Key: "content-type", RawValue: []byte("application/json")},
	}
	if size > 0 {
		hs = append(hs, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(size))})
	}
	return &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}},
	}
}

// Result is what a run measured: the latencies of the answered requests,
// sorted, and the errors.
type Result struct {
	Latencies []time.Duration
	Errors    int64
	First     error // the first error, if any
	Elapsed   time.Duration
	// Service is the latency from the actual send of the body; for paced
	// runs it leaves out the wait for the scheduled time (the driver's own
	// delays), for closed ones it is Latencies.
	Service []time.Duration
}

// Rate is the answered requests per second.
func (r *Result) Rate() float64 { return float64(len(r.Latencies)) / r.Elapsed.Seconds() }

// Quantile is the latency at quantile q (0: none answered).
func (r *Result) Quantile(q float64) time.Duration { return quantile(r.Latencies, q) }

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(float64(len(sorted))*q), len(sorted)-1)]
}

// Pct formats quantile q of sorted latencies, "-" for none.
func Pct(sorted []time.Duration, q float64) string {
	if len(sorted) == 0 {
		return "-"
	}
	return quantile(sorted, q).Round(time.Microsecond).String()
}

// Closed runs n workers over conns, each sending one request per stream
// back to back, until dur passes. A run where every request failed is an
// error carrying the first failure.
func Closed(ctx context.Context, conns []*Conn, req Request, n int, dur time.Duration) (*Result, error) {
	stop := time.Now().Add(dur)
	r := work(ctx, conns, req, n, func() (time.Time, bool) { return time.Time{}, time.Now().Before(stop) })
	if len(r.Latencies) == 0 && r.First != nil {
		return nil, fmt.Errorf("all %d requests failed, the first with: %w", r.Errors, r.First)
	}
	return r, nil
}

// Paced offers rate requests/s for dur using at most n concurrent streams.
// Latency runs from each request's scheduled time, so a stall in the
// processor shows up instead of silently lowering the offered load.
func Paced(ctx context.Context, conns []*Conn, req Request, n, rate int, dur time.Duration) *Result {
	total := int(float64(rate) * dur.Seconds())
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	jobs := make(chan time.Time, total)
	for i := range total {
		jobs <- start.Add(time.Duration(i) * interval)
	}
	close(jobs)
	return work(ctx, conns, req, n, func() (time.Time, bool) {
		at, ok := <-jobs
		return at, ok
	})
}

// work runs n workers over conns until next says to stop. next gives the
// time a request is due (zero: now); a request due later waits for its time,
// and its latency counts from then, its service time from its send.
func work(ctx context.Context, conns []*Conn, req Request, n int, next func() (time.Time, bool)) *Result {
	var (
		mu   sync.Mutex
		r    Result
		errs atomic.Int64
		wg   sync.WaitGroup
	)
	start := time.Now()
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := conns[w%len(conns)]
			var lat, service []time.Duration
			var first error
			for {
				at, ok := next()
				if !ok {
					break
				}
				time.Sleep(time.Until(at))
				d, err := One(ctx, c, req)
				if err != nil {
					errs.Add(1)
					first = cmp.Or(first, err)
					continue
				}
				service = append(service, d)
				if at.IsZero() {
					lat = append(lat, d)
				} else {
					lat = append(lat, time.Since(at))
				}
			}
			mu.Lock()
			r.Latencies = append(r.Latencies, lat...)
			r.Service = append(r.Service, service...)
			r.First = cmp.Or(r.First, first)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(r.Latencies)
	slices.Sort(r.Service)
	r.Errors, r.Elapsed = errs.Load(), time.Since(start)
	return &r
}

// One is one request's request path on a stream of its own over c:
// latency is from the first body chunk sent to the last body chunk
// answered (the pick is in between; with the body in one chunk, from its
// send), as the connection reads it. An answer counts once the headers
// response sets headers (a picker's pick, a payload processor's model
// headers) and the body has come back; an immediate response, no headers
// set, a failed stream or no answer within 10 s is an error. The stream is
// then half-closed, as a proxy does once its request is done.
func One(ctx context.Context, c *Conn, req Request) (time.Duration, error) {
	if len(req.wire) == 0 {
		return 0, errors.New("a request with no messages (make requests with Chat)")
	}
	h, err := c.conn(ctx)
	if err != nil {
		return 0, err
	}
	var sent time.Time
	st, err := h.open(req.wire, &sent)
	if err != nil {
		return 0, err
	}
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	select {
	case <-st.done:
	case <-ctx.Done():
		h.end(st, true)
		return 0, ctx.Err()
	case <-timeout.C:
		h.end(st, true)
		return 0, errors.New("no answer within 10 s")
	}
	// The reader wrote st before closing done.
	if st.err != nil {
		h.end(st, true)
		return 0, st.err
	}
	h.end(st, false)
	if !st.picked {
		return 0, errors.New("no headers set in the headers response")
	}
	return st.at.Sub(sent), nil
}

// OpenIdle opens n streams over conns that stay open past their request
// headers (as during a long body upload) until ctx ends.
func OpenIdle(ctx context.Context, conns []*Conn, n int) error {
	headers, err := Frame(HeadersMessage(0))
	if err != nil {
		return err
	}
	for i := range n {
		h, err := conns[i%len(conns)].conn(ctx)
		if err != nil {
			return err
		}
		var sent time.Time
		st, err := h.open([][]byte{headers}, &sent)
		if err != nil {
			return err
		}
		context.AfterFunc(ctx, func() { h.end(st, true) })
	}
	return nil
}

// FetchProfile saves a profile of a Go process serving pprof at addr
// (infergate's --enable-pprof, on its metrics listener), taken over about
// d, to path: kind is "profile" for CPU or "trace" for an execution trace.
func FetchProfile(ctx context.Context, addr, kind, path string, d time.Duration) error {
	secs := max(int(d.Seconds())-1, 1)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", addr, kind, secs), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", kind, err)
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}
