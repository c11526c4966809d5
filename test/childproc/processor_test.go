package childproc

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStartProcessor(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "infergate")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/infergate/infergate/cmd/infergate").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
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
