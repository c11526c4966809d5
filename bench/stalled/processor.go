package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/test/childproc"
)

// processor is one `infergate payload` child with the charts' memory
// settings.
type processor struct {
	addr string
	pid  int
	stop func()
}

// startProcessor runs the payload processor on transport (grpc or h2),
// plain text on loopback, with the charts' memory limit: the processor
// derives its buffer budget and its Go soft limit from it, as it does
// from a container's.
func startProcessor(ctx context.Context, binary, transport string) (*processor, error) {
	dir, err := os.MkdirTemp("", "stalled")
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "payload.yaml")
	if err := os.WriteFile(cfg, []byte("pii:\n- {name: email, detector: email, action: mask}\n"), 0o600); err != nil {
		return nil, err
	}
	grpcAddr, err := childproc.FreeAddr()
	if err != nil {
		return nil, err
	}
	healthAddr, err := childproc.FreeAddr()
	if err != nil {
		return nil, err
	}
	_, gport, _ := net.SplitHostPort(grpcAddr)
	_, hport, _ := net.SplitHostPort(healthAddr)
	cmd := exec.CommandContext(ctx, binary, "payload", "--config-file", cfg, "--secure-serving=false",
		"--grpc-bind-address", "127.0.0.1", "--grpc-port", gport,
		"--grpc-health-bind-address", "127.0.0.1", "--grpc-health-port", hport, "--metrics-port", "0",
		"--memory-limit", fmt.Sprint(chartMemoryLimit), "--extproc-transport", transport)
	cmd.Stderr = os.Stderr
	// The processor sets its soft memory limit from --memory-limit, as
	// from a container's, unless GOMEMLIMIT is set.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOMEMLIMIT=") })
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w (run make build first)", binary, err)
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second): // held streams may outlast a drain
			_ = cmd.Process.Kill()
			<-done
		}
		_ = os.RemoveAll(dir)
	}
	if err := childproc.WaitReady(ctx, healthAddr, 20*time.Second); err != nil {
		stop()
		return nil, err
	}
	return &processor{addr: grpcAddr, pid: cmd.Process.Pid, stop: stop}, nil
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
