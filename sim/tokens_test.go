package sim

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/inference/wire"
)

// tokenizers are the tokenizers the tests run against, by name.
var tokenizers = []struct {
	name string
	cfg  Config
}{
	{"bytes2", Config{BytesPerToken: 2}},
	{"bytes4", Config{}},
	{"bytes7", Config{BytesPerToken: 7}},
	{"bytes8", Config{BytesPerToken: 8}},
	{"words", Config{Tokenizer: TokenizerWords}},
}

func tokenizerOf(cfg Config) tokenizer { return newTokenizer(cfg.WithDefaults()) }

// pieces cuts text at the ends the tokenizer gives.
func pieces(tk tokenizer, text string) []string {
	var out []string
	start := 0
	for _, end := range tokenEnds(tk, text) {
		out = append(out, text[start:end])
		start = end
	}
	return out
}

func TestTokenBoundaries(t *testing.T) {
	bytes2 := Config{BytesPerToken: 2}
	bytes4 := Config{}
	bytes7 := Config{BytesPerToken: 7}
	words := Config{Tokenizer: TokenizerWords}
	tests := []struct {
		name string
		cfg  Config
		text string
		want []string
	}{
		{"bytes2 empty", bytes2, "", nil},
		{"bytes2 partial last", bytes2, "abcde", []string{"ab", "cd", "e"}},
		{"bytes4 spaces are bytes", bytes4, "hello world", []string{"hell", "o wo", "rld"}},
		{"bytes4 exact", bytes4, "abcdefgh", []string{"abcd", "efgh"}},
		{"bytes4 non-ASCII", bytes4, "héllo", []string{"h\xc3\xa9l", "lo"}},
		{"bytes7", bytes7, "hello world", []string{"hello w", "orld"}},
		{"bytes7 short", bytes7, "hi", []string{"hi"}},
		{"words empty", words, "", nil},
		{"words two words", words, "hello world", []string{"hello", " world"}},
		{"words long word", words, "internationalization is", []string{"internat", "ionaliza", "tion", " is"}},
		{"words 20 letters after a space", words, " abcdefghijklmnopqrst", []string{" abcdefgh", "ijklmnop", "qrst"}},
		{"words exactly 8", words, "abcdefgh ijklmnopq", []string{"abcdefgh", " ijklmnop", "q"}},
		{"words multiple spaces", words, "a  b\t\n c", []string{"a", "  b", "\t\n c"}},
		{"words leading space joins the word", words, "  hi there", []string{"  hi", " there"}},
		{"words trailing space alone", words, "hi  ", []string{"hi", "  "}},
		{"words only space", words, " \n ", []string{" \n "}},
		{"words punctuation sticks", words, "Hi, you.", []string{"Hi,", " you."}},
		{"words non-ASCII letters", words, "naïve café", []string{"naïve", " café"}},
		{"words CJK cut every 8 bytes", words, "日本語のテキスト", []string{"日本\xe8\xaa", "\x9eのテ\xe3", "\x82\xad\xe3\x82\xb9\xe3\x83\x88"}},
		{"words non-breaking space is a byte of a word", words, "a\u00a0b c", []string{"a\u00a0b", " c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := tokenizerOf(tt.cfg)
			got := pieces(tk, tt.text)
			if !slices.Equal(got, tt.want) {
				t.Errorf("tokens of %q = %q, want %q", tt.text, got, tt.want)
			}
			if n := tk.count(tt.text); n != len(tt.want) {
				t.Errorf("count(%q) = %d, want %d", tt.text, n, len(tt.want))
			}
		})
	}
}

