package epp_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
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
