package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/infergate/infergate/test/childproc"
)

// TestDemoRunsToTheEnd builds the binaries and runs a shortened demo, so
// `make demo` cannot rot unnoticed.
func TestDemoRunsToTheEnd(t *testing.T) {
	dir := t.TempDir()
	bin, standIn := filepath.Join(dir, "infergate"), filepath.Join(dir, "envoysim")
	if err := childproc.Build(t.Context(), dir, "infergate", "envoysim"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, bin, standIn, 60, 8); err != nil {
		t.Fatal(err)
	}
}
