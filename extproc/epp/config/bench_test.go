package config_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/config"
	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/epp/scheduling"
)

// BenchmarkDefaultProfile is one scheduling decision of the default
// profile, prefix hashing and matching included, for a chat request with
// a ~2,000-token system prompt that one endpoint already holds.
func BenchmarkDefaultProfile(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			loaded, err := config.Load([]byte(config.DefaultConfig))
			if err != nil {
				b.Fatal(err)
			}
			eps := make([]scheduling.Endpoint, n)
			for i := range eps {
				e := &datastore.Endpoint{Spec: datastore.Spec{Address: fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256)}}
				eps[i] = scheduling.Endpoint{Endpoint: e, Metrics: &datastore.Metrics{
					WaitingQueueSize: i % 3, RunningRequests: i % 5, KVCacheUsage: float64(i%10) / 10,
					BlockSize: 16, NumGPUBlocks: 10217, UpdatedAt: time.Now(),
				}}
			}
			body := []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"hello"}]}`,
				strings.Repeat("You answer questions about the quarterly report. ", 170)))
			ctx := context.Background()
			warm := &scheduling.Request{Model: "m", Body: body}
			res, err := loaded.Scheduler.Schedule(ctx, warm, eps)
			if err != nil {
				b.Fatal(err)
			}
			for _, pl := range loaded.Scheduler.Plugins() {
				if o, ok := pl.(scheduling.PickObserver); ok {
					o.Picked(ctx, warm, res)
				}
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := loaded.Scheduler.Schedule(ctx, &scheduling.Request{Model: "m", Body: body}, eps); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
