package server_test

import (
	"bytes"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/extproc/server"
)

// BenchmarkRoundTrip is one request through the server, with the limits
// the processors' flags give by default, on each transport
// over loopback, one after another on one connection: stream open,
// headers, a 1 KiB body in one chunk, the decision and the re-emitted
// body, the response headers and a response chunk, the end.
func BenchmarkRoundTrip(b *testing.B) {
	for _, tr := range []string{server.TransportGRPC, server.TransportH2} {
		b.Run(tr, func(b *testing.B) {
			srv, _, _ := start(b, tr, &recorder{decide: func(*server.Request) *server.Decision { return &server.Decision{} }}, server.Options{Limits: server.Limits{
				MaxRequestBodyBytes: 16 << 20, MaxStreams: 10000, BufferBudgetBytes: 1 << 30, RequestIdleTimeout: 30 * time.Second, MaxStreamsPerConnection: 1000, StreamIdleTimeout: 15 * time.Minute,
			}})
			conn := dial(b, srv.GRPCAddr(), nil)
			client := extprocv3.NewExternalProcessorClient(conn)
			body := bytes.Repeat([]byte("x"), 1024)
			b.ReportAllocs()
			for b.Loop() {
				st, err := client.Process(b.Context())
				if err != nil {
					b.Fatal(err)
				}
				mustSend(b, st, reqHeaders(false, ":method", "POST"))
				mustSend(b, st, reqBody(body, true))
				mustRecv(b, st)
				mustRecv(b, st)
				mustSend(b, st, respHeaders())
				mustRecv(b, st)
				_ = st.CloseSend()
				if _, err := st.Recv(); err == nil {
					b.Fatal("the stream did not end")
				}
			}
		})
	}
}
