package e2e

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/childproc"
	"github.com/infergate/infergate/test/loopback"
)

// TestPickerLearnsEachServersTokenizer runs the picker in front of sims
// whose tokenizers differ from its 4-byte assumption. From the sims'
// prompt-token counters it learns each one's bytes per token (against the
// truth: bytes sent over the tokens the sim counted) and sizes its prefix
// index in the sim's KV blocks at that ratio.
func TestPickerLearnsEachServersTokenizer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tokenizer string
		n         int
	}{
		{"2 bytes a token", sim.TokenizerBytes, 2},
		{"7 bytes a token", sim.TokenizerBytes, 7},
		{"words", sim.TokenizerWords, sim.DefaultBytesPerToken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sim.New(sim.Config{Name: "sim-0", TimeScale: 50, Tokenizer: tc.tokenizer, BytesPerToken: tc.n})
			if err != nil {
				t.Fatal(err)
			}
			sims := []simProc{{name: "sim-0", addr: loopback.Serve(t, s.Serve), srv: s}}
			pool := filepath.Join(t.TempDir(), "pool.yaml")
			writePool(t, pool, sims)
			e := startEPP(t, pool)
			base := startProxy(t, e.GRPCAddr(), false, nil)
			// The learner takes the first scrape a request sees as its
			// baseline and forgets the bytes routed before it; a request
			// in flight then has its tokens counted later and its bytes
			// not at all (one 8 KiB prompt is 8% of this test's sums, so
			// a picker slow to scrape under load once learned 1.83 for
			// 2.00). Load starts once the picker holds the sim's metrics.
			waitFresh(t, e.MetricsAddr())

			// Distinct prompts of words of 2 to 9 letters, about 8 KiB each,
			// until the sim has counted well over calibrate.MinTokens.
			r := rand.New(rand.NewPCG(1, 2))
			sent := 0
			for i := 0; s.Stats().PromptTokens < 3*16384; i++ {
				var b strings.Builder
				fmt.Fprintf(&b, "request %d:", i)
				for b.Len() < 8192 {
					b.WriteByte(' ')
					for range 2 + r.IntN(8) {
						b.WriteByte(byte('a' + r.IntN(26)))
					}
				}
				reply, err := post(t, base, fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, sim.DefaultModel, b.String()))
				if err != nil || reply.status != 200 {
					t.Fatalf("request %d: %v %d %s", i, err, reply.status, reply.body)
				}
				sent += b.Len()
			}
			truth := float64(sent) / float64(s.Stats().PromptTokens)
			kvTokens := float64(sim.DefaultKVCacheTokens)

			// The picker reads the counters on its next scrapes, and takes a
			// scrape with the next request that sees it.
			deadline := time.Now().Add(10 * time.Second)
			var learned, capacity float64
			for {
				if _, err := post(t, base, `{"model":"`+sim.DefaultModel+`","prompt":"one more","max_tokens":1}`); err != nil {
					t.Fatal(err)
				}
				m := metricsOf(t, e.MetricsAddr())
				learned = m[`infergate_epp_server_bytes_per_token{endpoint="`+sims[0].addr+`"}`]
				capacity = m[`infergate_epp_prefix_index_capacity_blocks{endpoint="`+sims[0].addr+`"}`]
				calibrated := m[`infergate_epp_server_tokenizer_calibrated{endpoint="`+sims[0].addr+`"}`] == 1
				if calibrated && math.Abs(learned-truth)/truth < 0.05 || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if math.Abs(learned-truth)/truth > 0.05 {
				t.Fatalf("learned %.2f bytes per token; the sim's tokenizer makes %.2f", learned, truth)
			}
			// 16-token index blocks of 4 bytes a token: 64 bytes each.
			if want := kvTokens * learned / 64; math.Abs(capacity-want)/want > 0.01 {
				t.Fatalf("index capacity %.0f blocks, want %.0f (the sim's %v tokens at %.2f bytes each)", capacity, want, kvTokens, learned)
			}
			t.Logf("%s: learned %.2f bytes per token (truth %.2f), index capacity %.0f blocks", tc.name, learned, truth, capacity)
		})
	}
}

// waitFresh waits until the picker at addr holds fresh metrics of its
// one endpoint.
func waitFresh(t *testing.T, addr string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); metricsOf(t, addr)[`infergate_epp_endpoints{state="fresh"}`] < 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the picker has no fresh metrics of the sim after 10 s")
		}
	}
}

// metricsOf reads a Prometheus endpoint (childproc.Metrics).
func metricsOf(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := childproc.Metrics(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
