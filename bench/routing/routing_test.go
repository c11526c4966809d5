package main

import (
	"io"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/childproc"
)

const blockBytes = 16 * bytesPerToken // one KV-cache block of the sims' default size

func TestTextHasExactTokenCountsAndDiffersFromTheFirstBlock(t *testing.T) {
	g := newTextGen(7)
	seen := map[string]bool{}
	for _, n := range []int{1, 16, 17, 128, 2048} {
		for range 50 {
			s := g.text(n)
			if len(s) != n*bytesPerToken {
				t.Fatalf("text(%d) has %d bytes, want %d", n, len(s), n*bytesPerToken)
			}
			if strings.Trim(s, "abcdefghijklmnopqrstuvwxyz ") != "" {
				t.Fatalf("text(%d) has characters other than lower-case words: %q", n, s)
			}
			if n >= 16 {
				if seen[s[:blockBytes]] {
					t.Fatalf("two texts share their first block %q", s[:blockBytes])
				}
				seen[s[:blockBytes]] = true
			}
		}
	}
}

func TestMeasuredWorkload(t *testing.T) {
	s := defaultMeasured
	w := measuredWorkload(s, 1)
	if w.pods != 2 || w.concurrency != 32 || w.requests() != 1024 || len(w.sessions) != 1024 {
		t.Fatalf("pods %d, concurrency %d, requests %d in %d sessions; want 2, 32, 1024 in 1024", w.pods, w.concurrency, w.requests(), len(w.sessions))
	}
	prefixBytes := s.PrefixTokens * bytesPerToken
	byGroup := map[int][]request{}
	for _, ss := range w.sessions {
		r := ss[0]
		if r.Chat || r.MaxTokens != 128 || r.NoStream || r.Objective != "" {
			t.Fatalf("request %+v: want a streamed completion with max_tokens 128 and no objective", r)
		}
		if got := r.promptTokens(); got != 2048+128 {
			t.Fatalf("prompt of %d tokens, want %d", got, 2048+128)
		}
		byGroup[r.Group] = append(byGroup[r.Group], r)
	}
	if len(byGroup) != 128 {
		t.Fatalf("%d prefixes, want 128", len(byGroup))
	}
	firstBlocks := map[string]int{}
	for g, rs := range byGroup {
		if len(rs) != 8 {
			t.Fatalf("prefix %d is used %d times, want 8", g, len(rs))
		}
		prefix := rs[0].Prompt[:prefixBytes]
		suffixStarts := map[string]bool{}
		for _, r := range rs {
			if r.Prompt[:prefixBytes] != prefix {
				t.Fatalf("repeats of prefix %d do not share it exactly", g)
			}
			// Suffixes differ from their first block on: no hits beyond the prefix.
			suf := r.Prompt[prefixBytes:]
			if suffixStarts[suf[:blockBytes]] {
				t.Fatalf("two repeats of prefix %d start their suffix alike", g)
			}
			suffixStarts[suf[:blockBytes]] = true
		}
		if other, ok := firstBlocks[prefix[:blockBytes]]; ok {
			t.Fatalf("prefixes %d and %d share their first block", g, other)
		}
		firstBlocks[prefix[:blockBytes]] = g
	}
	// Random order: the repeats of a prefix are not sent back to back.
	adjacent := 0
	for i := 1; i < len(w.sessions); i++ {
		if w.sessions[i][0].Group == w.sessions[i-1][0].Group {
			adjacent++
		}
	}
	if adjacent > 30 {
		t.Fatalf("%d neighbours share a prefix; the order does not look shuffled", adjacent)
	}
	// Seeded: the same seed gives the same workload, another seed another.
	if again := measuredWorkload(s, 1); !reflect.DeepEqual(again.sessions, w.sessions) {
		t.Fatal("same seed, different workload")
	}
	if other := measuredWorkload(s, 2); other.sessions[0][0].Prompt == w.sessions[0][0].Prompt {
		t.Fatal("different seeds, same first prompt")
	}
}

func TestMultiTurnPromptsGrowAndShareTheSystemPrompt(t *testing.T) {
	s := defaultMultiTurn
	w := multiTurnWorkload(s, 1)
	if w.pods != 4 || w.concurrency != 32 || len(w.sessions) != 64 || w.requests() != 64*6 {
		t.Fatalf("pods %d, concurrency %d, %d conversations, %d requests", w.pods, w.concurrency, len(w.sessions), w.requests())
	}
	system := w.sessions[0][0].Messages[0]
	if system.Role != "system" || len(system.Content) != 1024*bytesPerToken {
		t.Fatalf("system prompt %q of %d bytes, want 1024 tokens", system.Role, len(system.Content))
	}
	lo, hi := (s.MeanTokens-s.Spread)*bytesPerToken, (s.MeanTokens+s.Spread)*bytesPerToken
	secondBlocks := map[string]bool{}
	for c, conv := range w.sessions {
		if len(conv) != 6 {
			t.Fatalf("conversation %d has %d turns", c, len(conv))
		}
		prevTokens := 0
		for k, r := range conv {
			if !r.Chat || r.Group != c || r.NoStream {
				t.Fatalf("conversation %d turn %d: %+v", c, k, r)
			}
			if len(r.Messages) != 2*(k+1) {
				t.Fatalf("turn %d has %d messages, want %d", k, len(r.Messages), 2*(k+1))
			}
			if r.Messages[0] != system {
				t.Fatalf("conversation %d turn %d does not start with the shared system prompt", c, k)
			}
			for i, m := range r.Messages[1:] {
				want := "user"
				if i%2 == 1 {
					want = "assistant"
				}
				if m.Role != want || len(m.Content) < lo || len(m.Content) > hi {
					t.Fatalf("turn %d message %d: %s of %d bytes, want %s of %d..%d", k, i+1, m.Role, len(m.Content), want, lo, hi)
				}
			}
			if r.MaxTokens < s.MeanTokens-s.Spread || r.MaxTokens > s.MeanTokens+s.Spread {
				t.Fatalf("max_tokens %d", r.MaxTokens)
			}
			if k > 0 {
				prev := conv[k-1]
				// The history is resent unchanged, then the previous answer
				// (as long as it asked for) and a new user message.
				if !reflect.DeepEqual(r.Messages[:len(prev.Messages)], prev.Messages) {
					t.Fatalf("conversation %d turn %d does not resend turn %d", c, k, k-1)
				}
				if got := len(r.Messages[len(prev.Messages)].Content); got != prev.MaxTokens*bytesPerToken {
					t.Fatalf("answer in the history has %d bytes, the turn asked for %d tokens", got, prev.MaxTokens)
				}
				if !strings.HasPrefix(r.promptText(), prev.promptText()) {
					t.Fatal("a turn's prompt does not extend the previous one")
				}
			}
			if tok := r.promptTokens(); tok <= prevTokens {
				t.Fatalf("turn %d has %d prompt tokens, not more than the previous %d", k, tok, prevTokens)
			} else {
				prevTokens = tok
			}
		}
		first := conv[0].Messages[1].Content[:blockBytes]
		if secondBlocks[first] {
			t.Fatalf("conversation %d starts like another one after the system prompt", c)
		}
		secondBlocks[first] = true
	}
}