// randomText mixes words of 1 to 20 letters, runs of white space and
// multi-byte characters, the cases where tokenizers can go wrong.
func randomText(rng *rand.Rand, n int) string {
	alphabet := []string{"a", "b", "z", " ", " ", "  ", "\n", "\t", "é", "日", ".", ","}
	var b strings.Builder
	for b.Len() < n {
		if rng.IntN(4) == 0 {
			b.WriteString(strings.Repeat("x", 1+rng.IntN(20)))
		} else {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
	}
	return b.String()
}

func TestOutputTextRetokenizes(t *testing.T) {
	for _, tc := range tokenizers {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg.WithDefaults()
			tk := newTokenizer(cfg)
			for i := range 200 {
				tok := tk.outputToken(i)
				word, ok := strings.CutPrefix(tok, " ")
				if !ok || word == "" || strings.ContainsAny(word, " \t\n") {
					t.Fatalf("output token %d = %q, want a space and a word", i, tok)
				}
				if cfg.Tokenizer == TokenizerBytes && len(tok) != cfg.BytesPerToken {
					t.Fatalf("output token %d = %q, want %d bytes", i, tok, cfg.BytesPerToken)
				}
				if cfg.Tokenizer == TokenizerWords && len(word) > wordBytes {
					t.Fatalf("output token %d = %q, want a word of at most %d letters", i, tok, wordBytes)
				}
			}
			for _, n := range []int{0, 1, 2, 5, 37, 100} {
				text := outputText(tk, n)
				if got := tk.count(text); got != n {
					t.Errorf("outputText(%d) is %d tokens", n, got)
				}
				// Each generated token stays one token when the answer
				// follows a prompt that ends with a whole token.
				var prompt string
				if cfg.Tokenizer == TokenizerBytes {
					prompt = strings.Repeat("p", 5*cfg.BytesPerToken)
				} else {
					prompt = "a prompt ending in a word"
				}
				want := slices.Clone(tokenEnds(tk, prompt))
				end := len(prompt)
				for i := range n {
					end += len(tk.outputToken(i))
					want = append(want, end)
				}
				if got := tokenEnds(tk, prompt+text); !slices.Equal(got, want) {
					t.Errorf("prompt and %d generated tokens end at %v, want %v", n, got, want)
				}
			}
			if a, b := outputText(tk, 50), outputText(tk, 50); a != b {
				t.Error("output text is not deterministic")
			}
		})
	}
}

func TestBlockHashesSharePrefixes(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, tc := range tokenizers {
		t.Run(tc.name, func(t *testing.T) {
			tk := tokenizerOf(tc.cfg)
			for range 300 {
				text := randomText(rng, rng.IntN(400))
				more := randomText(rng, 1+rng.IntN(200))
				bs := 1 + rng.IntN(8)
				short, long := blockHashes(tk, base, text, bs), blockHashes(tk, base, text+more, bs)
				// All blocks of text are shared but one completed by a token
				// that more extends.
				shared := len(short)
				if ends := tokenEnds(tk, text); len(ends) > 0 && len(ends)%bs == 0 && !slices.Contains(tokenEnds(tk, text+more), len(text)) {
					shared--
				}
				if len(long) < shared || !slices.Equal(short[:shared], long[:shared]) {
					t.Fatalf("text %q + %q, blocks of %d: %d leading hashes shared of %d, want %d", text, more, bs, commonPrefix(short, long), len(short), shared)
				}
				if got, want := len(short), tk.count(text)/bs; got != want {
					t.Fatalf("%d hashes of %d tokens in blocks of %d", got, tk.count(text), bs)
				}
			}
			// A block differs when anything before it differs.
			text := strings.Repeat("word and more ", 40)
			a := blockHashes(tk, base, text, 4)
			b := blockHashes(tk, base, "W"+text[1:], 4)
			c := blockHashes(tk, "other-model", text, 4)
			for i := range a {
				if a[i] == b[i] || a[i] == c[i] {
					t.Fatalf("block %d matches across a different first byte or seed", i)
				}
			}
		})
	}
}

