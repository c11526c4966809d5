package scheduling

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/inference/wire"
)

func promptBody(prefix string, tokens int) []byte {
	var b strings.Builder
	for b.Len() < tokens*4 {
		b.WriteString(prefix)
	}
	return []byte(fmt.Sprintf(`{"model":"m","prompt":%q}`, b.String()[:tokens*4]))
}

func threeEndpoints() []Endpoint {
	return []Endpoint{ep("10.0.0.1:8000", &datastore.Metrics{}, nil), ep("10.0.0.2:8000", &datastore.Metrics{}, nil), ep("10.0.0.3:8000", &datastore.Metrics{}, nil)}
}

func resultFor(addr string) *Result {
	return &Result{Primary: "p", Profiles: map[string]*ProfileResult{"p": {Targets: []Scored{{Endpoint: ep(addr, nil, nil)}}}}}
}

func TestPrefixProducerLearnsFromPickAndServed(t *testing.T) {
	ctx := context.Background()
	p := build(t, PrefixProducerType, "").(*prefixProducer)
	eps := threeEndpoints()
	req := &Request{Model: "m", Body: promptBody("alpha ", 256)} // 16 blocks of 16 tokens
	p.Produce(ctx, req, eps)
	m := prefixMatchOf(req)
	if len(m.Hashes) != 16 || !m.Cold() {
		t.Fatalf("first sight: %d hashes, cold %v", len(m.Hashes), m.Cold())
	}
	p.Picked(ctx, req, resultFor("10.0.0.2:8000"))

	again := &Request{Model: "m", Body: promptBody("alpha ", 256)}
	p.Produce(ctx, again, eps)
	if f := prefixMatchOf(again).Fraction("10.0.0.2:8000"); f != 1 {
		t.Fatalf("after the pick, the picked endpoint holds %.2f of the prompt", f)
	}
	// A failover served it elsewhere: that endpoint learns it too.
	p.Served(ctx, again, []string{"10.0.0.2:8000"}, "10.0.0.3:8000")
	third := &Request{Model: "m", Body: promptBody("alpha ", 256)}
	p.Produce(ctx, third, eps)
	if f := prefixMatchOf(third).Fraction("10.0.0.3:8000"); f != 1 {
		t.Fatalf("the endpoint that served holds %.2f", f)
	}
	// Another model's identical prompt shares nothing.
	other := &Request{Model: "m2", Body: promptBody("alpha ", 256)}
	p.Produce(ctx, other, eps)
	if !prefixMatchOf(other).Cold() {
		t.Fatal("prefix matched across models")
	}
}

func TestPrefixProducerSizesFromPublishedCache(t *testing.T) {
	ctx := context.Background()
	p := build(t, PrefixProducerType, `{"blockSizeTokens":16}`).(*prefixProducer)
	small := []Endpoint{ep("10.0.0.1:8000", &datastore.Metrics{BlockSize: 16, NumGPUBlocks: 4, UpdatedAt: time.Now()}, nil)}
	a := &Request{Model: "m", Body: promptBody("aaaa ", 64)} // 4 blocks
	b := &Request{Model: "m", Body: promptBody("bbbb ", 64)}
	p.Produce(ctx, a, small)
	p.Picked(ctx, a, resultFor("10.0.0.1:8000"))
	p.Produce(ctx, b, small)
	p.Picked(ctx, b, resultFor("10.0.0.1:8000"))
	again := &Request{Model: "m", Body: promptBody("aaaa ", 64)}
	p.Produce(ctx, again, small)
	if n := prefixMatchOf(again).Blocks["10.0.0.1:8000"]; n != 0 {
		t.Fatalf("a 4-block cache still holds %d blocks of the evicted prompt", n)
	}
}

func TestPrefixScorer(t *testing.T) {
	req := &Request{}
	req.SetAttr(prefixAttr, &PrefixMatch{Hashes: make([]uint64, 10), BlockTokens: 16, Blocks: map[string]int{"10.0.0.1:8000": 10, "10.0.0.2:8000": 5}})
	scores := make([]float64, 3)
	build(t, "prefix-cache-scorer", "").(Scorer).Score(context.Background(), req, threeEndpoints(), scores)
	if scores[0] != 1 || scores[1] != 0.5 || scores[2] != 0 {
		t.Fatalf("scores %v", scores)
	}
	// Weighting the absolute length: 160 matched tokens of a 160-token scale.
	build(t, "prefix-cache-scorer", `{"matchLengthWeight":1,"matchLengthScaleTokens":160}`).(Scorer).Score(context.Background(), req, threeEndpoints(), scores)
	if scores[0] != 1 || scores[1] != 0.25 {
		t.Fatalf("length-weighted scores %v", scores)
	}
}