func TestNoSharingWorkload(t *testing.T) {
	s := defaultNoSharing
	w := noSharingWorkload(s, 1)
	if w.pods != 4 || w.concurrency != 32 || w.requests() != 1024 {
		t.Fatalf("pods %d, concurrency %d, requests %d", w.pods, w.concurrency, w.requests())
	}
	first := map[string]bool{}
	minP, maxP, minO, maxO := 1<<30, 0, 1<<30, 0
	for _, ss := range w.sessions {
		r := ss[0]
		p := r.promptTokens()
		minP, maxP, minO, maxO = min(minP, p), max(maxP, p), min(minO, r.MaxTokens), max(maxO, r.MaxTokens)
		if r.Group != -1 {
			t.Fatal("no-sharing requests must not carry a group")
		}
		if first[r.Prompt[:blockBytes]] {
			t.Fatal("two prompts share their first block")
		}
		first[r.Prompt[:blockBytes]] = true
	}
	if minP < 200 || maxP > 1200 || minO < 32 || maxO > 256 {
		t.Fatalf("prompts %d..%d tokens, outputs %d..%d; want within 200..1200 and 32..256", minP, maxP, minO, maxO)
	}
	if maxP-minP < 900 || maxO-minO < 200 {
		t.Fatalf("prompts %d..%d tokens, outputs %d..%d: the ranges are barely used", minP, maxP, minO, maxO)
	}
}

func TestNoisyNeighbourRequests(t *testing.T) {
	s := defaultNoisy
	b := noisyB(s, 1)
	if len(b) != s.BRequests {
		t.Fatalf("%d B requests", len(b))
	}
	for _, r := range b {
		if r.promptTokens() != s.BPrompt || r.Objective != "interactive" || r.NoStream || r.MaxTokens != s.BOut {
			t.Fatalf("B request %+v", r)
		}
	}
	f := newFloodGen(s, 1)
	a0, a1 := f.request(0), f.request(1)
	if a0.promptTokens() != 4096 || a0.Objective != "batch" || !a0.NoStream || a0.MaxTokens != s.AOut {
		t.Fatalf("A request: %d tokens, objective %q, no-stream %v", a0.promptTokens(), a0.Objective, a0.NoStream)
	}
	if a0.Prompt[:blockBytes] == a1.Prompt[:blockBytes] {
		t.Fatal("A's requests share their first block")
	}
	if newFloodGen(s, 1).request(1).Prompt != a1.Prompt {
		t.Fatal("A's request 1 differs between generators of the same seed")
	}
	// The flood must over-commit the KV cache of the pool's default sims.
	if need, have := s.AConcurrency*(s.APrompt+s.AOut), s.Pods*163472; need <= have {
		t.Fatalf("A keeps %d tokens in flight, the pool holds %d: not a flood", need, have)
	}
}

func TestPercentileIsNearestRank(t *testing.T) {
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, time.Duration(i))
	}
	for _, tc := range []struct {
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{hundred, 0.99, 99},
		{hundred, 0.5, 50},
		{hundred, 1, 100},
		{hundred, 0.001, 1},
		{hundred[:10], 0.99, 10},
		{hundred[:10], 0.9, 9},
		{hundred[:1], 0.99, 1},
		{hundred[:200/2], 0.995, 100},
		{nil, 0.99, 0},
	} {
		if got := percentile(tc.in, tc.p); got != tc.want {
			t.Errorf("percentile(%d values, %g) = %d, want %d", len(tc.in), tc.p, got, tc.want)
		}
	}
	if m := mean([]time.Duration{1, 2, 6}); m != 3 {
		t.Errorf("mean = %d, want 3", m)
	}
}