func commonPrefix(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestSequenceBlocksFollowTokenizer(t *testing.T) {
	bytes4 := Config{}
	words := Config{Tokenizer: TokenizerWords}
	tests := []struct {
		name                string
		cfg                 Config
		prompt              string
		maxTokens           int
		promptTokens        int
		promptBlocks, total int
		outputBlocks        int
	}{
		// Blocks of 4 tokens throughout.
		{name: "bytes whole blocks", cfg: bytes4, prompt: strings.Repeat("b", 32), maxTokens: 5,
			promptTokens: 8, promptBlocks: 2, outputBlocks: 1, total: 3},
		// 33 bytes: 9 tokens, the last a partial one that the answer's
		// first token extends.
		{name: "bytes partial token", cfg: bytes4, prompt: strings.Repeat("b", 33), maxTokens: 4,
			promptTokens: 9, promptBlocks: 2, outputBlocks: 1, total: 3},
		// 8 words: 2 full blocks.
		{name: "words ending in a word", cfg: words, prompt: strings.Repeat(" word", 8), maxTokens: 5,
			promptTokens: 8, promptBlocks: 2, outputBlocks: 1, total: 3},
		// 7 words and trailing white space: 8 tokens, but the white
		// space is one token with the answer's first word, so the second
		// block is the answer's.
		{name: "words ending in white space", cfg: words, prompt: strings.Repeat(" word", 7) + "\n", maxTokens: 5,
			promptTokens: 8, promptBlocks: 1, outputBlocks: 2, total: 3},
		{name: "words long words", cfg: words, prompt: " internationalization internationalization", maxTokens: 1,
			promptTokens: 6, promptBlocks: 1, outputBlocks: 0, total: 2},
		{name: "empty prompt", cfg: words, prompt: "", maxTokens: 9,
			promptTokens: 0, promptBlocks: 0, outputBlocks: 2, total: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := tokenizerOf(tt.cfg)
			seq := sequenceBlocks(tk, base, tt.prompt, tt.maxTokens, 4, 100)
			if seq.promptTokens != tt.promptTokens || len(seq.prompt) != tt.promptBlocks ||
				len(seq.output) != tt.outputBlocks || seq.total != tt.total {
				t.Errorf("prompt tokens %d, blocks %d prompt + %d output, %d held; want %d, %d + %d, %d",
					seq.promptTokens, len(seq.prompt), len(seq.output), seq.total,
					tt.promptTokens, tt.promptBlocks, tt.outputBlocks, tt.total)
			}
			// The blocks are those of prompt and answer tokenized together.
			all := blockHashes(tk, base, tt.prompt+outputText(tk, tt.maxTokens), 4)
			if got := append(slices.Clone(seq.prompt), seq.output...); !slices.Equal(got, all[:len(got)]) {
				t.Error("hashes differ from the blocks of prompt and answer")
			}
		})
	}

	// Whatever the text, the prompt's tokens are counted as the prompt
	// alone makes them, and its blocks are those of the prompt alone but
	// for one that a token the answer extends would complete.
	rng := rand.New(rand.NewPCG(3, 3))
	for _, tc := range tokenizers {
		tk := tokenizerOf(tc.cfg)
		for range 300 {
			prompt := randomText(rng, rng.IntN(300))
			bs := 1 + rng.IntN(8)
			seq := sequenceBlocks(tk, base, prompt, 1+rng.IntN(40), bs, 1+rng.IntN(10))
			if seq.promptTokens != tk.count(prompt) {
				t.Fatalf("%s: %q: %d prompt tokens, count says %d", tc.name, prompt, seq.promptTokens, tk.count(prompt))
			}
			own := blockHashes(tk, base, prompt, bs)
			if n := len(seq.prompt); (n != len(own) && n != len(own)-1) || !slices.Equal(seq.prompt, own[:n]) {
				t.Fatalf("%s: %q: prompt blocks are not those of the prompt", tc.name, prompt)
			}
		}
	}
}

