package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// bytesPerToken is the simulator's tokenizer: 4 bytes of text are one token.
const bytesPerToken = 4

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
	return (len(r.promptText()) + bytesPerToken - 1) / bytesPerToken
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

// text returns exactly tokens×4 bytes of words, each followed by a space
// (the last one possibly cut).
func (g *textGen) text(tokens int) string {
	n := tokens * bytesPerToken
	var b strings.Builder
	b.Grow(n + 16)
	for b.Len() < n {
		b.WriteString(g.vocab[g.r.IntN(len(g.vocab))])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

// between returns a uniform integer in [lo, hi].
func (g *textGen) between(lo, hi int) int { return lo + g.r.IntN(hi-lo+1) }

// measuredSpec is workload (a): the measured gap.
type measuredSpec struct {
	Pods, Prefixes, Repeats               int
	PrefixTokens, SuffixTokens, MaxTokens int
	Concurrency                           int
}

var defaultMeasured = measuredSpec{Pods: 2, Prefixes: 128, Repeats: 8, PrefixTokens: 2048, SuffixTokens: 128, MaxTokens: 128, Concurrency: 32}

func measuredWorkload(s measuredSpec, seed uint64) *workload {
	g := newTextGen(seed ^ 0xa)
	prefixes := make([]string, s.Prefixes)
	for i := range prefixes {
		prefixes[i] = g.text(s.PrefixTokens)
	}
	var sessions []session
	for i, p := range prefixes {
		for range s.Repeats {
			sessions = append(sessions, session{{Prompt: p + g.text(s.SuffixTokens), MaxTokens: s.MaxTokens, Group: i}})
		}
	}
	g.r.Shuffle(len(sessions), func(i, j int) { sessions[i], sessions[j] = sessions[j], sessions[i] })
	return &workload{
		key: "a", name: "measured", pods: s.Pods, concurrency: s.Concurrency, sessions: sessions,
		describe: fmt.Sprintf("%d pods; %d distinct %d-token prefixes × %d repeats, each + a unique %d-token suffix, max_tokens %d; %d requests in random order, %d concurrent; completions API",
			s.Pods, s.Prefixes, s.PrefixTokens, s.Repeats, s.SuffixTokens, s.MaxTokens, s.Prefixes*s.Repeats, s.Concurrency),
	}
}

// multiTurnSpec is workload (b): conversations sharing a system prompt.
type multiTurnSpec struct {
	Pods, Conversations, Turns int
	SystemTokens               int
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
		for range s.Turns {
			history = append(history, message{Role: "user", Content: g.text(g.between(s.MeanTokens-s.Spread, s.MeanTokens+s.Spread))})
			answer := g.between(s.MeanTokens-s.Spread, s.MeanTokens+s.Spread)
			conv = append(conv, request{Chat: true, Messages: append([]message(nil), history...), MaxTokens: answer, Group: c})
			history = append(history, message{Role: "assistant", Content: g.text(answer)})
		}
		sessions = append(sessions, conv)
	}
	return &workload{
		key: "b", name: "multi-turn", pods: s.Pods, concurrency: s.Concurrency, sessions: sessions,
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