func TestTableIsMarkdown(t *testing.T) {
	tb := &table{header: []string{"config", "hit rate", "p99"}, right: []bool{false, true, true}}
	tb.add("oracle", pctString(0.7753), ms(690*time.Millisecond))
	tb.add("a|b", pctString(0.4), ms(1584*time.Millisecond+400*time.Microsecond))
	tb.add("short")
	want := "| config | hit rate | p99 |\n" +
		"|---|---:|---:|\n" +
		"| oracle | 77.5% | 690 ms |\n" +
		"| a\\|b | 40.0% | 1584 ms |\n" +
		"| short |  |  |\n"
	if got := tb.String(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	for _, tc := range []struct{ got, want string }{
		{ms(12345 * time.Microsecond), "12.3 ms"},
		{ms(99949 * time.Microsecond), "99.9 ms"},
		{ratio(3, 2), "1.50"},
		{ratio(1, 0), "-"},
		{bytesString(1.5 * (1 << 20)), "1.50 MiB"},
		{bytesString(512), "512 B"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestPromSamples(t *testing.T) {
	text := `# HELP vllm:prefix_cache_hits_total Prompt tokens found.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.5e+06
vllm:prefix_cache_queries_total{model_name="m"} 2000
infergate_epp_prefix_index_blocks{endpoint="127.0.0.1:1"} 10
infergate_epp_prefix_index_blocks{endpoint="127.0.0.1:2"} 32
odd{label="a } b",other="x\"}"} 7
bare 3
`
	m, err := promSamples(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"vllm:prefix_cache_hits_total": 1.5e6, "vllm:prefix_cache_queries_total": 2000,
		"infergate_epp_prefix_index_blocks": 42, "odd": 7, "bare": 3,
	}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("got %v, want %v", m, want)
	}
	only, _ := promSamples(strings.NewReader(text), "bare")
	if !reflect.DeepEqual(only, map[string]float64{"bare": 3}) {
		t.Fatalf("filtered: %v", only)
	}
}

func TestParseSimHelp(t *testing.T) {
	help := `Flags:
      --inter-token-latency duration      time per output token after the first (default 8ms)
      --max-num-seqs int                  requests that run at once; the rest wait (default 256)
      --prefill-overhead duration         fixed part of the time to first token (default 5ms)
      --prefill-time-per-token duration   time to first token per uncached prompt token (default 15µs)
      --time-scale float                  speed-up of simulated time: 100 runs 100x faster (default 1)
`
	m := parseSimHelp(help)
	want := simModel{maxNumSeqs: 256, overhead: 5 * time.Millisecond, perToken: 15 * time.Microsecond, itl: 8 * time.Millisecond, known: true}
	if m != want {
		t.Fatalf("got %+v, want %+v", m, want)
	}
	if got := m.service(2176, 2048, 128); got != 5*time.Millisecond+128*15*time.Microsecond+127*8*time.Millisecond {
		t.Fatalf("service time %s", got)
	}
	if parseSimHelp("no flags here").known {
		t.Fatal("empty help parsed as known")
	}
}

func TestFlagLists(t *testing.T) {
	if k, err := parseWorkloads("d,measured, b,a"); err != nil || !reflect.DeepEqual(k, []string{"a", "b", "d"}) {
		t.Fatalf("workloads %v %v", k, err)
	}
	if _, err := parseWorkloads("e"); err == nil {
		t.Fatal("unknown workload accepted")
	}
	if c, err := parseConfigs("oracle,round-robin"); err != nil || !reflect.DeepEqual(c, []string{cfgRoundRobin, cfgOracle}) {
		t.Fatalf("configs %v %v", c, err)
	}
	if _, err := parseConfigs("fastest"); err == nil {
		t.Fatal("unknown config accepted")
	}
}

func TestLineWatchFindsTheAddressAcrossWrites(t *testing.T) {
	w := newLineWatch("envoysim listening on ")
	for _, chunk := range []string{"starting\nenvoysim listen", "ing on http://127.0.0.1:4", "242\nmore\n"} {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case got := <-w.found:
		if got != "http://127.0.0.1:4242" {
			t.Fatalf("got %q", got)
		}
	default:
		t.Fatal("address not found")
	}
}

func TestOracleRoutesByGroupAndRoundRobinOtherwise(t *testing.T) {
	st := &stack{cfg: cfgOracle, base: "http://proxy", sims: []simInfo{{addr: "a"}, {addr: "b"}, {addr: "c"}}}
	route := st.router()
	for g, want := range map[int]string{0: "a", 4: "b", 5: "c"} {
		if got := route(request{Group: g}); got != (target{base: "http://proxy", steer: want}) {
			t.Fatalf("group %d went to %+v, want %s via the proxy", g, got, want)
		}
	}
	var got []string
	for range 4 {
		got = append(got, route(request{Group: -1}).steer)
	}
	if !reflect.DeepEqual(got, []string{"a", "b", "c", "a"}) {
		t.Fatalf("round robin went %v", got)
	}
	proxied := (&stack{cfg: cfgDefault, base: "http://proxy", sims: st.sims}).router()
	if got := proxied(request{Group: 1}); got != (target{base: "http://proxy"}) {
		t.Fatalf("a picker config went to %+v", got)
	}
}

func TestImbalance(t *testing.T) {
	if got := imbalance([]int{0, 0, 0, 384}); got != "the busiest pod took 100% of the requests (fair share 25%)" {
		t.Fatalf("got %q", got)
	}
	for _, even := range [][]int{{96, 96, 96, 96}, {99, 101, 106, 78}, {524, 500}, {0, 0}, {7}} {
		if got := imbalance(even); got != "" {
			t.Fatalf("%v: got %q", even, got)
		}
	}
}

func TestGoalsSummary(t *testing.T) {
	gs := goals{}
	for _, v := range []float64{1.07, 1.2, math.NaN()} {
		gs.record(goalP99, v)
	}
	gs.record(goalHitRate, 0.99)
	gs.record(goalBNotShed, 0)
	checkSummary(t, gs,
		"| (a) infergate-default / oracle hit rate ≥ 0.97 | 0.99 | 1 of 1 |",
		"| (a) infergate-default / oracle p99 TTFT ≤ 1.15 | 1.07, 1.20, NaN | 1 of 3 |",
		"| (d) infergate-default: B requests refused ≤ 0 | 0 | 1 of 1 |")
	if (goals{}).summary() != "" {
		t.Fatal("an empty summary should print nothing")
	}
}

func TestDecisionMeanCountsOnlySinceTheBase(t *testing.T) {
	base := map[string]float64{decisionSum: 1, decisionCount: 100} // the warm-up
	cases := []struct {
		name string
		m    map[string]float64
		want time.Duration
	}{
		{"measured requests only", map[string]float64{decisionSum: 1.5, decisionCount: 200}, 5 * time.Millisecond},
		{"nothing since the base", map[string]float64{decisionSum: 1, decisionCount: 100}, 0},
		{"no picker samples", map[string]float64{}, 0},
	}
	for _, tc := range cases {
		if got := decisionMean(tc.m, base); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// testTokenizers are the sims' tokenizers the generator is tested with.
var testTokenizers = []tokenizer{{}, bytesTokenizer(2), bytesTokenizer(4), bytesTokenizer(7), bytesTokenizer(8), wordsTokenizer}

func TestTextHasExactTokenCountsUnderEveryTokenizer(t *testing.T) {
	for _, tok := range testTokenizers {
		g := newTextGen(7)
		g.tok = tok
		var prev string
		for _, n := range []int{1, 2, 16, 17, 128, 2048} {
			for range 20 {
				s := g.text(n)
				kind := tok.kind
				if kind == "" {
					kind = sim.TokenizerBytes
				}
				if got := sim.CountTokens(kind, tok.bytes(), s); got != n {
					t.Fatalf("%s: text(%d) is %d tokens: %q", tok, n, got, s)
				}
				if !tok.words() && len(s) != n*tok.bytes() {
					t.Fatalf("%s: text(%d) has %d bytes, want %d", tok, n, len(s), n*tok.bytes())
				}
				if strings.Trim(s, "abcdefghijklmnopqrstuvwxyz ") != "" {
					t.Fatalf("%s: text(%d) has characters other than lower-case words: %q", tok, n, s)
				}
				// Texts put together are as many tokens as apart, so a
				// prefix's blocks are those of every prompt it starts.
				if prev != "" {
					if got, want := tok.count(prev+s), tok.count(prev)+n; got != want {
						t.Fatalf("%s: two texts together are %d tokens, apart %d", tok, got, want)
					}
				}
				prev = s
			}
		}
	}
	// The words tokenizer makes about 5.7 bytes a token of such words.
	g := newTextGen(7)
	g.tok = wordsTokenizer
	if b := float64(len(g.text(2048))) / 2048; b < 5.2 || b > 6.2 {
		t.Fatalf("words: %.2f bytes a token", b)
	}
	// The default makes the text it always made.
	a, b := newTextGen(3), newTextGen(3)
	b.tok = bytesTokenizer(4)
	for range 10 {
		if x, y := a.text(100), b.text(100); x != y {
			t.Fatalf("the zero tokenizer and bytes/4 generate different text: %q, %q", x, y)
		}
	}
}

func TestTokenizerWorkloadKeepsPrefixesShared(t *testing.T) {
	for _, tok := range []tokenizer{bytesTokenizer(2), bytesTokenizer(4), bytesTokenizer(7), wordsTokenizer} {
		s := defaultMeasured
		s.Tokenizer = tok
		w := measuredWorkload(s, 1)
		if w.requests() != 1024 || w.tok != tok {
			t.Fatalf("%s: %d requests, tokenizer %s", tok, w.requests(), w.tok)
		}
		// The prefixes, made as measuredWorkload makes them.
		g := newTextGen(1 ^ 0xa)
		g.tok = tok
		prefixes := make([]string, s.Prefixes)
		total := 0
		for i := range prefixes {
			prefixes[i] = g.text(s.PrefixTokens)
			total += len(prefixes[i])
		}
		if got := float64(total) / float64(len(prefixes)); got != w.prefixBytes {
			t.Fatalf("%s: prefixBytes %.0f, the prefixes average %.0f", tok, w.prefixBytes, got)
		}
		if !tok.words() && w.prefixBytes != float64(s.PrefixTokens*tok.bytes()) {
			t.Fatalf("%s: prefixes of %.0f bytes, want %d", tok, w.prefixBytes, s.PrefixTokens*tok.bytes())
		}
		firsts := map[string]int{}
		for i, p := range prefixes {
			if other, ok := firsts[p[:16]]; ok {
				t.Fatalf("%s: prefixes %d and %d start alike", tok, i, other)
			}
			firsts[p[:16]] = i
		}
		suffixStarts := map[int]map[string]bool{}
		for _, ss := range w.sessions {
			r := ss[0]
			if r.Tokenizer != tok {
				t.Fatalf("%s: request made for %s", tok, r.Tokenizer)
			}
			if got := r.promptTokens(); got != s.PrefixTokens+s.SuffixTokens {
				t.Fatalf("%s: prompt of %d tokens, want %d", tok, got, s.PrefixTokens+s.SuffixTokens)
			}
			p := prefixes[r.Group]
			suffix, ok := strings.CutPrefix(r.Prompt, p)
			if !ok {
				t.Fatalf("%s: a request of prefix %d does not start with it", tok, r.Group)
			}
			// The prefix ends on a token boundary of the whole prompt: its
			// 2,048 tokens (128 blocks) are the prompt's first.
			if a, b := tok.count(p), tok.count(suffix); a != s.PrefixTokens || b != s.SuffixTokens {
				t.Fatalf("%s: prefix %d and suffix %d tokens, want %d and %d", tok, a, b, s.PrefixTokens, s.SuffixTokens)
			}
			if suffixStarts[r.Group] == nil {
				suffixStarts[r.Group] = map[string]bool{}
			}
			if suffixStarts[r.Group][suffix[:16]] {
				t.Fatalf("%s: two repeats of prefix %d start their suffix alike", tok, r.Group)
			}
			suffixStarts[r.Group][suffix[:16]] = true
		}
		if len(suffixStarts) != s.Prefixes {
			t.Fatalf("%s: %d prefixes used, want %d", tok, len(suffixStarts), s.Prefixes)
		}
		for g, m := range suffixStarts {
			if len(m) != s.Repeats {
				t.Fatalf("%s: prefix %d used %d times, want %d", tok, g, len(m), s.Repeats)
			}
		}
	}
}

func TestTokenizerFlagsAndNames(t *testing.T) {
	for _, tc := range []struct {
		tok  tokenizer
		name string
		args []string
	}{
		{tokenizer{}, "bytes/4", nil},
		{bytesTokenizer(4), "bytes/4", []string{"--tokenizer", "bytes", "--bytes-per-token", "4"}},
		{bytesTokenizer(7), "bytes/7", []string{"--tokenizer", "bytes", "--bytes-per-token", "7"}},
		{wordsTokenizer, "words", []string{"--tokenizer", "words"}},
	} {
		if tc.tok.String() != tc.name || !reflect.DeepEqual(tc.tok.simArgs(), tc.args) {
			t.Errorf("%+v: %q %q, want %q %q", tc.tok, tc.tok.String(), tc.tok.simArgs(), tc.name, tc.args)
		}
	}
	got, err := parseTokenizers("2, 4,bytes/7,words,2")
	if want := []tokenizer{bytesTokenizer(2), bytesTokenizer(4), bytesTokenizer(7), wordsTokenizer}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("parseTokenizers: %v %v", got, err)
	}
	for _, bad := range []string{"1", "9", "bpe", ""} {
		if _, err := parseTokenizers(bad); err == nil {
			t.Errorf("--tokenizers %q accepted", bad)
		}
	}
	if k, err := parseWorkloads("tokenizers,a"); err != nil || !reflect.DeepEqual(k, []string{"a", "t"}) {
		t.Fatalf("workloads %v %v", k, err)
	}
	w := &workload{key: "t", tok: bytesTokenizer(2)}
	if got := w.runName(cfgOracle); got != "t-bytes2-oracle" {
		t.Fatalf("run name %q", got)
	}
	if got := (&workload{key: "a"}).runName(cfgOracle); got != "a-oracle" {
		t.Fatalf("run name %q", got)
	}
}

func TestSplitGroupsCountsPrefixesServedByMoreThanOnePod(t *testing.T) {
	ok := func(group int, pod string) result { return result{status: 200, pod: pod, group: group} }
	results := []result{
		ok(0, "pod-0"), ok(0, "pod-0"), ok(0, "pod-0"), // one pod
		ok(1, "pod-0"), ok(1, "pod-1"), // split
		ok(2, "pod-1"),
		{status: 429, group: 2}, {err: io.EOF, pod: "pod-0", group: 2}, // not served: not counted
		{status: 200, pod: "pod-0", group: 2, err: nil}, // split
		ok(3, "pod-1"), ok(3, ""), // no pod named: not counted
		ok(-1, "pod-0"), ok(-1, "pod-1"), // no group
		{status: 503, group: 4}, // a group never answered
	}
	split, groups := splitGroups(results)
	if split != 2 || groups != 4 {
		t.Fatalf("%d of %d groups split, want 2 of 4", split, groups)
	}
	if got := splitShare(&runStats{split: split, groups: groups}); got != 0.5 {
		t.Fatalf("share %v", got)
	}
	if !math.IsNaN(splitShare(&runStats{})) {
		t.Fatal("no groups should give NaN")
	}
}

func TestPickerEndpointFigures(t *testing.T) {
	text := `# TYPE infergate_epp_server_bytes_per_token gauge
infergate_epp_server_bytes_per_token{endpoint="127.0.0.1:1"} 2.0003
infergate_epp_server_bytes_per_token{endpoint="127.0.0.1:2"} 4
infergate_epp_server_tokenizer_calibrated{endpoint="127.0.0.1:1"} 1
infergate_epp_server_tokenizer_calibrated{endpoint="127.0.0.1:2"} 0
infergate_epp_prefix_hit_rate{endpoint="127.0.0.1:1",source="index"} 0.75
infergate_epp_prefix_hit_rate{source="server",endpoint="127.0.0.1:1"} 0.7
infergate_epp_prefix_index_blocks{endpoint="127.0.0.1:1"} 9000
infergate_epp_prefix_index_blocks{endpoint="127.0.0.1:9"} 5
infergate_epp_decision_duration_seconds_sum 3
`
	ss, err := promSeries(strings.NewReader(text), endpointMetrics...)
	if err != nil || len(ss) != 8 {
		t.Fatalf("%d series, %v", len(ss), err)
	}
	if ss[5].labels["source"] != "server" || ss[5].labels["endpoint"] != "127.0.0.1:1" {
		t.Fatalf("labels %v", ss[5].labels)
	}
	r := &runStats{pods: []string{"pod-0", "pod-1"}, endpoints: endpointsOf(ss, []simInfo{{name: "pod-0", addr: "127.0.0.1:1"}, {name: "pod-1", addr: "127.0.0.1:2"}}),
		promptBytes: []float64{4000, 0}, promptTokens: []float64{2000, 0}}
	if got := learnedString(r); got != "2.00 / default" {
		t.Fatalf("learned %q", got)
	}
	if got := trueString(r); got != "2.00 / -" {
		t.Fatalf("true %q", got)
	}
	if got, want := prefixFigures(r), "pod-0 9000 index blocks, hit rate index 75.0% / server 70.0%; pod-1 - index blocks, hit rate index - / server -"; got != want {
		t.Fatalf("prefix figures %q, want %q", got, want)
	}
}

func TestTokenizerGoalsInSummary(t *testing.T) {
	gs := goals{}
	gs.record(goalTokSplit(wordsTokenizer), 0.125)
	gs.record(goalTokHitRate(bytesTokenizer(2)), 0.97)
	gs.record(goalTokSplit(bytesTokenizer(2)), 0)
	gs.record(goalHitRate, 0.99)
	checkSummary(t, gs,
		"| (a) infergate-default / oracle hit rate ≥ 0.97 | 0.99 | 1 of 1 |",
		"| (t) bytes/2: infergate-default / oracle hit rate ≥ 0.97 | 0.97 | 1 of 1 |",
		"| (t) bytes/2: prefixes infergate-default split between pods ≤ 10% | 0.0% | 1 of 1 |",
		"| (t) words: prefixes infergate-default split between pods ≤ 10% | 12.5% | 0 of 1 |")
}

// checkSummary fails unless gs's summary is the table of rows.
func checkSummary(t *testing.T, gs goals, rows ...string) {
	t.Helper()
	want := "| goal | figure per run | met |\n|---|---|---:|\n" + strings.Join(rows, "\n") + "\n"
	if got := gs.summary(); got != want {
		t.Fatalf("summary:\n%s\nwant:\n%s", got, want)
	}
}

func TestCapacitySplitFollowsTheKVCaches(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		weights []int
		want    []int // groups per sim
	}{
		{"h", 240, kvWeights(defaultHetero.Servers), []int{24, 48, 72, 96}},
		{"quick h", 30, kvWeights(quickHetero.Servers), []int{3, 6, 9, 12}},
		{"equal sims", 8, []int{1, 1, 1, 1}, []int{2, 2, 2, 2}},
		{"uneven remainder", 5, []int{1, 2}, []int{2, 3}},
		{"no groups", 0, []int{1, 2}, []int{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := capacityCounts(tc.n, tc.weights); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("counts %v, want %v", got, tc.want)
			}
		})
	}
	// Largest remaining share first: every prefix so far is spread in
	// proportion, not the largest sim's share first.
	split := capacitySplit(240, kvWeights(defaultHetero.Servers))
	for k := 10; k <= 240; k += 10 {
		got := make([]int, 4)
		for _, i := range split[:k] {
			got[i]++
		}
		for i, w := range []float64{0.1, 0.2, 0.3, 0.4} {
			if math.Abs(float64(got[i])-w*float64(k)) > 1 {
				t.Fatalf("after %d groups sim %d has %d, want about %.1f", k, i, got[i], w*float64(k))
			}
		}
	}
	// The capacity oracle routes a group to its sim, through the proxy.
	st := &stack{cfg: cfgOracleCapacity, base: "http://proxy", sims: []simInfo{{addr: "a"}, {addr: "b"}}, split: []int{1, 0, 1}}
	route := st.router()
	for g, want := range map[int]string{0: "b", 1: "a", 2: "b", 3: "b"} {
		if got := route(request{Group: g}); got != (target{base: "http://proxy", steer: want}) {
			t.Fatalf("group %d went to %+v, want %s", g, got, want)
		}
	}
}

func TestHeterogeneousWorkload(t *testing.T) {
	s := defaultHetero
	w := heteroWorkload(s, 1)
	if w.key != "h" || w.pods != 4 || w.concurrency != 32 || w.requests() != 240*8 || w.groups != 240 {
		t.Fatalf("key %s, pods %d, concurrency %d, %d requests, %d groups", w.key, w.pods, w.concurrency, w.requests(), w.groups)
	}
	total, prefixes := 0, s.Prefixes*s.PrefixTokens
	for _, srv := range w.serverList() {
		total += srv.kv()
	}
	if share := float64(prefixes) / float64(total); share < 0.75 || share > 0.79 {
		t.Fatalf("the prefixes take %.1f%% of the pool's KV cache, want about 77%%", 100*share)
	}
	if again := heteroWorkload(s, 1); !reflect.DeepEqual(again.sessions, w.sessions) {
		t.Fatal("same seed, different workload")
	}
	base := parseSimHelp(`      --inter-token-latency duration      x (default 8ms)
      --max-num-seqs int                  x (default 256)
      --prefill-overhead duration         x (default 5ms)
      --prefill-time-per-token duration   x (default 15µs)
`)
	for _, tc := range []struct {
		srv  server
		want []string
	}{
		{server{}, nil},
		{server{64000, 1.5}, []string{"--kv-cache-tokens", "64000", "--block-size", "16", "--prefill-time-per-token", "22.5µs", "--inter-token-latency", "12ms"}},
		{server{192000, 1}, []string{"--kv-cache-tokens", "192000", "--block-size", "16"}},
		{server{256000, 0.8}, []string{"--kv-cache-tokens", "256000", "--block-size", "16", "--prefill-time-per-token", "12µs", "--inter-token-latency", "6.4ms"}},
	} {
		if got := tc.srv.args(base); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%+v: args %q, want %q", tc.srv, got, tc.want)
		}
	}
	if m := (server{pace: 1.25}).model(base); m.itl != 10*time.Millisecond || m.overhead != base.overhead {
		t.Fatalf("model %+v", m)
	}
}

// TestHeteroChatWorkload: (m) is (b)'s conversations on (h)'s pool, each
// opening with a document of its own after the shared system prompt, so
// that its turns grow from the document on and no two conversations share
// more than the system prompt.
func TestHeteroChatWorkload(t *testing.T) {
	s := defaultHeteroChat
	w := heteroChatWorkload(s, 1)
	if w.key != "m" || w.pods != 4 || w.concurrency != 48 || w.requests() != 240*6 || w.groups != 240 || !reflect.DeepEqual(w.servers, defaultHetero.Servers) {
		t.Fatalf("key %s, pods %d, concurrency %d, %d requests, %d groups, servers %v", w.key, w.pods, w.concurrency, w.requests(), w.groups, w.servers)
	}
	first := func(c int) string { return w.sessions[c][0].Messages[1].Content }
	for c, conv := range w.sessions[:2] {
		if got := conv[0].Messages[0].Content; got != w.sessions[1-c][0].Messages[0].Content {
			t.Fatal("conversations do not share the system prompt")
		}
		// The document is ContextTokens of the generator's words (4 bytes
		// a token) before the question.
		if doc, _, ok := strings.Cut(first(c), "\n\n"); !ok || len(doc) != 4*s.Chat.ContextTokens {
			t.Fatalf("conversation %d's first message opens with %d bytes, want a %d-token document", c, len(doc), s.Chat.ContextTokens)
		}
		for i, turn := range conv[1:] {
			if turn.Messages[1].Content != first(c) || len(turn.Messages) != 2*(i+2) {
				t.Fatalf("conversation %d turn %d does not resend the history with the document", c, i+1)
			}
		}
	}
	if first(0)[:64] == first(1)[:64] {
		t.Fatal("two conversations open with the same document")
	}
	// (b), which shares the generator, keeps its conversations without one.
	if b := defaultMultiTurn; b.ContextTokens != 0 {
		t.Fatalf("workload b gained a document: %+v", b)
	}
}

func TestStreamGenSendsEveryPrefixOnceARound(t *testing.T) {
	s := quickHetero
	g := newStreamGen(s, 1)
	w := heteroWorkload(s, 1)
	prefixOf := map[int]string{}
	for _, ss := range w.sessions {
		prefixOf[ss[0].Group] = ss[0].Prompt[:s.PrefixTokens*bytesPerToken]
	}
	suffixes := map[string]bool{}
	for round := range 3 {
		seen := map[int]bool{}
		for k := range s.Prefixes {
			r := g.request(round*s.Prefixes + k)
			if seen[r.Group] {
				t.Fatalf("round %d sends prefix %d twice", round, r.Group)
			}
			seen[r.Group] = true
			if r.Prompt[:s.PrefixTokens*bytesPerToken] != prefixOf[r.Group] || r.promptTokens() != s.PrefixTokens+s.SuffixTokens {
				t.Fatalf("request %d: not prefix %d of workload h + a %d-token suffix", round*s.Prefixes+k, r.Group, s.SuffixTokens)
			}
			suffix := r.Prompt[s.PrefixTokens*bytesPerToken:][:blockBytes]
			if suffixes[suffix] {
				t.Fatal("two requests start their suffix alike")
			}
			suffixes[suffix] = true
		}
	}
	if a, b := g.request(7), newStreamGen(s, 1).request(7); !reflect.DeepEqual(a, b) {
		t.Fatal("request 7 differs between generators of the same seed")
	}
	g.skip = 5
	if a, b := g.request(2), newStreamGen(s, 1).request(7); !reflect.DeepEqual(a, b) {
		t.Fatal("skip does not start the stream later")
	}
}

func TestFailoverFigures(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ok := func(at time.Duration, cached int) result {
		return result{status: 200, prompt: 100, cached: cached, end: t0.Add(at)}
	}
	fail := func(at time.Duration) result { return result{status: 500, end: t0.Add(at)} }
	f := &failoverReport{spec: failoverSpec{duration: 30 * time.Second, window: 10 * time.Second, bucket: 5 * time.Second},
		t0: t0, kill: 10 * time.Second, restart: 20 * time.Second}
	f.results = []result{
		ok(1*time.Second, 80), ok(9*time.Second, 90), // before: 85%
		fail(10*time.Second + 100*time.Millisecond), fail(13 * time.Second), // the kill
		ok(11*time.Second, 80), ok(19*time.Second, 80), // after: 80%
		fail(21 * time.Second),                         // the restart
		ok(21*time.Second, 40), ok(26*time.Second, 85), // windows from the restart: 40%, 85%
		fail(27 * time.Second), // elsewhere
	}
	before, nb := f.before()
	after, na := f.after()
	if before != 0.85 || nb != 2 || after != 0.8 || na != 2 {
		t.Fatalf("before %v (%d), after %v (%d)", before, nb, after, na)
	}
	if got := f.windows(); !reflect.DeepEqual(got, []float64{0.4, 0.85}) {
		t.Fatalf("windows %v", got)
	}
	if d, ok := f.recovery(0.95); !ok || d != 5*time.Second {
		t.Fatalf("recovery %v %v, want 5s", d, ok)
	}
	if _, ok := f.recovery(1.01); ok {
		t.Fatal("recovered beyond the rate before")
	}
	fails := f.failures()
	if len(fails.inKill) != 2 || len(fails.atRestart) != 1 || !reflect.DeepEqual(fails.outside, []time.Duration{27 * time.Second}) {
		t.Fatalf("failures %+v", fails)
	}
}

func TestReplicaFlagsLabelsAndGoals(t *testing.T) {
	if got, err := parseReplicas("3, 1,2,1"); err != nil || !reflect.DeepEqual(got, []int{1, 2, 3}) {
		t.Fatalf("replicas %v %v", got, err)
	}
	for _, bad := range []string{"0", "6", "two", ""} {
		if _, err := parseReplicas(bad); err == nil {
			t.Errorf("--replicas %q accepted", bad)
		}
	}
	one, several := &env{replicas: []int{1}}, &env{replicas: []int{1, 3}}
	for _, tc := range []struct {
		e        *env
		cfg      string
		n        int
		want     string
		wantName string
	}{
		{one, cfgDefault, 1, cfgDefault, "h-infergate-default"},
		{several, cfgDefault, 1, "infergate-default ×1", "h-infergate-default"},
		{several, cfgDefault, 3, "infergate-default ×3", "h-infergate-default-x3"},
		{several, cfgRoundRobin, 0, cfgRoundRobin, "h-round-robin"},
	} {
		if got := tc.e.label(tc.cfg, tc.n); got != tc.want {
			t.Errorf("label(%s, %d) = %q, want %q", tc.cfg, tc.n, got, tc.want)
		}
		if got := replicaRunName("h-"+tc.cfg, tc.cfg, tc.n); got != tc.wantName {
			t.Errorf("run name %q, want %q", got, tc.wantName)
		}
	}
	gs := goals{}
	gs.record(goalReplicaHit.at(3), 0.99)
	gs.record(goalReplicaHit.at(2), 0.96)
	gs.record(goalHetero.at(3), 0.5)
	gs.record(goalHetero, 0.6)
	checkSummary(t, gs,
		"| (h) infergate-default / oracle-capacity hit rate ≥ 0.95 | 0.60 | 0 of 1 |",
		"| (h) infergate-default / oracle-capacity hit rate, ×3 replicas ≥ 0.95 | 0.50 | 0 of 1 |",
		"| (h) infergate-default ×2 / ×1 hit rate ≥ 0.97 | 0.96 | 0 of 1 |",
		"| (h) infergate-default ×3 / ×1 hit rate ≥ 0.97 | 0.99 | 1 of 1 |")
}

func TestPeerFiguresSinceTheBase(t *testing.T) {
	text := `infergate_epp_peers 2
infergate_epp_peer_decisions_received_total 130
infergate_epp_peer_decisions_total{index="agreed"} 95
infergate_epp_peer_decisions_total{index="differed"} 5
infergate_epp_peer_dropped_total{reason="queue-full"} 0
infergate_epp_peer_dropped_total{reason="send-failed"} 3
infergate_epp_peer_lag_seconds_sum 0.2
infergate_epp_peer_lag_seconds_count 100
infergate_epp_peer_state_merges_total{result="ok"} 1
`
	m, err := pickerSamples([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	base := map[string]float64{metricPeerReceived: 30, metricPeerLag + "_sum": 0.1, metricPeerLag + "_count": 50}
	got := peerFiguresOf(m, base)
	want := peerFigures{peers: 2, received: 100, agreed: 95, differed: 5, dropped: 3, mergesOK: 1, lag: 2 * time.Millisecond, whyDropped: "send-failed 3"}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if got.differedShare() != 0.05 || got.droppedString() != "3 (send-failed 3)" {
		t.Fatalf("share %v, dropped %q", got.differedShare(), got.droppedString())
	}
	if got := joinIndexSizes([]indexSize{{blocks: "10"}, {blocks: "12"}}); got != (indexSize{blocks: "10 / 12"}) {
		t.Fatalf("index sizes %+v", got)
	}
}

// TestFailoverQuick runs the failover timeline at its small size through
// the real binaries: workload h's quick pool, two picker replicas behind
// the stand-in, one killed and started again. It checks what could break:
// the replicas saw each other and shared their decisions, the restarted
// one merged the survivor's state, nothing failed but around the kill (and
// the stand-in's reconnect at the restart), and the hit rate after the
// restart did not collapse.
func TestFailoverQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 7 processes for about 40 s")
	}
	bin := t.TempDir()
	if err := childproc.Build(t.Context(), bin, "infergate", "envoysim"); err != nil {
		t.Fatal(err)
	}
	infergate := filepath.Join(bin, "infergate")
	e := &env{binary: infergate, standIn: filepath.Join(bin, "envoysim"), scale: 1, dir: t.TempDir(), model: readSimModel(infergate),
		goals: goals{}, replicas: []int{2}}
	f, err := e.failover(t.Context(), quickFailover, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.startPeers, []float64{1, 1}) {
		t.Errorf("peers seen by each replica as the load started: %v, want 1 each", f.startPeers)
	}
	for name, p := range map[string]peerFigures{"the killed replica": f.victim, "the survivor": f.survivorAtKill, "the restarted replica": f.restarted} {
		if p.received == 0 {
			t.Errorf("%s learned no decision of its peer", name)
		}
	}
	if f.restarted.mergesOK < 1 {
		t.Errorf("the restarted replica merged no state on joining")
	}
	if f.back < 0 {
		t.Errorf("the restarted replica made no decision")
	}
	fails := f.failures()
	if len(fails.outside) > 0 {
		t.Errorf("requests failed outside the kill and restart windows at %v", fails.outside)
	}
	before, _ := f.before()
	after, n := f.hitRate(f.restart, f.spec.duration)
	if n == 0 || !(after >= 0.8*before) {
		t.Errorf("hit rate after the restart %s of %d requests, before the kill %s: want at least 0.8 of it", pctString(after), n, pctString(before))
	}
	afterKill, _ := f.after()
	t.Logf("kill at %s: %d failed; restart at %s: %d failed, first decision at %s; hit rate before %s, after the kill %s, after the restart %s",
		f.kill.Round(time.Millisecond), len(fails.inKill), f.restart.Round(time.Millisecond), len(fails.atRestart), f.back.Round(time.Millisecond),
		pctString(before), pctString(afterKill), pctString(after))
}