func TestUsageAndTokenMetricsFollowTokenizer(t *testing.T) {
	// 56 bytes: 28 tokens of 2 bytes, 14 of 4, 8 of 7; 10 words, of which
	// "everywhere" is two tokens (cut after 8 letters) and "quickest" one.
	const prompt = "the quickest brown fox jumps everywhere over a lazy dog."
	tests := []struct {
		name         string
		cfg          Config
		promptTokens int
	}{
		{"bytes2", Config{BytesPerToken: 2}, 28},
		{"bytes4", Config{}, 14},
		{"bytes7", Config{BytesPerToken: 7}, 8},
		{"words", Config{Tokenizer: TokenizerWords}, 11},
	}
	if len(prompt) != 56 {
		t.Fatalf("prompt is %d bytes", len(prompt))
	}
	const maxTokens, streamTokens = 5, 3
	got := map[string]int{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.TimeScale = 1000
			ts := start(t, cfg)
			resp, body := ts.post(t, context.Background(), "/v1/completions", completionBody(base, prompt, maxTokens))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			r := decode[wireResponse](t, body)
			if r.Usage.PromptTokens != tt.promptTokens || r.Usage.CompletionTokens != maxTokens || r.Usage.TotalTokens != tt.promptTokens+maxTokens {
				t.Errorf("usage = %+v, want %d prompt and %d completion tokens", *r.Usage, tt.promptTokens, maxTokens)
			}
			if n := ts.tok.count(*r.Choices[0].Text); n != maxTokens {
				t.Errorf("answer %q is %d tokens, want %d", *r.Choices[0].Text, n, maxTokens)
			}
			got[tt.name] = r.Usage.PromptTokens

			// A streamed chat request counts the same way.
			chat := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`,
				base, prompt, streamTokens)
			resp, raw := ts.post(t, context.Background(), "/v1/chat/completions", chat)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("stream status %d: %s", resp.StatusCode, raw)
			}
			events := sseEvents(t, raw)
			if u := decode[wireResponse](t, []byte(events[len(events)-2])).Usage; u == nil || u.PromptTokens != tt.promptTokens || u.CompletionTokens != streamTokens {
				t.Errorf("stream usage = %s", events[len(events)-2])
			}

			fams := ts.scrape(t)
			st := ts.Stats()
			for name, want := range map[string]float64{
				"vllm:prompt_tokens_total":        2 * float64(tt.promptTokens),
				"vllm:generation_tokens_total":    maxTokens + streamTokens,
				"vllm:prefix_cache_queries_total": 2 * float64(tt.promptTokens),
			} {
				if got := gauge(t, fams, name); got != want {
					t.Errorf("%s = %g, want %g", name, got, want)
				}
			}
			if st.PromptTokens != 2*uint64(tt.promptTokens) || st.GenerationTokens != maxTokens+streamTokens {
				t.Errorf("Stats = %+v", st)
			}
			if fams["vllm:prompt_tokens_total"].GetType().String() != "COUNTER" || fams["vllm:generation_tokens_total"].GetType().String() != "COUNTER" {
				t.Error("token metrics are not counters")
			}
		})
	}
	if got["bytes2"] != 2*got["bytes4"] {
		t.Errorf("2 bytes a token gives %d prompt tokens, 4 bytes %d: want twice as many", got["bytes2"], got["bytes4"])
	}
}

func TestNextTurnHitsAnswerBlocks(t *testing.T) {
	// Blocks of 4 tokens. An 8-token prompt that generates 9 tokens
	// computes 16 tokens: 4 full blocks stay cached, and the next turn,
	// which quotes the answer, finds all 16 under every tokenizer.
	for _, tc := range tokenizers {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.BlockSize, cfg.TimeScale = 4, 1000
			ts := start(t, cfg)
			prompt := strings.Repeat(" word", 8)
			if c := ts.Config(); c.Tokenizer == TokenizerBytes {
				prompt = strings.Repeat("p", 8*c.BytesPerToken)
			}
			cachedOf := func(prompt string, maxTokens int) (int, string) {
				t.Helper()
				resp, body := ts.post(t, context.Background(), "/v1/completions", completionBody(base, prompt, maxTokens))
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %s", resp.StatusCode, body)
				}
				r := decode[wireResponse](t, body)
				return r.Usage.PromptTokensDetails.CachedTokens, *r.Choices[0].Text
			}
			cached, answer := cachedOf(prompt, 9)
			if cached != 0 {
				t.Fatalf("first turn: cached_tokens = %d, want 0", cached)
			}
			if cached, _ := cachedOf(prompt+answer+" and a question", 1); cached != 16 {
				t.Errorf("next turn: cached_tokens = %d, want 16 (prompt and answer)", cached)
			}
		})
	}
}

func BenchmarkSequenceBlocks(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	var sb strings.Builder
	for sb.Len() < 16<<10 {
		sb.WriteByte(' ')
		for range 2 + rng.IntN(8) {
			sb.WriteByte('a' + byte(rng.IntN(26)))
		}
	}
	prompt := sb.String()
	for _, tc := range tokenizers {
		tk := tokenizerOf(tc.cfg)
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(prompt)))
			for b.Loop() {
				sequenceBlocks(tk, base, prompt, 128, DefaultBlockSize, 10217)
			}
		})
	}
}

func TestGenerationTokensOfAbortedRequest(t *testing.T) {
	// 100 ms a token: a client that leaves after 250 ms has seen the first
	// token due at once and two or so more.
	ts := start(t, Config{InterTokenLatency: 100 * time.Millisecond})
	for _, stream := range []bool{false, true} {
		before := ts.Stats().GenerationTokens
		body := fmt.Sprintf(`{"model":%q,"prompt":"abcdefgh","max_tokens":1000,"stream":%t}`, base, stream)
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/v1/completions", strings.NewReader(body))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body) // ends with the timeout
			resp.Body.Close()
		}
		cancel()
		waitFor(t, "the request to end", func() bool { return ts.Stats().Running == 0 })
		if n := ts.Stats().GenerationTokens - before; n < 2 || n > 6 {
			t.Errorf("stream %t: %d generation tokens counted after 250 ms at 100 ms a token, want about 3", stream, n)
		}
	}
	if st := ts.Stats(); st.PromptTokens != 2*2 || st.RequestsServed != 0 {
		t.Errorf("Stats = %+v, want 4 prompt tokens and no request served", st)
	}
}

func TestCountTokensCountsAsTheServer(t *testing.T) {
	for _, tc := range []struct {
		tokenizer string
		n         int
		text      string
		want      int
	}{
		{"", 0, "abcdefghi", 3},         // the default: 4 bytes a token
		{TokenizerBytes, 2, "abcde", 3}, // a partial token counts
		{TokenizerBytes, 7, "abcdefghijklmn", 2},
		{TokenizerWords, 0, " hello internationalization", 4}, // " hello", " internat", "ionaliza", "tion"
		{TokenizerWords, 4, "a b ", 3},                        // trailing white space is a token
	} {
		if got := CountTokens(tc.tokenizer, tc.n, tc.text); got != tc.want {
			t.Errorf("CountTokens(%q, %d, %q) = %d, want %d", tc.tokenizer, tc.n, tc.text, got, tc.want)
		}
	}
	// It is the count a server so configured reports.
	const prompt = "Tokenizers differ from about 2 bytes a token to 6 or more on longwinded words. "
	for _, tk := range tokenizers {
		cfg := tk.cfg
		cfg.TimeScale = 1000
		ts := start(t, cfg)
		resp, body := ts.post(t, context.Background(), "/v1/completions", completionBody(base, prompt, 1))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", tk.name, resp.StatusCode, body)
		}
		if got, want := CountTokens(tk.cfg.Tokenizer, tk.cfg.BytesPerToken, prompt), decode[wireResponse](t, body).Usage.PromptTokens; got != want {
			t.Errorf("%s: CountTokens %d, the server's usage %d", tk.name, got, want)
		}
	}
}

// TestDefaultTokenizerFollowsTheWire: the simulator's default bytes
// tokenizer makes tokens of the size the picker and the payload processor
// assume, so that an unconfigured stack agrees on a prompt's size.
func TestDefaultTokenizerFollowsTheWire(t *testing.T) {
	cfg := Config{}.WithDefaults()
	if cfg.Tokenizer != TokenizerBytes || cfg.BytesPerToken != wire.DefaultBytesPerToken {
		t.Fatalf("default tokenizer %s/%d, want %s/%d", cfg.Tokenizer, cfg.BytesPerToken, TokenizerBytes, wire.DefaultBytesPerToken)
	}
	if got := CountTokens("", 0, strings.Repeat("x", 10*wire.DefaultBytesPerToken)); got != 10 {
		t.Fatalf("%d bytes make %d tokens, want 10", 10*wire.DefaultBytesPerToken, got)
	}
}

// The two below model the simulator's token and block boundaries from the
// whole text at once, for the tests to hold its incremental bookkeeping to.

// tokenEnds returns the end offset of each token of text.
func tokenEnds(tk tokenizer, text string) []int {
	var ends []int
	for p := 0; p < len(text); {
		p = tk.tokenEnd(text, p)
		ends = append(ends, p)
	}
	return ends
}

// blockHashes returns the chained hashes of the full blocks of blockSize
// tokens of text, the last token of text included. A text's hashes are
// those of any text that starts with it, but for a last block that ends
// with a token the longer text extends.
func blockHashes(tk tokenizer, seed, text string, blockSize int) []uint64 {
	var ends []int
	left := blockSize // tokens until the block is full
	for p := 0; p < len(text); {
		p = tk.tokenEnd(text, p)
		if left--; left == 0 {
			ends, left = append(ends, p), blockSize
		}
	}
	return hashBlocks(seed, text, ends)
}
