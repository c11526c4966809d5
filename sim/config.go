package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/infergate/infergate/inference/wire"
)

// Defaults applied by Config.WithDefaults to zero-valued fields.
//
// The cache and scheduler defaults are those of one vLLM pod serving
// Qwen3-0.6B in a public measurement that the simulator is calibrated
// against (sim/calibration_test.go replays it): a KV cache of 163,472
// tokens in blocks of 16, which is 10,217 blocks (at about 112 KiB of KV per
// token for that model, some 17.5 GiB: a 24 GB-class GPU), and a
// max_num_seqs of 256, vLLM's default on such a GPU. With the caching rules of prefixCache (every full
// block of prompt and output is cached, blocks are evicted least recently
// freed first, the end of a sequence before its beginning) the sim then
// lands where vLLM did: 128 distinct 2,048-token prefixes, 8 requests each
// with a unique 128-token suffix and 128 output tokens, 32 at a time, hit
// 44.4% of prompt tokens in vLLM and about 44% in the sim; 64 prefixes, 8
// requests each, 77.6% in vLLM and about 78% in the sim.
//
// DefaultMaxNumSeqs is high on purpose. With 32
// concurrent clients vLLM runs all 32 at once and reports an empty waiting
// queue; a limit of a few sequences would queue most of them, inflate the
// time to first token by whole request times and show load-aware routers a
// waiting queue that vLLM does not have. Queueing instead sets in, as in
// vLLM, when the KV cache cannot hold another sequence (see scheduler).
const (
	DefaultName            = "sim"
	DefaultModel           = "meta-llama/Llama-3.1-8B-Instruct"
	DefaultMaxLoRAs        = 1
	DefaultMaxNumSeqs      = 256
	DefaultMaxWaitingQueue = 1000
	DefaultMaxTokens       = 16
	DefaultKVCacheTokens   = 163472
	DefaultBlockSize       = 16
	DefaultTimeScale       = 1.0
	DefaultTokenizer       = TokenizerBytes
	DefaultBytesPerToken   = wire.DefaultBytesPerToken
)

// Tokenizers the simulator offers (Config.Tokenizer).
const (
	// TokenizerBytes makes every BytesPerToken bytes of text one token.
	TokenizerBytes = "bytes"
	// TokenizerWords makes a run of white space and the word after it one
	// token, a word longer than 8 bytes one token per 8 bytes: about 5
	// bytes a token on English prose, 5.7 on words of 2 to 9 letters.
	TokenizerWords = "words"
)

// Bounds of Config.BytesPerToken: real tokenizers range from about 2 bytes
// a token (code, CJK, numbers) to 6 or more (long English words).
const (
	MinBytesPerToken = 2
	MaxBytesPerToken = 8
)

// Latency defaults for a small model (Qwen3-0.6B) on one GPU. They are not
// applied by WithDefaults, where zero latency stays zero so that tests can
// ask for an instant server; the sim command uses them for its flags.
//
// Prefill of 2,176 uncached tokens takes 5 ms + 2,176 × 15 µs ≈ 38 ms, of a
// fully cached 2,048-token prefix with a 128-token suffix about 7 ms: some
// 65k prompt tokens a second, plausible for a 0.6B model on a mid-range
// GPU. Each further token takes 8 ms, a decode step at a moderate batch; the
// sim keeps it constant where vLLM's steps slow down as the batch and its
// contexts grow, so at 32 sequences of 2k tokens on a 24 GB card the real
// figure is rather higher.
const (
	DefaultPrefillOverhead     = 5 * time.Millisecond
	DefaultPrefillTimePerToken = 15 * time.Microsecond
	DefaultInterTokenLatency   = 8 * time.Millisecond
)