func TestPrefixAffinityFilter(t *testing.T) {
	match := func(blocks map[string]int) *Request {
		r := &Request{}
		r.SetAttr(prefixAttr, &PrefixMatch{Hashes: make([]uint64, 10), BlockTokens: 16, Blocks: blocks})
		return r
	}
	queued := func(q1, q2, q3 int) []Endpoint {
		return []Endpoint{
			ep("10.0.0.1:8000", &datastore.Metrics{WaitingQueueSize: q1}, nil),
			ep("10.0.0.2:8000", &datastore.Metrics{WaitingQueueSize: q2}, nil),
			ep("10.0.0.3:8000", &datastore.Metrics{WaitingQueueSize: q3}, nil),
		}
	}
	running := func(r1, r2, r3 int) []Endpoint {
		return []Endpoint{
			ep("10.0.0.1:8000", &datastore.Metrics{RunningRequests: r1}, nil),
			ep("10.0.0.2:8000", &datastore.Metrics{RunningRequests: r2}, nil),
			ep("10.0.0.3:8000", &datastore.Metrics{RunningRequests: r3}, nil),
		}
	}
	f := build(t, "prefix-cache-affinity-filter", `{"affinityThreshold":0.8,"maxWaitingQueueGap":4,"maxRunningRatio":2}`).(Filter)
	cases := []struct {
		name   string
		blocks map[string]int
		eps    []Endpoint
		want   int
	}{
		{"holder kept alone", map[string]int{"10.0.0.1:8000": 9}, queued(0, 0, 0), 1},
		{"below threshold keeps all", map[string]int{"10.0.0.1:8000": 7}, queued(0, 0, 0), 3},
		{"two holders", map[string]int{"10.0.0.1:8000": 10, "10.0.0.3:8000": 8}, queued(0, 0, 0), 2},
		{"holder a little busier still kept", map[string]int{"10.0.0.1:8000": 10}, queued(4, 0, 1), 1},
		{"holder clearly busier gives way", map[string]int{"10.0.0.1:8000": 10}, queued(9, 0, 1), 3},
		{"cold keeps all", map[string]int{}, queued(0, 0, 0), 3},
		{"holder running far more gives way", map[string]int{"10.0.0.1:8000": 10}, running(30, 2, 5), 3},
		{"holder running somewhat more is kept", map[string]int{"10.0.0.1:8000": 10}, running(12, 4, 5), 1},
		{"one idle server among busy ones does not break affinity", map[string]int{"10.0.0.1:8000": 10}, running(9, 0, 9), 1},
		// The holder has four times the others' cache, so it draws four
		// times their requests where placement is right.
		{"a large holder running more per its cache is kept", map[string]int{"10.0.0.1:8000": 10},
			[]Endpoint{sized("10.0.0.1:8000", 8000, 16), sized("10.0.0.2:8000", 2000, 3), sized("10.0.0.3:8000", 2000, 4)}, 1},
		{"a large holder running far more per its cache gives way", map[string]int{"10.0.0.1:8000": 10},
			[]Endpoint{sized("10.0.0.1:8000", 8000, 60), sized("10.0.0.2:8000", 2000, 3), sized("10.0.0.3:8000", 2000, 4)}, 3},
		{"a small holder is let go sooner", map[string]int{"10.0.0.1:8000": 10},
			[]Endpoint{sized("10.0.0.1:8000", 1000, 9), sized("10.0.0.2:8000", 4000, 6), sized("10.0.0.3:8000", 4000, 6)}, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := f.Filter(context.Background(), match(tc.blocks), tc.eps); len(got) != tc.want {
				t.Fatalf("kept %d, want %d", len(got), tc.want)
			}
		})
	}
	// When load breaks affinity, the prefix scorer stays out of it.
	req := match(map[string]int{"10.0.0.1:8000": 10})
	f.Filter(context.Background(), req, queued(9, 0, 1))
	scores := make([]float64, 3)
	build(t, "prefix-cache-scorer", "").(Scorer).Score(context.Background(), req, threeEndpoints(), scores)
	if scores[0] != 0 {
		t.Fatalf("prefix scorer pulled toward the busy holder after affinity broke: %v", scores)
	}
}

