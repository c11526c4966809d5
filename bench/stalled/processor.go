package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/test/childproc"
)

// emailConfig is the policy the shapes run under unless they name one:
// e-mail addresses masked.
const emailConfig = "pii:\n- {name: email, detector: email, action: mask}\n"

// noTextConfig is a policy that reads no text: model headers only.
const noTextConfig = "{}\n"

// startProcessor runs the payload processor (childproc.StartProcessor:
// plain text, loopback, free ports) on transport (grpc or h2) with the
// charts' memory limit, from which the processor derives its buffer
// budget and Go soft limit as from a container's, policy as its
// configuration (YAML) and the extra flags. Its log and configuration go
// in dir.
func startProcessor(ctx context.Context, binary, transport, dir, policy string, extra []string) (*childproc.Processor, error) {
	cfg := filepath.Join(dir, "payload.yaml")
	if err := os.WriteFile(cfg, []byte(policy), 0o600); err != nil {
		return nil, err
	}
	return childproc.StartProcessor(ctx, childproc.ProcessorConfig{
		Binary: binary, Command: "payload", Log: filepath.Join(dir, "payload-"+transport+".log"),
		// As the charts' resources.limits.memory writes it.
		Args: append([]string{"--config-file", cfg, "--memory-limit", fmt.Sprintf("%dMi", chartMemoryLimit>>20), "--extproc-transport", transport}, extra...),
		// The processor sets its soft memory limit from --memory-limit
		// unless GOMEMLIMIT is set.
		Env: slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOMEMLIMIT=") }),
	})
}

// sampleRSS records the child's peak RSS every 20 ms until stopped.
func sampleRSS(pid int, peak *atomic.Int64) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, err := childproc.RSS(pid); err == nil && rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-finished }) }
}
