package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/infergate/infergate/inference/wire"
	"github.com/infergate/infergate/sim"
)

// bytesPerToken is the simulator's default tokenizer, the wire convention
// the picker starts from too: 4 bytes of text are one token.
const bytesPerToken = wire.DefaultBytesPerToken

// tokenizer is the sims' tokenizer in a run: kind sim.TokenizerBytes with n
// bytes a token, or sim.TokenizerWords. The zero value is the sims'
// default (4 bytes a token) and starts them without tokenizer flags.
type tokenizer struct {
	kind string
	n    int
}

func bytesTokenizer(n int) tokenizer { return tokenizer{sim.TokenizerBytes, n} }

var wordsTokenizer = tokenizer{kind: sim.TokenizerWords}

func (t tokenizer) words() bool { return t.kind == sim.TokenizerWords }

// bytes is the bytes tokenizer's token size (4 for words, the sims' own
// default for the flag it ignores).
func (t tokenizer) bytes() int {
	if t.n == 0 || t.words() {
		return bytesPerToken
	}
	return t.n
}

// String names the tokenizer as the sims log it: bytes/4, words.
func (t tokenizer) String() string {
	if t.words() {
		return sim.TokenizerWords
	}
	return sim.TokenizerBytes + "/" + strconv.Itoa(t.bytes())
}

// simArgs are the sims' flags for the tokenizer; none for the zero value.
func (t tokenizer) simArgs() []string {
	switch {
	case t == tokenizer{}:
		return nil
	case t.words():
		return []string{"--tokenizer", sim.TokenizerWords}
	}
	return []string{"--tokenizer", sim.TokenizerBytes, "--bytes-per-token", strconv.Itoa(t.bytes())}
}

// count returns the tokens of text as the sims count them.
func (t tokenizer) count(text string) int {
	if t.words() {
		return sim.CountTokens(sim.TokenizerWords, 0, text)
	}
	return sim.CountTokens(sim.TokenizerBytes, t.bytes(), text)
}

