package sim

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Options are the simulator command's options: one server, or
// DataParallelSize ranks on consecutive ports.
type Options struct {
	Address             string
	Port                int
	DataParallelSize    int
	Name                string
	Model               string
	LoRAAdapters        string
	MaxLoRAs            int
	MaxNumSeqs          int
	MaxWaitingQueue     int
	PrefillOverhead     time.Duration
	PrefillTimePerToken time.Duration
	InterTokenLatency   time.Duration
	TimeScale           float64
	KVCacheTokens       int
	BlockSize           int
	Tokenizer           string
	BytesPerToken       int
	Echo                bool
	EchoNamespace       string
	H2CPort             int
}

// AddFlags binds the options to f with their defaults.
func (o *Options) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.Address, "address", "127.0.0.1", "address to listen on")
	f.IntVar(&o.Port, "port", 8000, "port of the first server; rank i listens on port+i (0 picks free ports)")
	f.IntVar(&o.DataParallelSize, "data-parallel-size", 1, "number of servers, each on its own port")
	f.StringVar(&o.Name, "name", "", "server name sent in x-inference-pod; ranks get -rank<i> appended (default: host name)")
	f.StringVar(&o.Model, "model", DefaultModel, "base model name")
	f.StringVar(&o.LoRAAdapters, "lora-adapters", "", "comma-separated LoRA adapter names served besides the base model")
	f.IntVar(&o.MaxLoRAs, "max-loras", DefaultMaxLoRAs, "adapters that may run at once")
	f.IntVar(&o.MaxNumSeqs, "max-num-seqs", DefaultMaxNumSeqs, "requests that run at once; the rest wait, as they do while the KV cache is full")
	f.IntVar(&o.MaxWaitingQueue, "max-waiting-queue", DefaultMaxWaitingQueue, "waiting requests beyond which requests get 429")
	f.DurationVar(&o.PrefillOverhead, "prefill-overhead", DefaultPrefillOverhead, "fixed part of the time to first token")
	f.DurationVar(&o.PrefillTimePerToken, "prefill-time-per-token", DefaultPrefillTimePerToken, "time to first token per uncached prompt token")
	f.DurationVar(&o.InterTokenLatency, "inter-token-latency", DefaultInterTokenLatency, "time per output token after the first")
	f.Float64Var(&o.TimeScale, "time-scale", DefaultTimeScale, "speed-up of simulated time: 100 runs 100x faster")
	f.IntVar(&o.KVCacheTokens, "kv-cache-tokens", DefaultKVCacheTokens, "KV cache capacity in tokens")
	f.IntVar(&o.BlockSize, "block-size", DefaultBlockSize, "tokens per KV cache block")
	f.StringVar(&o.Tokenizer, "tokenizer", DefaultTokenizer, "tokenizer of token counts, usage, metrics and KV blocks: bytes (a token every --bytes-per-token bytes) or words (white space and a word, long words cut every 8 bytes: about 5-6 bytes a token on English)")
	f.IntVar(&o.BytesPerToken, "bytes-per-token", DefaultBytesPerToken, "token size of --tokenizer bytes, 2 to 8; real tokenizers make about 2 (code, CJK, numbers) to 6 (long English words)")
	f.BoolVar(&o.Echo, "echo", false, "answer every request as Gateway API's echo-basic does (a JSON echo of the request, X-Echo-Set-Header honoured), the model server the upstream InferencePool conformance suite expects; the pod is --name (or $POD_NAME)")
	f.IntVar(&o.H2CPort, "h2c-port", 0, "also serve the first server on this port, for clients that speak HTTP/2 without TLS (h2c) as a pool with appProtocol kubernetes.io/h2c asks; every port serves h2c and HTTP/1.1 alike (echo-basic's H2C_PORT). 0: none")
	f.StringVar(&o.EchoNamespace, "echo-namespace", os.Getenv("NAMESPACE"), "namespace --echo reports (default $NAMESPACE, as echo-basic reads it)")
}

