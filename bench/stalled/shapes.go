package main

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// shape is one kind of pressure a client can put on the processor. start
// establishes it (streams opened, uploads stalled) and returns; the
// pressure holds until ctx ends, and report then says what it came to.
type shape struct {
	name, what string
	start      func(ctx context.Context, t target) (report reporter, err error)
	// config is the processor's policy (YAML); "" is emailConfig.
	config string
	// measure, when set, is the least time the pressure is measured at
	// scale 1 (scaled down with the run): what a costly shape does takes
	// seconds per request to show.
	measure time.Duration
}

// reporter says what a shape's pressure came to, and how many streams or
// bodies of it reached the processor.
type reporter func() (what string, reached int64)

// target is the processor under pressure: its address, the attackers'
// own gRPC connections (never the well-behaved one) and the scale of the
// run (1 is the tester's figures).
type target struct {
	addr  string
	conns []*grpc.ClientConn
	scale float64
}

func (t target) n(base int) int { return max(1, int(float64(base)*t.scale)) }

func (t target) client(i int) extprocv3.ExternalProcessorClient {
	return extprocv3.NewExternalProcessorClient(t.conns[i%len(t.conns)])
}

func shapes() []shape {
	return []shape{
		{name: "stalled-64KiB", what: "1,000 uploads send 64 KiB of a body and stop", start: stalled(1000, 64<<10)},
		{name: "stalled-1MiB", what: "1,000 uploads send 1 MiB of a body and stop", start: stalled(1000, 1<<20)},
		{name: "stalled-15MiB", what: "1,000 uploads send 15 MiB of a body and stop", start: stalled(1000, 15<<20)},
		// Under a policy that reads no text: its decisions are charged the
		// body's size, so the 16 MiB bodies are parsed, which is what the
		// shape is for (under guardrails, deciding one is charged more
		// than the decisions' share of the budget: 413 at once).
		{name: "empty-strings", what: "4 clients send 16 MiB bodies of empty strings in a loop, beside 8 uploads stalled at 8 MiB, under a policy that reads no text (a decision is charged its body's size, so the bodies are parsed but for those that find no room beside the uploads: 503)", start: emptyStrings(4, 8), config: noTextConfig},
		{name: "held-streams", what: "one connection opens 10,000 header-only streams, past any stream limit the server announces", start: heldStreams(10000)},
		{name: "announced-unsent", what: "560 streams announce a 4 MiB message and send 1 KiB of it", start: announcedUnsent(560, 4<<20)},
		{name: "trickle", what: "1,000 uploads announce content-length 1 MiB and send a byte every 10 s", start: trickle(1000, 1<<20, 10*time.Second)},
		{name: "unread-answers", what: "300 streams send 1 MiB response bodies to be passed back and never read the answers", start: unreadAnswers(300, 1<<20)},
		{name: "zero-width", what: "2 clients send, in a loop, 7.6 MiB prompts of letters and digits each followed by zero-width spaces (U+200B) and combining marks (U+0332, U+20DD, U+0305), under every built-in detector and a deny rule",
			start: costly(2, func(scale float64) []byte { return denseBody(int(7.6 * (1 << 20) * scale)) }), config: guardrailsConfig, measure: 10 * time.Second},
		{name: "email-arguments", what: "2 clients send, in a loop, a chat request whose one tool call's arguments is a JSON-encoded string holding 1,000,000 e-mail addresses (14.3 MiB), under the same policy",
			start: costly(2, func(scale float64) []byte { return emailArgsBody(int(1_000_000 * scale)) }), config: guardrailsConfig, measure: 10 * time.Second},
		{name: "card-numbers", what: "2 clients send, in a loop, a prompt of 700,000 test card numbers (4111 1111 1111 1111; 13.4 MiB), under the same policy",
			start: costly(2, func(scale float64) []byte { return cardsBody(int(700_000 * scale)) }), config: guardrailsConfig, measure: 10 * time.Second},
	}
}

// openStalled opens a stream and sends headers and size bytes of body,
// without ending it; refused reports whether the processor answered 503
// meanwhile (the stream is then over).
func openStalled(ctx context.Context, c extprocv3.ExternalProcessorClient, contentLength, size int) (held, refused bool) {
	st, err := c.Process(ctx)
	if err != nil || st.Send(headers(contentLength)) != nil {
		return false, false
	}
	answered := make(chan bool, 1)
	go func() {
		r, err := st.Recv()
		answered <- err == nil && r.GetImmediateResponse().GetStatus().GetCode() == 503
	}()
	chunk := make([]byte, min(size, chunkBytes))
	for sent := 0; sent < size; sent += len(chunk) {
		if st.Send(body(chunk[:min(len(chunk), size-sent)], false)) != nil {
			break
		}
		select {
		case was503 := <-answered:
			return false, was503
		default:
		}
	}
	// Give a refusal a moment to arrive; otherwise the stream is held,
	// its body open, until the run ends.
	select {
	case was503 := <-answered:
		return false, was503
	case <-time.After(500 * time.Millisecond):
		return true, false
	}
}

// openMany runs open for n streams, 64 at a time, and counts.
func openMany(n int, open func(i int) (held, refused bool)) (held, refused int64) {
	var h, r atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64) // opening concurrency, not a bound on held streams
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			held, refused := open(i)
			if held {
				h.Add(1)
			}
			if refused {
				r.Add(1)
			}
		}()
	}
	wg.Wait()
	return h.Load(), r.Load()
}

