package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestDemoRunsToTheEnd builds the binaries and runs a shortened demo, so
// `make demo` cannot rot unnoticed.
func TestDemoRunsToTheEnd(t *testing.T) {
	dir := t.TempDir()
	bin, standIn := filepath.Join(dir, "infergate"), filepath.Join(dir, "envoysim")
	build := exec.Command("go", "build", "-o", dir, "github.com/infergate/infergate/cmd/infergate", "github.com/infergate/infergate/cmd/envoysim")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, bin, standIn, 60, 8); err != nil {
		t.Fatal(err)
	}
}