// coldRound sends n cold prompts of blocks each through the no-hit scorer
// alone (ties broken at random) and counts where they went.
func coldRound(t *testing.T, s *noHitLRUScorer, eps []Endpoint, n, blocks int, count map[string]int) {
	t.Helper()
	ctx := context.Background()
	picker := build(t, "max-score-picker", "").(Picker)
	setRand(picker, seeded())
	for range n {
		req := &Request{}
		req.SetAttr(prefixAttr, &PrefixMatch{Hashes: make([]uint64, blocks), BlockTokens: 16, Blocks: map[string]int{}})
		scores := make([]float64, len(eps))
		s.Score(ctx, req, eps, scores)
		sc := make([]Scored, len(eps))
		for i := range eps {
			sc[i] = Scored{Endpoint: eps[i], Score: scores[i]}
		}
		target := picker.Pick(ctx, sc)[0]
		count[target.Address]++
		s.Picked(ctx, req, resultFor(target.Address))
	}
}

// sized is an endpoint whose server publishes a KV cache of blocks blocks
// of 16 tokens, running running requests.
func sized(addr string, blocks, running int) Endpoint {
	return ep(addr, &datastore.Metrics{BlockSize: 16, NumGPUBlocks: blocks, RunningRequests: running}, nil)
}

// TestPrefixAffinityFilterCountsOutcomes: the filter counts what it did
// with each request some endpoints held, by outcome.
func TestPrefixAffinityFilterCountsOutcomes(t *testing.T) {
	f := build(t, "prefix-cache-affinity-filter", "").(*prefixAffinityFilter)
	held := func() *Request {
		r := &Request{}
		r.SetAttr(prefixAttr, &PrefixMatch{Hashes: make([]uint64, 10), BlockTokens: 16, Blocks: map[string]int{"10.0.0.1:8000": 10}})
		return r
	}
	ctx := context.Background()
	for _, eps := range [][]Endpoint{
		{sized("10.0.0.1:8000", 1000, 2), sized("10.0.0.2:8000", 1000, 2)},                                                  // kept
		{sized("10.0.0.1:8000", 1000, 2), sized("10.0.0.2:8000", 1000, 2)},                                                  // kept
		{sized("10.0.0.1:8000", 1000, 30), sized("10.0.0.2:8000", 1000, 2)},                                                 // running
		{ep("10.0.0.1:8000", &datastore.Metrics{WaitingQueueSize: 9}, nil), ep("10.0.0.2:8000", &datastore.Metrics{}, nil)}, // queue
	} {
		f.Filter(ctx, held(), eps)
	}
	f.Filter(ctx, &Request{}, threeEndpoints()) // nothing held: not counted
	reg := prometheus.NewRegistry()
	reg.MustRegister(f)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, m := range families[0].GetMetric() {
		got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	want := map[string]float64{"kept": 2, "gave-way-running": 1, "gave-way-queue": 1}
	if !maps.Equal(got, want) {
		t.Fatalf("%s: %v, want %v", families[0].GetName(), got, want)
	}
}

func TestNoHitLRUSpreadsColdRequests(t *testing.T) {
	ctx := context.Background()
	s := build(t, "no-hit-lru-scorer", "").(*noHitLRUScorer)
	eps := threeEndpoints()
	count := map[string]int{}
	coldRound(t, s, eps, 9, 1, count)
	for _, e := range eps {
		if count[e.Address] != 3 {
			t.Fatalf("cold requests not spread evenly: %v", count)
		}
	}
	warm := &Request{}
	warm.SetAttr(prefixAttr, &PrefixMatch{Hashes: []uint64{1}, Blocks: map[string]int{"10.0.0.1:8000": 1}})
	scores := make([]float64, 3)
	s.Score(ctx, warm, eps, scores)
	if scores[0] != 0.5 || scores[1] != 0.5 || scores[2] != 0.5 {
		t.Fatalf("warm request scores %v, want neutral", scores)
	}
}

// TestNoHitLRUPlacesNewPromptsByCapacity: new prompts go to each endpoint
// in proportion to the KV cache its server publishes, counted in blocks
// (a long prompt counts for several short ones); a new endpoint takes its
// share from then on rather than every new prompt until it has caught up;
// and with the weighting off the order is round robin again.
func TestNoHitLRUPlacesNewPromptsByCapacity(t *testing.T) {
	caches := []int{1000, 2000, 3000, 4000}
	var eps []Endpoint
	for i, blocks := range caches {
		eps = append(eps, sized(fmt.Sprintf("10.0.0.%d:8000", i+1), blocks, 0))
	}
	cases := []struct {
		name   string
		params string
		want   []int
	}{
		{"by capacity", "", []int{10, 20, 30, 40}},
		{"weighting off", `{"capacityWeighted":false}`, []int{25, 25, 25, 25}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := build(t, "no-hit-lru-scorer", tc.params).(*noHitLRUScorer)
			count := map[string]int{}
			coldRound(t, s, eps, 100, 8, count)
			for i, e := range eps {
				if d := count[e.Address] - tc.want[i]; d < -1 || d > 1 {
					t.Fatalf("cold prompts per endpoint %v, want %v (±1)", count, tc.want)
				}
			}
		})
	}

	// Blocks, not prompts: after a prompt of 32 blocks to one of two equal
	// endpoints, the next four of 8 blocks go to the other.
	s := build(t, "no-hit-lru-scorer", "").(*noHitLRUScorer)
	pair := []Endpoint{sized("10.0.0.1:8000", 1000, 0), sized("10.0.0.2:8000", 1000, 0)}
	long := map[string]int{}
	coldRound(t, s, pair, 1, 32, long)
	short := map[string]int{}
	coldRound(t, s, pair, 4, 8, short)
	for addr := range long {
		if short[addr] != 0 {
			t.Fatalf("after a 32-block prompt to %s, four 8-block ones went %v: want all to the other", addr, short)
		}
	}

	// A fifth endpoint joins: it takes its share (a fifth of the KV, so
	// about 20 of the next 100), not the next hundred.
	s = build(t, "no-hit-lru-scorer", "").(*noHitLRUScorer)
	coldRound(t, s, eps, 400, 8, map[string]int{})
	grown := append(slices.Clone(eps), sized("10.0.0.5:8000", 2500, 0))
	count := map[string]int{}
	coldRound(t, s, grown, 100, 8, count)
	if n := count["10.0.0.5:8000"]; n < 15 || n > 25 {
		t.Fatalf("the new endpoint took %d of 100 new prompts (%v), want about 20", n, count)
	}
}

