package wasmtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Build compiles the Go package at pkgDir into a proxy-wasm plugin at outPath with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -ldflags='-s -w'
//
// A relative pkgDir is taken relative to the root of the module containing the working directory
// (so "./wasm/payload" works from a test in any package); an absolute one is built in place.
// The go command's output is part of the error.
func Build(ctx context.Context, pkgDir, outPath string) error {
	out, err := filepath.Abs(outPath)
	if err != nil {
		return fmt.Errorf("wasmtest: build output %s: %w", outPath, err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("wasmtest: build output dir: %w", err)
	}
	dir, target := pkgDir, "."
	if !filepath.IsAbs(pkgDir) {
		if dir, err = moduleRoot(ctx); err != nil {
			return err
		}
		target = "./" + filepath.ToSlash(filepath.Clean(pkgDir))
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s -w", "-o", out, target)
	cmd.Dir = dir
	// CGO_ENABLED=0 because cgo does not exist for wasip1 and an inherited 1 would fail the build.
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if output, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("wasmtest: go build %s (in %s): %w\n%s", target, dir, err, output)
	}
	return nil
}

func moduleRoot(ctx context.Context) (string, error) {
	output, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("wasmtest: go env GOMOD: %w", err)
	}
	gomod := string(bytes.TrimSpace(output))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("wasmtest: not inside a Go module, give an absolute package directory")
	}
	return filepath.Dir(strings.TrimSpace(gomod)), nil
}