// parseTokenizers reads --tokenizers: bytes per token (2 to 8, also as
// bytes/N) or words.
func parseTokenizers(s string) ([]tokenizer, error) {
	var out []tokenizer
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		var t tokenizer
		if f == sim.TokenizerWords {
			t = wordsTokenizer
		} else {
			n, err := strconv.Atoi(strings.TrimPrefix(f, sim.TokenizerBytes+"/"))
			if err != nil || n < sim.MinBytesPerToken || n > sim.MaxBytesPerToken {
				return nil, fmt.Errorf("--tokenizers: %q: want bytes per token (%d to %d) or %s", f, sim.MinBytesPerToken, sim.MaxBytesPerToken, sim.TokenizerWords)
			}
			t = bytesTokenizer(n)
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out, nil
}

// message is one chat message.
type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// request is one inference request of a workload.
type request struct {
	// Chat selects /v1/chat/completions with Messages; otherwise
	// /v1/completions with Prompt.
	Chat      bool
	Prompt    string
	Messages  []message
	MaxTokens int
	// NoStream asks for the whole answer at once instead of SSE; the
	// request's time to first token is then not measured.
	NoStream bool
	// Objective is sent as x-llm-d-inference-objective when set.
	Objective string
	// Group is the shared prefix (prefix or conversation) the request
	// belongs to, which the oracle routes by; -1 when it shares none.
	Group int
	// Tokenizer is the sims' tokenizer the prompt was made for.
	Tokenizer tokenizer
}

// promptText is the prompt as the simulator sees it: chat messages are
// concatenated without a template.
func (r request) promptText() string {
	if !r.Chat {
		return r.Prompt
	}
	var b strings.Builder
	for _, m := range r.Messages {
		b.WriteString(m.Content)
	}
	return b.String()
}

// promptTokens counts the prompt's tokens the way the simulator does.
func (r request) promptTokens() int {
	return r.Tokenizer.count(r.promptText())
}

// session is a list of requests sent one after the other (a conversation);
// independent requests are sessions of one.
type session []request

// workload is what one table measures.
type workload struct {
	key, name   string
	pods        int
	concurrency int // sessions in flight at once
	sessions    []session
	describe    string
	tok         tokenizer // the sims'
	// prefixBytes is the mean size of a shared prefix, where the workload
	// has them of one token count.
	prefixBytes float64
	// servers are the sims where they differ (workload h); nil runs pods
	// default sims.
	servers []server
	// groups is how many shared prefixes (request groups) there are.
	groups int
}

// serverList is the workload's sims, one each.
func (w *workload) serverList() []server {
	if w.servers != nil {
		return w.servers
	}
	return make([]server, w.pods)
}

// runName names a run of the workload under cfg (its log directory).
func (w *workload) runName(cfg string) string {
	if w.tok == (tokenizer{}) {
		return w.key + "-" + cfg
	}
	return w.key + "-" + strings.ReplaceAll(w.tok.String(), "/", "") + "-" + cfg
}

func (w *workload) requests() int {
	n := 0
	for _, s := range w.sessions {
		n += len(s)
	}
	return n
}

// textGen makes prompt text of exact token counts from a seeded vocabulary
// of pseudo-random words, so that two generated texts differ from their
// first KV-cache block on.
type textGen struct {
	r     *rand.Rand
	vocab []string
	tok   tokenizer
	// cost is the tokens of " "+vocab[i] under the words tokenizer, made
	// on first use.
	cost []int
}

func newTextGen(seed uint64) *textGen {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	vocab := make([]string, 4096)
	for i := range vocab {
		b := make([]byte, 2+r.IntN(8))
		for j := range b {
			b[j] = byte('a' + r.IntN(26))
		}
		vocab[i] = string(b)
	}
	return &textGen{r: r, vocab: vocab}
}

// text returns text of exactly tokens tokens of g.tok. For a bytes
// tokenizer of n bytes a token that is tokens×n bytes of words, each
// followed by a space (the last one possibly cut). For words it is words
// each preceded by a space: a token boundary falls before every such space,
// so the tokens of texts put together add up and a text's blocks are those
// of any prompt it starts.
func (g *textGen) text(tokens int) string {
	if g.tok.words() {
		return g.wordsText(tokens)
	}
	n := tokens * g.tok.bytes()
	var b strings.Builder
	b.Grow(n + 16)
	for b.Len() < n {
		b.WriteString(g.vocab[g.r.IntN(len(g.vocab))])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

func (g *textGen) wordsText(tokens int) string {
	if g.cost == nil {
		g.cost = make([]int, len(g.vocab))
		for i, w := range g.vocab {
			g.cost[i] = g.tok.count(" " + w)
		}
	}
	var b strings.Builder
	b.Grow(tokens * 7)
	for left := tokens; left > 0; {
		// Draw again a word longer than the tokens left (a word of more
		// than 8 letters is two tokens; most are one).
		i := g.r.IntN(len(g.vocab))
		if g.cost[i] > left {
			continue
		}
		b.WriteByte(' ')
		b.WriteString(g.vocab[i])
		left -= g.cost[i]
	}
	return b.String()
}

// texts returns n texts of tokens tokens each.
func (g *textGen) texts(n, tokens int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = g.text(tokens)
	}
	return out
}

// between returns a uniform integer in [lo, hi].
func (g *textGen) between(lo, hi int) int { return lo + g.r.IntN(hi-lo+1) }

// measuredSpec is workload (a): the measured gap.
type measuredSpec struct {
	Pods, Prefixes, Repeats               int
	PrefixTokens, SuffixTokens, MaxTokens int
	Concurrency                           int
	// Tokenizer is the sims' tokenizer the token counts are of.
	Tokenizer tokenizer
}

var defaultMeasured = measuredSpec{Pods: 2, Prefixes: 128, Repeats: 8, PrefixTokens: 2048, SuffixTokens: 128, MaxTokens: 128, Concurrency: 32}

func measuredWorkload(s measuredSpec, seed uint64) *workload {
	g := newTextGen(seed ^ 0xa)
	g.tok = s.Tokenizer
	prefixes := g.texts(s.Prefixes, s.PrefixTokens)
	var sessions []session
	for i, p := range prefixes {
		for range s.Repeats {
			sessions = append(sessions, session{{Prompt: p + g.text(s.SuffixTokens), MaxTokens: s.MaxTokens, Group: i, Tokenizer: s.Tokenizer}})
		}
	}
	g.r.Shuffle(len(sessions), func(i, j int) { sessions[i], sessions[j] = sessions[j], sessions[i] })
	prefixBytes := 0
	for _, p := range prefixes {
		prefixBytes += len(p)
	}
	return &workload{
		key: "a", name: "measured", pods: s.Pods, concurrency: s.Concurrency, sessions: sessions, tok: s.Tokenizer, groups: s.Prefixes,
		prefixBytes: float64(prefixBytes) / float64(max(len(prefixes), 1)),
		describe: fmt.Sprintf("%d pods; %d distinct %d-token prefixes × %d repeats, each + a unique %d-token suffix, max_tokens %d; %d requests in random order, %d concurrent; completions API",
			s.Pods, s.Prefixes, s.PrefixTokens, s.Repeats, s.SuffixTokens, s.MaxTokens, s.Prefixes*s.Repeats, s.Concurrency),
	}
}

// multiTurnSpec is workload (b): conversations sharing a system prompt.
type multiTurnSpec struct {
	Pods, Conversations, Turns int
	SystemTokens               int
	// ContextTokens, when set, open each conversation's first user message
	// with a document of its own (a file, a page) the turns go on about.
	ContextTokens int
	// User messages and assistant answers are MeanTokens ± Spread tokens.
	MeanTokens, Spread int
	Concurrency        int
}

var defaultMultiTurn = multiTurnSpec{Pods: 4, Conversations: 64, Turns: 6, SystemTokens: 1024, MeanTokens: 64, Spread: 16, Concurrency: 32}

// multiTurnWorkload builds every turn in advance. The assistant messages of
// the history are generated text of the length the turn asked for, standing
// in for the model's answer (the simulator caches prompt blocks only, so
// their content does not change what hits).
func multiTurnWorkload(s multiTurnSpec, seed uint64) *workload {
	g := newTextGen(seed ^ 0xb)
	system := g.text(s.SystemTokens)
	var sessions []session
	for c := range s.Conversations {
		history := []message{{Role: "system", Content: system}}
		var conv session
		for turn := range s.Turns {
			ask := g.text(g.between(s.MeanTokens-s.Spread, s.MeanTokens+s.Spread))
			if turn == 0 && s.ContextTokens > 0 {
				ask = g.text(s.ContextTokens) + "\n\n" + ask
			}
			history = append(history, message{Role: "user", Content: ask})
			answer := g.between(s.MeanTokens-s.Spread, s.MeanTokens+s.Spread)
			conv = append(conv, request{Chat: true, Messages: append([]message(nil), history...), MaxTokens: answer, Group: c})
			history = append(history, message{Role: "assistant", Content: g.text(answer)})
		}
		sessions = append(sessions, conv)
	}
	return &workload{
		key: "b", name: "multi-turn", pods: s.Pods, concurrency: s.Concurrency, sessions: sessions, groups: s.Conversations,
		describe: fmt.Sprintf("%d pods; %d conversations × %d turns sharing one %d-token system prompt; each turn resends the history (user and assistant messages of %d±%d tokens) plus a new user message and asks for %d±%d tokens; turns of a conversation in order, %d conversations at a time; chat API",
			s.Pods, s.Conversations, s.Turns, s.SystemTokens, s.MeanTokens, s.Spread, s.MeanTokens, s.Spread, s.Concurrency),
	}
}

// noSharingSpec is workload (c): unrelated prompts of mixed sizes.
type noSharingSpec struct {
	Pods, Requests       int
	MinPrompt, MaxPrompt int
	MinOutput, MaxOutput int
	Concurrency          int
}

var defaultNoSharing = noSharingSpec{Pods: 4, Requests: 1024, MinPrompt: 200, MaxPrompt: 1200, MinOutput: 32, MaxOutput: 256, Concurrency: 32}

func noSharingWorkload(s noSharingSpec, seed uint64) *workload {
	g := newTextGen(seed ^ 0xc)
	sessions := make([]session, s.Requests)
	for i := range sessions {
		sessions[i] = session{{Prompt: g.text(g.between(s.MinPrompt, s.MaxPrompt)), MaxTokens: g.between(s.MinOutput, s.MaxOutput), Group: -1}}
	}
	return &workload{
		key: "c", name: "no-sharing", pods: s.Pods, concurrency: s.Concurrency, sessions: sessions,
		describe: fmt.Sprintf("%d pods; %d unrelated prompts of %d–%d tokens (uniform) asking for %d–%d tokens (uniform), %d concurrent; completions API",
			s.Pods, s.Requests, s.MinPrompt, s.MaxPrompt, s.MinOutput, s.MaxOutput, s.Concurrency),
	}
}

// noisySpec is workload (d): a steady tenant B and a flooding tenant A.
type noisySpec struct {
	Pods                                   int
	BRequests, BConcurrency, BPrompt, BOut int
	AConcurrency, APrompt, AOut            int
	BObjective, AObjective                 string
	BPriority, APriority                   int
}

// defaultNoisy sizes the flood to over-commit the pool: A's 96 requests in
// flight need 96 × (4,096 + 128) = 405,504 tokens of KV cache where two
// default sims hold 2 × 163,472 = 326,944, so the sims queue and A saturates
// the pool. (32 in flight would fill 41% of it; with 256 running sequences
// per sim and a decode time that does not grow with the batch, that does
// not disturb B at all.) A does not stream: a batch client reads the whole
// answer, and 80 streams relayed token by token would cost the 2-core
// machine more CPU than it has.
var defaultNoisy = noisySpec{
	Pods:      2,
	BRequests: 256, BConcurrency: 16, BPrompt: 512, BOut: 16,
	AConcurrency: 96, APrompt: 4096, AOut: 128,
	BObjective: "interactive", AObjective: "batch", BPriority: 10, APriority: -1,
}

// noisyB returns tenant B's requests.
func noisyB(s noisySpec, seed uint64) []request {
	g := newTextGen(seed ^ 0xd)
	out := make([]request, s.BRequests)
	for i := range out {
		out[i] = request{Prompt: g.text(s.BPrompt), MaxTokens: s.BOut, Objective: s.BObjective, Group: -1}
	}
	return out
}

// floodGen makes tenant A's requests. A sends as many as it can while B
// runs, so they are made on demand, request i from its own seed.
type floodGen struct {
	spec  noisySpec
	seed  uint64
	vocab []string
}

func newFloodGen(s noisySpec, seed uint64) *floodGen {
	return &floodGen{spec: s, seed: seed ^ 0xe, vocab: newTextGen(seed ^ 0xe).vocab}
}

func (f *floodGen) request(i int) request {
	g := &textGen{r: rand.New(rand.NewPCG(f.seed, uint64(i)+1)), vocab: f.vocab}
	return request{Prompt: g.text(f.spec.APrompt), MaxTokens: f.spec.AOut, NoStream: true, Objective: f.spec.AObjective, Group: -1}
}