// TestNoHitLRUFollowsPeersColdPicks: cold prompts another replica placed
// advance the order as this replica's own do.
func TestNoHitLRUFollowsPeersColdPicks(t *testing.T) {
	s := build(t, "no-hit-lru-scorer", "").(*noHitLRUScorer)
	eps := []Endpoint{sized("10.0.0.1:8000", 1000, 0), sized("10.0.0.2:8000", 1000, 0)}
	coldRound(t, s, eps, 2, 8, map[string]int{})
	for range 3 {
		s.PeerPicked(Shared{Endpoint: "10.0.0.1:8000", Hashes: make([]uint64, 8), Cold: true})
	}
	count := map[string]int{}
	coldRound(t, s, eps, 3, 8, count)
	if count["10.0.0.2:8000"] != 3 {
		t.Fatalf("after a peer sent three new prompts to the first endpoint, the next three went %v: want all to the second", count)
	}

	// A replica that hears of a peer's pick before it ranks anything
	// counts the endpoints it has not heard of as behind, not level.
	fresh := build(t, "no-hit-lru-scorer", "").(*noHitLRUScorer)
	fresh.PeerPicked(Shared{Endpoint: "10.0.0.1:8000", Hashes: make([]uint64, 8), Cold: true})
	first := map[string]int{}
	coldRound(t, fresh, eps, 1, 8, first)
	if first["10.0.0.2:8000"] != 1 {
		t.Fatalf("after a peer's new prompt to the first endpoint, this replica's first went %v: want the second", first)
	}
}

