package calibrate

import (
	"math"
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// feed routes prompts of promptBytes to a server whose tokenizer makes
// promptBytes/ratio tokens of each, scraping every perScrape requests; the
// server counts a request's tokens one scrape late (it was still in
// prefill when the scrape was made), as a busy server does.
func feed(l *Learner, addr string, ratio float64, requests, perScrape, promptBytes int, at time.Time) (Estimate, time.Time) {
	var counted, inFlight float64
	var est Estimate
	for i := 1; i <= requests; i++ {
		l.Routed(addr, promptBytes, 0)
		inFlight += float64(promptBytes) / ratio
		if i%perScrape == 0 {
			at = at.Add(time.Second)
			est, _ = l.Observe(addr, datastore.TokenCounters{Prompt: counted, PrefixQueries: -1, PrefixHits: -1}, at)
			counted += inFlight
			inFlight = 0
		}
	}
	return est, at
}

func TestLearnsBytesPerToken(t *testing.T) {
	for _, ratio := range []float64{2, 3.3, 4, 7} {
		l := New()
		est, _ := feed(l, "a", ratio, 400, 8, 8192, time.Unix(0, 0))
		if math.Abs(est.BytesPerToken-ratio)/ratio > 0.03 {
			t.Errorf("ratio %v: learned %v", ratio, est.BytesPerToken)
		}
		if !est.Counted {
			t.Errorf("ratio %v: not counted", ratio)
		}
	}
}

func TestNeedsMinTokensFirst(t *testing.T) {
	l := New()
	// 4 requests of 8 KiB at 4 bytes per token: 8,192 tokens, under MinTokens.
	est, _ := feed(l, "a", 4, 4, 1, 8192, time.Unix(0, 0))
	if est.BytesPerToken != 0 {
		t.Fatalf("learned %v from %d tokens; want nothing before %d", est.BytesPerToken, 8192, MinTokens)
	}
}

func TestFollowsAChange(t *testing.T) {
	l := New()
	_, at := feed(l, "a", 4, 400, 8, 8192, time.Unix(0, 0))
	// The server is replaced by one with a coarser tokenizer: its counter
	// restarts from zero, which is a new baseline, not a negative count.
	at = at.Add(time.Second)
	l.Observe("a", datastore.TokenCounters{Prompt: 0, PrefixQueries: -1, PrefixHits: -1}, at)
	est, _ := feed(l, "a", 7, 3000, 8, 8192, at)
	if math.Abs(est.BytesPerToken-7)/7 > 0.05 {
		t.Fatalf("after the change learned %v, want about 7", est.BytesPerToken)
	}
}

func TestServerWithoutCounters(t *testing.T) {
	l := New()
	at := time.Unix(0, 0)
	for range 100 {
		l.Routed("a", 8192, 0)
		at = at.Add(time.Second)
		est, _ := l.Observe("a", datastore.NoTokenCounters, at)
		if est.Counted || est.BytesPerToken != 0 || est.ServerHitRate != -1 {
			t.Fatalf("estimate %+v from a server without counters", est)
		}
	}
}

func TestSameScrapeTwice(t *testing.T) {
	l := New()
	at := time.Unix(100, 0)
	c := datastore.TokenCounters{Prompt: 1000, PrefixQueries: -1, PrefixHits: -1}
	if _, taken := l.Observe("a", c, at); !taken {
		t.Fatal("the first scrape was not taken")
	}
	l.Routed("a", 4000, 0)
	if _, taken := l.Observe("a", c, at); taken {
		t.Fatal("the same scrape was taken twice")
	}
	// The bytes routed stay for the next scrape.
	if got := l.servers["a"].routed; got != 4000 {
		t.Fatalf("routed %v after a repeated scrape, want 4000", got)
	}
}

func TestHitRates(t *testing.T) {
	l := New()
	at := time.Unix(0, 0)
	var queries, hits float64
	l.Observe("a", datastore.TokenCounters{Prompt: 0, PrefixQueries: 0, PrefixHits: 0}, at)
	var est Estimate
	for i := range 100 {
		// The index expects 3/4 of every prompt; the server finds half.
		l.Routed("a", 8192, 6144)
		queries += 2048
		hits += 1024
		at = at.Add(time.Second)
		est, _ = l.Observe("a", datastore.TokenCounters{Prompt: queries, PrefixQueries: queries, PrefixHits: hits}, at)
		if i < 7 && est.ServerHitRate != -1 {
			t.Fatalf("hit rate %v after %v tokens", est.ServerHitRate, queries)
		}
	}
	if math.Abs(est.PredictedHitRate-0.75) > 1e-9 || math.Abs(est.ServerHitRate-0.5) > 1e-9 {
		t.Fatalf("predicted %v, server %v; want 0.75 and 0.5", est.PredictedHitRate, est.ServerHitRate)
	}
}

func TestPrune(t *testing.T) {
	l := New()
	l.Routed("gone", 10, 0)
	l.Prune(time.Now().Add(time.Minute))
	if len(l.Estimates()) != 0 {
		t.Fatalf("pruned learner still has %v", l.Estimates())
	}
}
