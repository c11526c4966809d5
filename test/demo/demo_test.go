package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestDemoRunsToTheEnd builds the binary and runs a shortened demo, so
// `make demo` cannot rot unnoticed.
func TestDemoRunsToTheEnd(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "infergate")
	build := exec.Command("go", "build", "-o", bin, "github.com/infergate/infergate/cmd/infergate")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, bin, 60, 8); err != nil {
		t.Fatal(err)
	}
}