// serveAndScrape plays a model server behind the producer: each request
// is picked for the one endpoint, the server counts its prompt tokens at
// ratio bytes per token one scrape late (still in prefill when a scrape is
// made) and finds hitShare of them in its prefix cache, and every
// perScrape requests a new scrape is published. It returns the endpoint.
func serveAndScrape(t *testing.T, p *prefixProducer, ratio, hitShare float64, counters bool, prompts func(i int) []byte, requests, perScrape int) Endpoint {
	t.Helper()
	ctx := context.Background()
	e := ep("10.0.0.1:8000", nil, nil)
	var counted, inFlight float64
	at := time.Unix(1000, 0)
	scrape := func() {
		at = at.Add(time.Second)
		tc := datastore.TokenCounters{Prompt: counted, PrefixQueries: counted, PrefixHits: counted * hitShare}
		if !counters {
			tc = datastore.NoTokenCounters
		}
		e.Metrics = &datastore.Metrics{BlockSize: 16, NumGPUBlocks: 10217, Tokens: tc, UpdatedAt: at}
	}
	scrape()
	for i := range requests {
		req := &Request{Model: "m", Body: prompts(i)}
		p.Produce(ctx, req, []Endpoint{e})
		p.Picked(ctx, req, resultFor(e.Address))
		inFlight += float64(len(req.Prompt())) / ratio
		if (i+1)%perScrape == 0 {
			scrape()
			counted += inFlight
			inFlight = 0
		}
	}
	return e
}

func distinctPrompts(i int) []byte { return promptBody(fmt.Sprintf("request %05d ", i), 2048) }

// TestPrefixProducerLearnsTheServersTokenizer: the bytes per token of the
// server's counters are learned, the picker's pending-KV estimate uses
// them, and the index is sized in the server's own KV blocks at that
// ratio (16 × 10,217 tokens × ratio bytes, in 64-byte index blocks).
func TestPrefixProducerLearnsTheServersTokenizer(t *testing.T) {
	for _, ratio := range []float64{2, 4, 7} {
		t.Run(fmt.Sprint(ratio), func(t *testing.T) {
			p := build(t, PrefixProducerType, "").(*prefixProducer)
			e := serveAndScrape(t, p, ratio, 0, true, distinctPrompts, 200, 4)
			if got := e.BytesPerToken(); got < ratio*0.97 || got > ratio*1.03 {
				t.Fatalf("learned %v bytes per token, want %v", got, ratio)
			}
			want := 16 * 10217 * ratio / 64
			p.mu.Lock()
			got := float64(p.capacities[e.Address])
			p.mu.Unlock()
			if got < want*0.97 || got > want*1.03 {
				t.Fatalf("index capacity %v blocks, want about %v", got, want)
			}
		})
	}
}

// logLines collects a logger's messages.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(_, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{})
}

func (l *logLines) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, substr) {
			n++
		}
	}
	return n
}

func TestPrefixProducerFallsBackWithoutCounters(t *testing.T) {
	var logs logLines
	p := build(t, PrefixProducerType, "").(*prefixProducer)
	p.SetLogger(logs.logger())
	e := serveAndScrape(t, p, 7, 0, false, distinctPrompts, 100, 4)
	if got := e.BytesPerToken(); got != wire.DefaultBytesPerToken {
		t.Fatalf("bytes per token %v without counters, want the default", got)
	}
	if n := logs.count("reports no prompt-token counter"); n != 1 {
		t.Fatalf("%d log lines about the missing counter, want 1: %q", n, logs.lines)
	}
}

// TestPrefixProducerLogsHitRateDrift: the index expects every repeat of a
// prompt to hit, the server finds none of them: one log line says so.
func TestPrefixProducerLogsHitRateDrift(t *testing.T) {
	var logs logLines
	p := build(t, PrefixProducerType, "").(*prefixProducer)
	p.SetLogger(logs.logger())
	same := func(int) []byte { return promptBody("the same prompt ", 2048) }
	serveAndScrape(t, p, 4, 0, true, same, 200, 4)
	if n := logs.count("hit rate far from the server's"); n != 1 {
		t.Fatalf("%d drift lines, want 1: %q", n, logs.lines)
	}
	est := p.learner.Estimates()["10.0.0.1:8000"]
	if est.PredictedHitRate < 0.9 || est.ServerHitRate != 0 {
		t.Fatalf("estimate %+v, want the index near 1 and the server at 0", est)
	}
}
