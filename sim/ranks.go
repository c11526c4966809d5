package sim

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
)

// Run serves o.DataParallelSize ranks (and the h2c port) until ctx ends
// or one of them fails, which stops the others.
func Run(ctx context.Context, o Options, log *slog.Logger) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.Name == "" {
		o.Name = os.Getenv("POD_NAME") // a Pod's name, as the downward API gives it
	}
	if o.Name == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = DefaultName
		}
		o.Name = host
	}

	// Build and bind everything first so a bad adapter list or a busy port
	// fails the command before any server starts.
	servers := make([]*Server, o.DataParallelSize)
	listeners := make([]net.Listener, 0, o.DataParallelSize)
	closeAll := func() {
		for _, ln := range listeners {
			_ = ln.Close()
		}
	}
	for i := range servers {
		s, err := New(o.Config(i))
		if err != nil {
			closeAll()
			return err
		}
		port := 0
		if o.Port != 0 {
			port = o.Port + i
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(o.Address, strconv.Itoa(port)))
		if err != nil {
			closeAll()
			return fmt.Errorf("--address/--port: %w", err)
		}
		servers[i], listeners = s, append(listeners, ln)
	}
	if o.H2CPort != 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort(o.Address, strconv.Itoa(o.H2CPort)))
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

// tokenizerName is how the log shows the tokenizer: bytes/4, words.
func tokenizerName(cfg Config) string {
	if cfg.Tokenizer == TokenizerBytes {
		return fmt.Sprintf("%s/%d", cfg.Tokenizer, cfg.BytesPerToken)
	}
	return cfg.Tokenizer
}