func stalled(streams, size int) func(context.Context, target) (reporter, error) {
	return func(ctx context.Context, t target) (reporter, error) {
		n := t.n(streams)
		held, refused := openMany(n, func(i int) (bool, bool) { return openStalled(ctx, t.client(i), 0, size) })
		return func() (string, int64) { return fmt.Sprintf("%d held, %d refused 503", held, refused), held + refused }, nil
	}
}

// emptyStringsBody is a chat body of about size bytes whose content is
// an array of empty strings: two bytes of JSON per string, the shape that
// costs a parser most per byte.
func emptyStringsBody(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"m","messages":[{"role":"user","content":[""`)
	for b.Len() < size-8 {
		b.WriteString(`,""`)
	}
	b.WriteString(`]}]}`)
	return b.Bytes()
}

func emptyStrings(clients, stalledUploads int) func(context.Context, target) (reporter, error) {
	return func(ctx context.Context, t target) (reporter, error) {
		held, _ := openMany(t.n(stalledUploads), func(i int) (bool, bool) { return openStalled(ctx, t.client(i), 0, 8<<20) })
		b := emptyStringsBody(16<<20 - 1<<10)
		var started, sent, refused atomic.Int64
		for i := range t.n(clients) {
			go func() {
				for ctx.Err() == nil {
					started.Add(1)
					if answer, err := sendWhole(ctx, t.client(i), b); err == nil {
						sent.Add(1)
						if answer != nil {
							refused.Add(1)
						}
					}
				}
			}()
		}
		return func() (string, int64) {
			return fmt.Sprintf("%d bodies sent (%d answered at once), %d uploads held", sent.Load(), refused.Load(), held), started.Load() + held
		}, nil
	}
}

// sendWhole sends a request with body b in chunks and waits for the
// first answer; it returns the immediate response, if that was it.
func sendWhole(ctx context.Context, c extprocv3.ExternalProcessorClient, b []byte) (*extprocv3.ImmediateResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Process(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(headers(len(b))); err != nil {
		return nil, err
	}
	for len(b) > 0 {
		n := min(len(b), chunkBytes)
		if err := st.Send(body(b[:n], n == len(b))); err != nil {
			break // answered meanwhile: Recv says how
		}
		b = b[n:]
	}
	r, err := st.Recv()
	if err != nil {
		return nil, err
	}
	return r.GetImmediateResponse(), nil
}

// rawStreams opens n streams over conns raw connections, each sending
// data, and reports what the server did with them.
func rawStreams(ctx context.Context, t target, n, conns int, data []byte) (reporter, error) {
	var cs []*rawConn
	for range conns {
		c, err := dialRaw(ctx, t.addr)
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	opened := 0
	for i := range n {
		if cs[i%conns].open(t.addr, data) != nil {
			break
		}
		opened++
	}
	return func() (string, int64) {
		var resets, trailers int64
		for _, c := range cs {
			resets += c.resets.Load()
			trailers += c.trailers.Load()
		}
		return fmt.Sprintf("%d opened; the server reset %d, ended %d", opened, resets, trailers), int64(opened)
	}, nil
}

func heldStreams(streams int) func(context.Context, target) (reporter, error) {
	return func(ctx context.Context, t target) (reporter, error) {
		return rawStreams(ctx, t, t.n(streams), 1, rawHeaders())
	}
}

func announcedUnsent(streams int, announce uint32) func(context.Context, target) (reporter, error) {
	return func(ctx context.Context, t target) (reporter, error) {
		data := append(rawHeaders(), announced(announce, make([]byte, 1<<10))...)
		return rawStreams(ctx, t, t.n(streams), 8, data)
	}
}

func trickle(streams, contentLength int, every time.Duration) func(context.Context, target) (reporter, error) {
	return func(ctx context.Context, t target) (reporter, error) {
		var held atomic.Int64
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		for i := range t.n(streams) {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				st, err := t.client(i).Process(ctx)
				ok := err == nil && st.Send(headers(contentLength)) == nil && st.Send(body([]byte{' '}, false)) == nil
				<-sem
				wg.Done() // opened: the stream trickles on until ctx ends
				if !ok {
					return
				}
				held.Add(1)
				for tick := time.NewTicker(every); ; {
					select {
					case <-ctx.Done():
						tick.Stop()
						return
					case <-tick.C:
						if st.Send(body([]byte{' '}, false)) != nil {
							tick.Stop()
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		return func() (string, int64) { return fmt.Sprintf("%d trickling", held.Load()), held.Load() }, nil
	}
}

func unreadAnswers(streams, responseBytes int) func(context.Context, target) (reporter, error) {
	return func(ctx context.Context, t target) (reporter, error) {
		var opened, sent atomic.Int64
		req := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		chunk := make([]byte, chunkBytes)
		for i := range t.n(streams) {
			go func() {
				st, err := t.client(i).Process(ctx)
				if err != nil || st.Send(headers(0)) != nil || st.Send(body(req, true)) != nil || st.Send(responseHeaders()) != nil {
					return
				}
				opened.Add(1)
				for n := 0; n < responseBytes; n += chunkBytes {
					if st.Send(responseBody(chunk, n+chunkBytes >= responseBytes)) != nil {
						return
					}
					sent.Add(chunkBytes)
				}
			}()
		}
		time.Sleep(time.Second) // let the answers pile up
		return func() (string, int64) {
			return fmt.Sprintf("%d streams sent %d MiB of response body, no answer read", opened.Load(), sent.Load()>>20), opened.Load()
		}, nil
	}
}