// Validate rejects flag values before they reach Config, whose zero values
// would silently mean "default"; each error names the flag.
func (o Options) Validate() error {
	var errs []error
	atLeast := func(flag string, v, lo int) {
		if v < lo {
			errs = append(errs, fmt.Errorf("--%s must be at least %d, got %d", flag, lo, v))
		}
	}
	atLeast("data-parallel-size", o.DataParallelSize, 1)
	atLeast("max-loras", o.MaxLoRAs, 1)
	atLeast("max-num-seqs", o.MaxNumSeqs, 1)
	atLeast("max-waiting-queue", o.MaxWaitingQueue, 1)
	atLeast("kv-cache-tokens", o.KVCacheTokens, 1)
	atLeast("block-size", o.BlockSize, 1)
	if o.Port < 0 || o.Port > 65535 {
		errs = append(errs, fmt.Errorf("--port must be within 0..65535, got %d", o.Port))
	} else if o.Port > 0 && o.Port+o.DataParallelSize-1 > 65535 {
		errs = append(errs, fmt.Errorf("--port %d with --data-parallel-size %d runs past port 65535", o.Port, o.DataParallelSize))
	}
	for flag, d := range map[string]time.Duration{
		"prefill-overhead":       o.PrefillOverhead,
		"prefill-time-per-token": o.PrefillTimePerToken,
		"inter-token-latency":    o.InterTokenLatency,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("--%s must not be negative, got %s", flag, d))
		}
	}
	if o.H2CPort < 0 || o.H2CPort > 65535 {
		errs = append(errs, fmt.Errorf("--h2c-port must be within 0..65535, got %d", o.H2CPort))
	}
	if !(o.TimeScale > 0) {
		errs = append(errs, fmt.Errorf("--time-scale must be greater than 0, got %g", o.TimeScale))
	}
	seen := map[string]bool{o.Model: true}
	for _, a := range o.adapters() {
		if seen[a] {
			errs = append(errs, fmt.Errorf("--lora-adapters: %q is listed twice or equals --model", a))
		}
		seen[a] = true
	}
	switch o.Tokenizer {
	case TokenizerBytes:
		if o.BytesPerToken < MinBytesPerToken || o.BytesPerToken > MaxBytesPerToken {
			errs = append(errs, fmt.Errorf("--bytes-per-token must be within %d..%d, got %d", MinBytesPerToken, MaxBytesPerToken, o.BytesPerToken))
		}
	case TokenizerWords:
		if o.BytesPerToken != DefaultBytesPerToken {
			errs = append(errs, fmt.Errorf("--bytes-per-token applies to --tokenizer %s only, got %d with --tokenizer %s", TokenizerBytes, o.BytesPerToken, TokenizerWords))
		}
	default:
		errs = append(errs, fmt.Errorf("--tokenizer must be %s or %s, got %q", TokenizerBytes, TokenizerWords, o.Tokenizer))
	}
	if o.BlockSize > 0 && o.KVCacheTokens < o.BlockSize {
		errs = append(errs, fmt.Errorf("--kv-cache-tokens (%d) must hold at least one block of --block-size (%d)", o.KVCacheTokens, o.BlockSize))
	}
	return errors.Join(errs...)
}

// Config is the configuration of rank rank.
func (o Options) Config(rank int) Config {
	name := o.Name
	if o.DataParallelSize > 1 {
		name = fmt.Sprintf("%s-rank%d", name, rank)
	}
	return Config{
		Name:                name,
		Model:               o.Model,
		LoRAAdapters:        o.adapters(),
		MaxLoRAs:            o.MaxLoRAs,
		MaxNumSeqs:          o.MaxNumSeqs,
		MaxWaitingQueue:     o.MaxWaitingQueue,
		PrefillOverhead:     o.PrefillOverhead,
		PrefillTimePerToken: o.PrefillTimePerToken,
		InterTokenLatency:   o.InterTokenLatency,
		TimeScale:           o.TimeScale,
		KVCacheTokens:       o.KVCacheTokens,
		BlockSize:           o.BlockSize,
		Tokenizer:           o.Tokenizer,
		BytesPerToken:       o.BytesPerToken,
		Echo:                o.echoConfig(name),
	}
}

// echoConfig is the echo mode's identity, nil without --echo. The pod is
// the server's name, else $POD_NAME as echo-basic reads it.
func (o Options) echoConfig(name string) *Echo {
	if !o.Echo {
		return nil
	}
	pod := name
	if o.Name == "" && os.Getenv("POD_NAME") != "" {
		pod = os.Getenv("POD_NAME")
	}
	return &Echo{Namespace: o.EchoNamespace, Pod: pod, Ingress: os.Getenv("INGRESS_NAME"), Service: os.Getenv("SERVICE_NAME")}
}

func (o Options) adapters() []string {
	var adapters []string
	for a := range strings.SplitSeq(o.LoRAAdapters, ",") {
		if a = strings.TrimSpace(a); a != "" {
			adapters = append(adapters, a)
		}
	}
	return adapters
}