// Config describes one simulated model server. Zero values mean "use the
// default", except for the latency knobs, where zero means "no latency" so
// that tests can ask for an instant server.
type Config struct {
	// Name identifies the server in the x-inference-pod header.
	Name string
	// Model is the base model name served and used as the model_name label.
	Model string
	// LoRAAdapters are served in addition to Model.
	LoRAAdapters []string
	// MaxLoRAs is how many distinct adapters may have running requests at
	// once; requests for another adapter wait.
	MaxLoRAs int
	// MaxNumSeqs is how many requests run concurrently; the rest wait in FIFO
	// order. Requests also wait while the KV cache cannot hold their blocks.
	MaxNumSeqs int
	// MaxWaitingQueue bounds the waiting requests; beyond it requests get 429.
	MaxWaitingQueue int

	// Time to first token is PrefillOverhead + uncached prompt tokens ×
	// PrefillTimePerToken; each further token takes InterTokenLatency. Zero
	// means no latency; DefaultPrefillOverhead and its siblings are
	// realistic values.
	PrefillOverhead     time.Duration
	PrefillTimePerToken time.Duration
	InterTokenLatency   time.Duration
	// TimeScale divides every simulated duration: 100 runs 100× faster than
	// real time. Reported latencies (the TTFT histogram) stay in simulated
	// time so that scrapers see realistic values.
	TimeScale float64

	// DefaultMaxTokens is the output length of requests that do not set
	// max_tokens or max_completion_tokens.
	DefaultMaxTokens int
	// KVCacheTokens is the KV cache capacity; it holds KVCacheTokens/BlockSize
	// blocks.
	KVCacheTokens int
	// BlockSize is the number of tokens per KV cache block.
	BlockSize int

	// Tokenizer is how the server cuts text into tokens: TokenizerBytes
	// (the default) or TokenizerWords. Prompt token counts (queueing,
	// prefill time, usage, metrics) and the prefix cache's blocks follow
	// it, and generated text is one token of it per generated token.
	Tokenizer string
	// BytesPerToken is the token size of TokenizerBytes, from 2 to 8
	// (default 4, the figure the defaults above are calibrated with). Only
	// the default is accepted with TokenizerWords.
	BytesPerToken int

	// Echo, when set, replaces the inference API with the echo server the
	// upstream conformance suite expects (see Echo); metrics stay.
	Echo *Echo
}

// WithDefaults returns a copy of c with zero-valued fields set to defaults.
func (c Config) WithDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.MaxLoRAs == 0 {
		c.MaxLoRAs = DefaultMaxLoRAs
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if c.MaxWaitingQueue == 0 {
		c.MaxWaitingQueue = DefaultMaxWaitingQueue
	}
	if c.TimeScale == 0 {
		c.TimeScale = DefaultTimeScale
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = DefaultMaxTokens
	}
	if c.KVCacheTokens == 0 {
		c.KVCacheTokens = DefaultKVCacheTokens
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.Tokenizer == "" {
		c.Tokenizer = DefaultTokenizer
	}
	if c.BytesPerToken == 0 {
		c.BytesPerToken = DefaultBytesPerToken
	}
	c.LoRAAdapters = append([]string(nil), c.LoRAAdapters...)
	return c
}

// Validate reports the problems of c once defaults are applied, one per
// offending field.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	seen := map[string]bool{c.Model: true}
	for _, a := range c.LoRAAdapters {
		switch {
		case a == "":
			bad("LoRAAdapters", "adapter names must not be empty")
		case seen[a]:
			bad("LoRAAdapters", "%q is listed twice or equals the base model", a)
		}
		seen[a] = true
	}
	if c.MaxLoRAs < 0 {
		bad("MaxLoRAs", "must be positive, got %d", c.MaxLoRAs)
	}
	if c.MaxNumSeqs < 0 {
		bad("MaxNumSeqs", "must be positive, got %d", c.MaxNumSeqs)
	}
	if c.MaxWaitingQueue < 0 {
		bad("MaxWaitingQueue", "must be positive, got %d", c.MaxWaitingQueue)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"PrefillOverhead", c.PrefillOverhead},
		{"PrefillTimePerToken", c.PrefillTimePerToken},
		{"InterTokenLatency", c.InterTokenLatency},
	} {
		if d.v < 0 {
			bad(d.field, "must not be negative, got %s", d.v)
		}
	}
	if !(c.TimeScale > 0) { // also rejects NaN
		bad("TimeScale", "must be greater than 0, got %g", c.TimeScale)
	}
	if c.DefaultMaxTokens < 0 {
		bad("DefaultMaxTokens", "must be positive, got %d", c.DefaultMaxTokens)
	}
	if c.BlockSize < 0 {
		bad("BlockSize", "must be positive, got %d", c.BlockSize)
	}
	if c.KVCacheTokens < 0 {
		bad("KVCacheTokens", "must be positive, got %d", c.KVCacheTokens)
	} else if c.BlockSize > 0 && c.KVCacheTokens < c.BlockSize {
		bad("KVCacheTokens", "must hold at least one block of %d tokens, got %d", c.BlockSize, c.KVCacheTokens)
	}
	switch c.Tokenizer {
	case TokenizerBytes:
		if c.BytesPerToken < MinBytesPerToken || c.BytesPerToken > MaxBytesPerToken {
			bad("BytesPerToken", "must be within %d..%d, got %d", MinBytesPerToken, MaxBytesPerToken, c.BytesPerToken)
		}
	case TokenizerWords:
		if c.BytesPerToken != DefaultBytesPerToken {
			bad("BytesPerToken", "applies to Tokenizer %q only, got %d with %q", TokenizerBytes, c.BytesPerToken, TokenizerWords)
		}
	default:
		bad("Tokenizer", "must be %q or %q, got %q", TokenizerBytes, TokenizerWords, c.Tokenizer)
	}
	return errors.Join(errs...)
}

// scale turns a simulated duration into wall-clock time.
func (c Config) scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.TimeScale)
}
