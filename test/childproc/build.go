package childproc

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
)

// Build builds the module's commands cmd/<name> (infergate,
// infergate-conformance, envoysim) into dir, each named as its folder.
// They are built without -race even when the caller runs with it: the
// children are production builds under test, and Go's build cache makes
// a second build a link.
func Build(ctx context.Context, dir string, names ...string) error {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, "github.com/infergate/infergate/cmd/"+n)
	}
	if out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("go build %v: %w\n%s", names, err, out)
	}
	return nil
}

// Command builds cmd/<name> into the test's temporary folder and returns
// its path.
func Command(t testing.TB, name string) string {
	t.Helper()
	dir := t.TempDir()
	if err := Build(t.Context(), dir, name); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, name)
}
