package payload_test

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/infergate/infergate/extproc/payload"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/policy/policytest"
)

// guardrailConfig turns on every built-in detector, a deny list and limits.
const guardrailConfig = `{"models":{"bases":[{"name":"llama-3-8b","adapters":["sql-lora"]}]},
 "limits":{"maxBodyBytes":1048576,"maxPromptTokens":100000,"maxTokens":4096},
 "pii":[{"name":"email","detector":"email","action":"mask"},{"name":"card","detector":"credit-card","action":"mask"},
  {"name":"phone","detector":"phone","action":"mask"},{"name":"ip","detector":"ip","action":"mask"},
  {"name":"ssn","detector":"ssn","action":"reject"},{"name":"iban","detector":"iban","action":"reject"}],
 "deny":[{"name":"injection","contains":["ignore previous instructions","ignore all previous instructions"]}]}`

// BenchmarkRoundTrip measures the ext_proc round trip as a proxy sees it:
// one stream per request over a few shared connections, request headers
// and a 1 KiB chat body with personal data in FULL_DUPLEX_STREAMED, until
// the headers response and the masked body are back; p50 and p99 per
// request. "closed" keeps 32 streams busy back to back: the throughput
// ceiling, where latency is mostly queueing (Little's law). "rate=N"
// offers N requests/s with up to 32 streams in flight, latency counted
// from the scheduled start so a stall is not hidden. Client and processor
// share the process and the machine's two cores.
func BenchmarkRoundTrip(b *testing.B) {
	// The binary collects at GOGC=400 (cmd/infergate tuneGC); so does this
	// process, which also holds the client.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	for _, c := range []struct{ streams, rate int }{{1, 0}, {32, 0}, {32, 1000}, {32, 2000}, {32, 4000}} {
		name := fmt.Sprintf("closed/streams=%d", c.streams)
		if c.rate > 0 {
			name = fmt.Sprintf("rate=%d/streams=%d", c.rate, c.streams)
		}
		b.Run(name, func(b *testing.B) { roundTrip(b, c.streams, c.rate) })
	}
}

func roundTrip(b *testing.B, streams, rate int) {
	r := newRig(b, []byte(guardrailConfig))
	body := policytest.ChatBody(1 << 10)
	const conns = 4
	clients := make([]extprocv3.ExternalProcessorClient, conns)
	for i := range clients {
		conn, err := grpc.NewClient(r.svc.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = conn.Close() })
		clients[i] = extprocv3.NewExternalProcessorClient(conn)
	}
	headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
			{Key: "content-type", RawValue: []byte("application/json")},
		}},
	}}}
	bodyMsg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}
	one := func(ctx context.Context, c extprocv3.ExternalProcessorClient) error {
		st, err := c.Process(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(headers); err != nil {
			return err
		}
		if err := st.Send(bodyMsg); err != nil {
			return err
		}
		hr, err := st.Recv()
		if err != nil {
			return err
		}
		if hr.GetRequestHeaders() == nil {
			return fmt.Errorf("want a headers response, got %v", hr)
		}
		br, err := st.Recv()
		if err != nil {
			return err
		}
		out := br.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()
		if !strings.Contains(string(out), "[EMAIL]") {
			return fmt.Errorf("body not masked: %.100s", out)
		}
		return st.CloseSend()
	}
	ctx := context.Background()
	lat := make([]time.Duration, b.N)
	sent := make([]time.Duration, b.N) // from the actual start, without the dispatcher's lag
	// starts hands each worker the time its request was due: as fast as
	// possible when closed, on a fixed schedule otherwise.
	starts := make(chan struct {
		i   int
		due time.Time
	}, b.N)
	b.ResetTimer()
	var wg sync.WaitGroup
	for s := 0; s < streams; s++ {
		wg.Add(1)
		go func(s int) {
			defer wg.Done()
			for st := range starts {
				due, now := st.due, time.Now()
				if rate == 0 {
					due = now
				}
				if err := one(ctx, clients[s%conns]); err != nil {
					b.Error(err)
					return
				}
				lat[st.i], sent[st.i] = time.Since(due), time.Since(now)
			}
		}(s)
	}
	begin := time.Now()
	for i := 0; i < b.N; i++ {
		due := begin
		if rate > 0 {
			due = begin.Add(time.Duration(i) * time.Second / time.Duration(rate))
			time.Sleep(time.Until(due))
		}
		starts <- struct {
			i   int
			due time.Time
		}{i, due}
	}
	close(starts)
	wg.Wait()
	b.StopTimer()
	slices.Sort(lat)
	slices.Sort(sent)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	if rate > 0 {
		b.ReportMetric(float64(sent[len(sent)*99/100].Microseconds()), "p99-from-send-µs")
	}
}

// BenchmarkBesideLargeRequests measures what a large request costs the
// small ones beside it on the same connection, as Envoy puts a worker's
// requests on one: two clients send 64 KiB chat bodies full of personal
// data back to back (a guardrail pass of about a millisecond each), while
// small 1 KiB requests go one after another on the same connection; p50
// and p99 of the small ones, on each transport. On h2 a connection's
// messages are handled on one goroutine, so this is where head-of-line
// blocking would show; grpc-go gives every stream a goroutine.
func BenchmarkBesideLargeRequests(b *testing.B) {
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	for _, transport := range []string{server.TransportGRPC, server.TransportH2} {
		b.Run("transport="+transport, func(b *testing.B) { besideLarge(b, transport) })
	}
}

func besideLarge(b *testing.B, transport string) {
	r := startRigWith(b, []byte(guardrailConfig), func(c *payload.Config) { c.KeepStreamOptions = true; c.Server.Transport = transport })
	conn, err := grpc.NewClient(r.svc.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	client := extprocv3.NewExternalProcessorClient(conn)
	request := func(ctx context.Context, body []byte) error {
		st, err := client.Process(ctx)
		if err != nil {
			return err
		}
		headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
				{Key: "content-type", RawValue: []byte("application/json")},
			}},
		}}}
		if err := st.Send(headers); err != nil {
			return err
		}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
			return err
		}
		if _, err := st.Recv(); err != nil {
			return err
		}
		return st.CloseSend()
	}
	large, small := policytest.ChatBody(64<<10), policytest.ChatBody(1<<10)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := request(ctx, large); err != nil && ctx.Err() == nil {
					b.Error(err)
					return
				}
			}
		})
	}
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := request(ctx, small); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(start)
	}
	b.StopTimer()
	cancel()
	wg.Wait()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "small-p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "small-p99-µs")
}
