package epp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/extproc/epp"
	"github.com/infergate/infergate/extproc/epp/config"
	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/epp/flowcontrol"
	"github.com/infergate/infergate/extproc/server"
)

// BenchmarkDecisionRoundTrip is one request path through the picker over
// real gRPC on loopback: stream open, headers, a ~1 KiB body, the pick and
// the re-emitted body.
func BenchmarkDecisionRoundTrip(b *testing.B) {
	addrs := make([]string, 8)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.0.%d:8000", i+1)
	}
	r := newRig(b, rigOpts{endpoints: specs(addrs...)})
	for i, a := range addrs {
		r.store.Get(a).SetMetrics(&datastore.Metrics{WaitingQueueSize: i % 3, KVCacheUsage: 0.1 * float64(i%5), UpdatedAt: time.Now().Add(time.Hour)})
	}
	body := []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat("x", 1000)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		a := r.do(b, call{body: body})
		_ = a.stream.CloseSend()
	}
}

// BenchmarkDecision2048TokenPrompt is the picker's decision alone (no
// gRPC) with the default profile over 8 endpoints, for chat requests of a
// 2,048-token (8 KiB) prompt from 128 shared prefixes plus a distinct
// suffix, back to back: parse, hash 128 blocks, match them against every
// endpoint's index, score, pick, learn.
func BenchmarkDecision2048TokenPrompt(b *testing.B) {
	loaded, err := config.Load([]byte(config.DefaultConfig))
	if err != nil {
		b.Fatal(err)
	}
	store := datastore.New()
	addrs := make([]string, 8)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.0.%d:8000", i+1)
	}
	if err := store.Replace(specs(addrs...)); err != nil {
		b.Fatal(err)
	}
	for i, a := range addrs {
		store.Get(a).SetMetrics(&datastore.Metrics{WaitingQueueSize: i % 3, RunningRequests: i % 4, KVCacheUsage: 0.1 * float64(i%5),
			BlockSize: 16, NumGPUBlocks: 10217, Tokens: datastore.NoTokenCounters, UpdatedAt: time.Now().Add(time.Hour)})
	}
	p, err := epp.New(epp.Options{Store: store, Scheduler: loaded.Scheduler, MetricsStaleness: time.Hour,
		Saturation: flowcontrol.UtilizationDetector{QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8, MetricsStaleness: time.Hour},
		Registerer: prometheus.NewRegistry(), Logger: logr.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	const prefixes, suffixes = 128, 64
	bodies := make([][]byte, prefixes*suffixes)
	for i := range bodies {
		prefix := strings.Repeat(fmt.Sprintf("shared prefix %03d ", i%prefixes), 2048*4/18+1)[:2048*4-512]
		suffix := strings.Repeat(fmt.Sprintf("question %04d ", i), 512/14+1)[:512]
		bodies[i] = []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"stream":true}`, prefix, suffix))
	}
	ctx := context.Background()
	headers := server.Headers{":path": "/v1/chat/completions", "content-type": "application/json"}
	i := 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		x := p.NewExchange(ctx)
		if d := x.HandleRequest(ctx, &server.Request{Headers: headers, Body: bodies[i%len(bodies)]}); d == nil || d.Reject != nil {
			b.Fatalf("no pick: %+v", d)
		}
		x.Close(ctx, server.Summary{})
		i++
	}
}
