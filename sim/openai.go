package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// maxBodyBytes bounds request bodies; prompts beyond it are unrealistic.
const maxBodyBytes = 32 << 20

// genRequest holds the fields of completion and chat requests that the
// simulator uses; everything else is accepted and ignored.
type genRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// job is a validated generation request.
type job struct {
	chat         bool
	model        string
	prompt       string
	maxTokens    int
	stream       bool
	includeUsage bool
}

// badRequest is a client error whose message is safe to return.
type badRequest struct{ msg string }

func (e badRequest) Error() string { return e.msg }

func badRequestf(format string, args ...any) error {
	return badRequest{fmt.Sprintf(format, args...)}
}

func (s *Server) parseJob(r *http.Request, chat bool) (job, error) {
	var req genRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return job{}, badRequestf("invalid JSON body: %v", err)
	}
	j := job{chat: chat, model: req.Model, maxTokens: s.cfg.DefaultMaxTokens, stream: req.Stream}
	if req.Model == "" {
		return job{}, badRequestf("the model field is required")
	}
	j.includeUsage = req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	limit, field := req.MaxTokens, "max_tokens"
	if chat && req.MaxCompletionTokens != nil {
		limit, field = req.MaxCompletionTokens, "max_completion_tokens"
	}
	if limit != nil {
		if *limit < 1 {
			return job{}, badRequestf("%s must be at least 1, got %d", field, *limit)
		}
		j.maxTokens = *limit
	}
	var err error
	if chat {
		j.prompt, err = chatPrompt(req.Messages)
	} else {
		j.prompt, err = completionPrompt(req.Prompt)
	}
	return j, err
}

// completionPrompt accepts a string or an array of strings; an array is
// simulated as one sequence of the joined texts rather than as a batch.
func completionPrompt(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", badRequestf("the prompt field is required")
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return one, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return "", badRequestf("prompt must be a string or an array of strings")
	}
	return strings.Join(many, ""), nil
}

// chatPrompt concatenates the text of all messages, the stand-in for a chat
// template: identical conversation prefixes give identical prompt prefixes.
func chatPrompt(msgs []chatMessage) (string, error) {
	if len(msgs) == 0 {
		return "", badRequestf("messages must not be empty")
	}
	var b strings.Builder
	for i, m := range msgs {
		if len(m.Content) == 0 || string(m.Content) == "null" {
			continue
		}
		var text string
		if err := json.Unmarshal(m.Content, &text); err == nil {
			b.WriteString(text)
			continue
		}
		var parts []contentPart
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return "", badRequestf("messages[%d].content must be a string or an array of content parts", i)
		}
		for _, p := range parts {
			if p.Type == "text" {
				b.WriteString(p.Text)
			}
		}
	}
	return b.String(), nil
}

func (s *Server) handleGenerate(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
		j, err := s.parseJob(r, chat)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		if !s.models[j.model] {
			writeError(w, http.StatusNotFound, fmt.Sprintf("the model `%s` does not exist", j.model))
			return
		}
		s.run(r.Context(), w, j)
	}
}

// run queues the job, simulates prefill and decode, and writes the answer.
// When the client goes away the deferred releases free the slot and blocks.
func (s *Server) run(ctx context.Context, w http.ResponseWriter, j job) {
	arrival := time.Now()
	seq := sequenceBlocks(s.tok, j.model, j.prompt, j.maxTokens, s.cfg.BlockSize, s.cache.capacity)
	promptTokens := seq.promptTokens

	t, err := s.sched.acquire(ctx, j.model, seq)
	if err != nil {
		if errors.Is(err, errQueueFull) {
			writeError(w, http.StatusTooManyRequests, fmt.Sprintf("%v: %d requests already waiting", err, s.cfg.MaxWaitingQueue))
		}
		return // otherwise the client is gone
	}
	// Like vLLM, the sequence leaves the scheduler and frees its blocks when
	// its last token is generated, before the client hears of the end; if it
	// ends early its output blocks are not cached.
	var once sync.Once
	release := func(finished bool) { once.Do(func() { s.sched.release(t, finished) }) }
	defer release(false)

	cached := t.hits * s.cfg.BlockSize
	s.queriedTokens.Add(uint64(promptTokens))
	s.hitTokens.Add(uint64(cached))
	s.metrics.prefixQueries.Add(float64(promptTokens))
	s.metrics.prefixHits.Add(float64(cached))

	// Token i is due at first + i×ITL; scheduling against absolute times
	// keeps timer overshoot from accumulating.
	admitted := time.Now()
	prefill := s.cfg.PrefillOverhead + time.Duration(promptTokens-cached)*s.cfg.PrefillTimePerToken
	first := admitted.Add(s.cfg.scale(prefill))
	itl := s.cfg.scale(s.cfg.InterTokenLatency)
	if !sleepUntil(ctx, first) {
		return
	}
	// Queueing is measured, prefill is the model's figure: timer overshoot
	// multiplied by TimeScale would otherwise swamp short prefills.
	queued := time.Duration(float64(admitted.Sub(arrival)) * s.cfg.TimeScale)
	s.metrics.ttft.Observe((queued + prefill).Seconds())
	// Prefill is done and has produced the first token.
	s.promptTokens.Add(uint64(promptTokens))
	s.metrics.promptTokens.Add(float64(promptTokens))
	s.countGenerated(1)

	prefix := "cmpl"
	if j.chat {
		prefix = "chatcmpl"
	}
	id := fmt.Sprintf("%s-%s-%d", prefix, s.cfg.Name, s.nextID.Add(1))
	u := &usage{
		PromptTokens:        promptTokens,
		CompletionTokens:    j.maxTokens,
		TotalTokens:         promptTokens + j.maxTokens,
		PromptTokensDetails: &promptTokensDetails{CachedTokens: cached},
	}
	r := responder{w: w, tok: s.tok, id: id, model: j.model, created: arrival.Unix(), chat: j.chat}
	if j.stream {
		if !r.stream(ctx, j, first, itl, u, func() { s.countGenerated(1) }, func() { release(true) }) {
			return
		}
	} else {
		// The answer is written at once: its tokens after the first count
		// when the last is due, or those due by then if the client leaves.
		ok := sleepUntil(ctx, first.Add(time.Duration(j.maxTokens-1)*itl))
		due := j.maxTokens
		if !ok && itl > 0 {
			due = min(max(int(time.Since(first)/itl)+1, 1), j.maxTokens)
		}
		s.countGenerated(due - 1)
		if !ok {
			return
		}
		release(true)
		r.whole(j, u)
	}
	s.served.Add(1)
	s.metrics.requestSuccess.Inc()
}

