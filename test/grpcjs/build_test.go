package grpcjs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// buildInfergate builds cmd/infergate into dir, without -race even when
// the test runs with it: the children are the subject, not the test's own
// goroutines, and a race build would only slow them down.
func buildInfergate(ctx context.Context, dir string) (string, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "infergate")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/infergate")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/infergate: %w\n%s", err, out)
	}
	return bin, nil
}

// moduleRoot is the folder of this repository's go.mod (test/controlplane
// has the same, but importing it would link the API server's client
// libraries into this small test).
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("go env GOMOD: not inside the module")
	}
	return filepath.Dir(mod), nil
}
