package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/infergate/infergate/sim"
)

// simOptions are the sim subcommand's flags.
type simOptions struct {
	address             string
	port                int
	dataParallelSize    int
	name                string
	model               string
	loraAdapters        string
	maxLoRAs            int
	maxNumSeqs          int
	maxWaitingQueue     int
	prefillOverhead     time.Duration
	prefillTimePerToken time.Duration
	interTokenLatency   time.Duration
	timeScale           float64
	kvCacheTokens       int
	blockSize           int
	tokenizer           string
	bytesPerToken       int
	echo                bool
	echoNamespace       string
	h2cPort             int
}

func newSimCommand() *cobra.Command {
	o := simOptions{}
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run a simulated vLLM model server",
		Long: `Run one or more simulated vLLM model servers that speak the OpenAI
completion and chat APIs, queue requests, keep a prefix cache and export
vLLM's Prometheus metrics, for tests, benchmarks and demos without GPUs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSim(cmd.Context(), o)
		},
	}
	o.register(cmd.Flags())
	return cmd
}

// register declares the flags that set o.
func (o *simOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.address, "address", "127.0.0.1", "address to listen on")
	f.IntVar(&o.port, "port", 8000, "port of the first server; rank i listens on port+i (0 picks free ports)")
	f.IntVar(&o.dataParallelSize, "data-parallel-size", 1, "number of servers, each on its own port")
	f.StringVar(&o.name, "name", "", "server name sent in x-inference-pod; ranks get -rank<i> appended (default: host name)")
	f.StringVar(&o.model, "model", sim.DefaultModel, "base model name")
	f.StringVar(&o.loraAdapters, "lora-adapters", "", "comma-separated LoRA adapter names served besides the base model")
	f.IntVar(&o.maxLoRAs, "max-loras", sim.DefaultMaxLoRAs, "adapters that may run at once")
	f.IntVar(&o.maxNumSeqs, "max-num-seqs", sim.DefaultMaxNumSeqs, "requests that run at once; the rest wait, as they do while the KV cache is full")
	f.IntVar(&o.maxWaitingQueue, "max-waiting-queue", sim.DefaultMaxWaitingQueue, "waiting requests beyond which requests get 429")
	f.DurationVar(&o.prefillOverhead, "prefill-overhead", sim.DefaultPrefillOverhead, "fixed part of the time to first token")
	f.DurationVar(&o.prefillTimePerToken, "prefill-time-per-token", sim.DefaultPrefillTimePerToken, "time to first token per uncached prompt token")
	f.DurationVar(&o.interTokenLatency, "inter-token-latency", sim.DefaultInterTokenLatency, "time per output token after the first")
	f.Float64Var(&o.timeScale, "time-scale", sim.DefaultTimeScale, "speed-up of simulated time: 100 runs 100x faster")
	f.IntVar(&o.kvCacheTokens, "kv-cache-tokens", sim.DefaultKVCacheTokens, "KV cache capacity in tokens")
	f.IntVar(&o.blockSize, "block-size", sim.DefaultBlockSize, "tokens per KV cache block")
	f.StringVar(&o.tokenizer, "tokenizer", sim.DefaultTokenizer, "tokenizer of token counts, usage, metrics and KV blocks: bytes (a token every --bytes-per-token bytes) or words (white space and a word, long words cut every 8 bytes: about 5-6 bytes a token on English)")
	f.IntVar(&o.bytesPerToken, "bytes-per-token", sim.DefaultBytesPerToken, "token size of --tokenizer bytes, 2 to 8; real tokenizers make about 2 (code, CJK, numbers) to 6 (long English words)")
	f.BoolVar(&o.echo, "echo", false, "answer every request as Gateway API's echo-basic does (a JSON echo of the request, X-Echo-Set-Header honoured), the model server the upstream InferencePool conformance suite expects; the pod is --name (or $POD_NAME)")
	f.IntVar(&o.h2cPort, "h2c-port", 0, "also serve the first server on this port, for clients that speak HTTP/2 without TLS (h2c) as a pool with appProtocol kubernetes.io/h2c asks; every port serves h2c and HTTP/1.1 alike (echo-basic's H2C_PORT). 0: none")
	f.StringVar(&o.echoNamespace, "echo-namespace", os.Getenv("NAMESPACE"), "namespace --echo reports (default $NAMESPACE, as echo-basic reads it)")
}

// check rejects flag values before they reach sim.Config, whose zero values
// would silently mean "default".
func (o simOptions) check() error {
	var errs []error
	atLeast := func(flag string, v, lo int) {
		if v < lo {
			errs = append(errs, fmt.Errorf("--%s must be at least %d, got %d", flag, lo, v))
		}
	}
	atLeast("data-parallel-size", o.dataParallelSize, 1)
	atLeast("max-loras", o.maxLoRAs, 1)
	atLeast("max-num-seqs", o.maxNumSeqs, 1)
	atLeast("max-waiting-queue", o.maxWaitingQueue, 1)
	atLeast("kv-cache-tokens", o.kvCacheTokens, 1)
	atLeast("block-size", o.blockSize, 1)
	if o.port < 0 || o.port > 65535 {
		errs = append(errs, fmt.Errorf("--port must be within 0..65535, got %d", o.port))
	} else if o.port > 0 && o.port+o.dataParallelSize-1 > 65535 {
		errs = append(errs, fmt.Errorf("--port %d with --data-parallel-size %d runs past port 65535", o.port, o.dataParallelSize))
	}
	for flag, d := range map[string]time.Duration{
		"prefill-overhead":       o.prefillOverhead,
		"prefill-time-per-token": o.prefillTimePerToken,
		"inter-token-latency":    o.interTokenLatency,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("--%s must not be negative, got %s", flag, d))
		}
	}
	if o.h2cPort < 0 || o.h2cPort > 65535 {
		errs = append(errs, fmt.Errorf("--h2c-port must be within 0..65535, got %d", o.h2cPort))
	}
	if !(o.timeScale > 0) {
		errs = append(errs, fmt.Errorf("--time-scale must be greater than 0, got %g", o.timeScale))
	}
	seen := map[string]bool{o.model: true}
	for _, a := range o.adapters() {
		if seen[a] {
			errs = append(errs, fmt.Errorf("--lora-adapters: %q is listed twice or equals --model", a))
		}
		seen[a] = true
	}
	switch o.tokenizer {
	case sim.TokenizerBytes:
		if o.bytesPerToken < sim.MinBytesPerToken || o.bytesPerToken > sim.MaxBytesPerToken {
			errs = append(errs, fmt.Errorf("--bytes-per-token must be within %d..%d, got %d", sim.MinBytesPerToken, sim.MaxBytesPerToken, o.bytesPerToken))
		}
	case sim.TokenizerWords:
		if o.bytesPerToken != sim.DefaultBytesPerToken {
			errs = append(errs, fmt.Errorf("--bytes-per-token applies to --tokenizer %s only, got %d with --tokenizer %s", sim.TokenizerBytes, o.bytesPerToken, sim.TokenizerWords))
		}
	default:
		errs = append(errs, fmt.Errorf("--tokenizer must be %s or %s, got %q", sim.TokenizerBytes, sim.TokenizerWords, o.tokenizer))
	}
	if o.blockSize > 0 && o.kvCacheTokens < o.blockSize {
		errs = append(errs, fmt.Errorf("--kv-cache-tokens (%d) must hold at least one block of --block-size (%d)", o.kvCacheTokens, o.blockSize))
	}
	return errors.Join(errs...)
}

func (o simOptions) config(rank int) sim.Config {
	name := o.name
	if o.dataParallelSize > 1 {
		name = fmt.Sprintf("%s-rank%d", name, rank)
	}
	return sim.Config{
		Name:                name,
		Model:               o.model,
		LoRAAdapters:        o.adapters(),
		MaxLoRAs:            o.maxLoRAs,
		MaxNumSeqs:          o.maxNumSeqs,
		MaxWaitingQueue:     o.maxWaitingQueue,
		PrefillOverhead:     o.prefillOverhead,
		PrefillTimePerToken: o.prefillTimePerToken,
		InterTokenLatency:   o.interTokenLatency,
		TimeScale:           o.timeScale,
		KVCacheTokens:       o.kvCacheTokens,
		BlockSize:           o.blockSize,
		Tokenizer:           o.tokenizer,
		BytesPerToken:       o.bytesPerToken,
		Echo:                o.echoConfig(name),
	}
}

// echoConfig is the echo mode's identity, nil without --echo. The pod is
// the server's name, else $POD_NAME as echo-basic reads it.
func (o simOptions) echoConfig(name string) *sim.Echo {
	if !o.echo {
		return nil
	}
	pod := name
	if o.name == "" && os.Getenv("POD_NAME") != "" {
		pod = os.Getenv("POD_NAME")
	}
	return &sim.Echo{Namespace: o.echoNamespace, Pod: pod, Ingress: os.Getenv("INGRESS_NAME"), Service: os.Getenv("SERVICE_NAME")}
}

// tokenizerName is how the log shows the tokenizer: bytes/4, words.
func tokenizerName(cfg sim.Config) string {
	if cfg.Tokenizer == sim.TokenizerBytes {
		return fmt.Sprintf("%s/%d", cfg.Tokenizer, cfg.BytesPerToken)
	}
	return cfg.Tokenizer
}

func (o simOptions) adapters() []string {
	var adapters []string
	for a := range strings.SplitSeq(o.loraAdapters, ",") {
		if a = strings.TrimSpace(a); a != "" {
			adapters = append(adapters, a)
		}
	}
	return adapters
}

func runSim(ctx context.Context, o simOptions) error {
	if err := o.check(); err != nil {
		return err
	}
	if o.name == "" {
		o.name = os.Getenv("POD_NAME") // a Pod's name, as the downward API gives it
	}
	if o.name == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = sim.DefaultName
		}
		o.name = host
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	// Build and bind everything first so a bad adapter list or a busy port
	// fails the command before any server starts.
	servers := make([]*sim.Server, o.dataParallelSize)
	listeners := make([]net.Listener, 0, o.dataParallelSize)
	closeAll := func() {
		for _, ln := range listeners {
			_ = ln.Close()
		}
	}
	for i := range servers {
		s, err := sim.New(o.config(i))
		if err != nil {
			closeAll()
			return err
		}
		port := 0
		if o.port != 0 {
			port = o.port + i
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(o.address, strconv.Itoa(port)))
		if err != nil {
			closeAll()
			return fmt.Errorf("--address/--port: %w", err)
		}
		servers[i], listeners = s, append(listeners, ln)
	}
	if o.h2cPort != 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort(o.address, strconv.Itoa(o.h2cPort)))
		if err != nil {
			closeAll()
			return fmt.Errorf("--address/--h2c-port: %w", err)
		}
		servers, listeners = append(servers, servers[0]), append(listeners, ln)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(servers))
	for i, s := range servers {
		cfg := s.Config()
		log.Info("sim server listening", "name", cfg.Name, "address", listeners[i].Addr().String(),
			"model", cfg.Model, "lora_adapters", strings.Join(cfg.LoRAAdapters, ","),
			"max_num_seqs", cfg.MaxNumSeqs, "time_scale", cfg.TimeScale, "tokenizer", tokenizerName(cfg))
		wg.Go(func() {
			if errs[i] = s.Serve(ctx, listeners[i]); errs[i] != nil {
				cancel() // one rank failing takes the others down
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	log.Info("sim servers stopped")
	return nil
}