// countGenerated counts n more generated tokens.
func (s *Server) countGenerated(n int) {
	s.generationTokens.Add(uint64(n))
	s.metrics.generationTokens.Add(float64(n))
}

// sleepUntil waits for t and reports false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

type usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type response struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices any    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatContent `json:"message,omitempty"`
	Delta        *chatContent `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
}

type chatContent struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// responder writes OpenAI-shaped responses for one request.
type responder struct {
	w       http.ResponseWriter
	tok     tokenizer
	id      string
	model   string
	created int64
	chat    bool
}

// finishLength is why every sequence ends: it always generates max tokens.
const finishLength = "length"

func (r responder) envelope(chunk bool, choices any, u *usage) response {
	obj := "text_completion"
	switch {
	case r.chat && chunk:
		obj = "chat.completion.chunk"
	case r.chat:
		obj = "chat.completion"
	}
	return response{ID: r.id, Object: obj, Created: r.created, Model: r.model, Choices: choices, Usage: u}
}

func (r responder) whole(j job, u *usage) {
	text, reason := outputText(r.tok, j.maxTokens), finishLength
	var choices any = []completionChoice{{Text: text, FinishReason: &reason}}
	if r.chat {
		choices = []chatChoice{{Message: &chatContent{Role: "assistant", Content: &text}, FinishReason: &reason}}
	}
	writeJSON(r.w, http.StatusOK, r.envelope(false, choices, u))
}

// stream sends one SSE event per token as it becomes due, calls due as
// each token after the first becomes due and generated once the last token
// is sent, and reports whether the client received everything.
func (r responder) stream(ctx context.Context, j job, first time.Time, itl time.Duration, u *usage, due, generated func()) bool {
	h := r.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	r.w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(r.w)
	send := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(r.w, "data: %s\n\n", b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if r.chat {
		empty := ""
		if !send(r.envelope(true, []chatChoice{{Delta: &chatContent{Role: "assistant", Content: &empty}}}, nil)) {
			return false
		}
	}
	for i := range j.maxTokens {
		if !sleepUntil(ctx, first.Add(time.Duration(i)*itl)) {
			return false
		}
		if i > 0 {
			due()
		}
		tok := r.tok.outputToken(i)
		var choices any = []completionChoice{{Text: tok}}
		if r.chat {
			choices = []chatChoice{{Delta: &chatContent{Content: &tok}}}
		}
		if !send(r.envelope(true, choices, nil)) {
			return false
		}
	}
	generated()
	reason := finishLength
	var choices any = []completionChoice{{FinishReason: &reason}}
	if r.chat {
		choices = []chatChoice{{Delta: &chatContent{}, FinishReason: &reason}}
	}
	if !send(r.envelope(true, choices, nil)) {
		return false
	}
	if j.includeUsage && !send(r.envelope(true, []struct{}{}, u)) {
		return false
	}
	if _, err := fmt.Fprint(r.w, "data: [DONE]\n\n"); err != nil {
		return false
	}
	return rc.Flush() == nil
}

type modelEntry struct {
	ID      string  `json:"id"`
	Object  string  `json:"object"`
	Created int64   `json:"created"`
	OwnedBy string  `json:"owned_by"`
	Root    string  `json:"root"`
	Parent  *string `json:"parent"`
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	now := time.Now().Unix()
	data := []modelEntry{{ID: s.cfg.Model, Object: "model", Created: now, OwnedBy: "vllm", Root: s.cfg.Model}}
	for _, a := range s.cfg.LoRAAdapters {
		data = append(data, modelEntry{ID: a, Object: "model", Created: now, OwnedBy: "vllm", Root: a, Parent: &s.cfg.Model})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// errorTypes follow the names vLLM gives its error responses.
var errorTypes = map[int]string{
	http.StatusBadRequest:      "BadRequestError",
	http.StatusUnauthorized:    "AuthenticationError",
	http.StatusForbidden:       "PermissionDeniedError",
	http.StatusNotFound:        "NotFoundError",
	http.StatusTooManyRequests: "RateLimitError",
}

func writeError(w http.ResponseWriter, code int, msg string) {
	var b errorBody
	b.Error.Message = msg
	b.Error.Code = code
	b.Error.Type = errorTypes[code]
	if b.Error.Type == "" {
		b.Error.Type = "InternalServerError"
		if code < 500 {
			b.Error.Type = "BadRequestError"
		}
	}
	writeJSON(w, code, b)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
