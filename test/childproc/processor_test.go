package childproc

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStartProcessor(t *testing.T) {
	dir := t.TempDir()
	bin := Command(t, "infergate")
	ctx := context.Background()
	p, err := StartProcessor(ctx, ProcessorConfig{Binary: bin, Command: "payload", Log: filepath.Join(dir, "payload.log"),
		Args: []string{"--drain-timeout", "1s"}})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Alive() || p.WaitErr() != nil || p.Pid() <= 0 {
		t.Fatalf("a started processor: alive %v, wait %v, pid %d", p.Alive(), p.WaitErr(), p.Pid())
	}
	if err := WaitReady(ctx, p.GRPCAddr, 5*time.Second); err != nil {
		t.Errorf("the ext_proc listener: %v", err)
	}
	if forced := p.Stop(10 * time.Second); forced || p.Alive() || p.WaitErr() != nil {
		t.Errorf("stop: forced %v, alive %v, exit %v", forced, p.Alive(), p.WaitErr())
	}

	_, err = StartProcessor(ctx, ProcessorConfig{Binary: bin, Command: "payload", Log: filepath.Join(dir, "bad.log"),
		Args: []string{"--max-streams", "-1"}, Ready: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "--max-streams: -1 is negative") {
		t.Fatalf("a processor that cannot start: %v, want its log's error", err)
	}
}
