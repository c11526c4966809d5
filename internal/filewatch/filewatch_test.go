package filewatch

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// watched writes a file, watches it every interval until the test ends,
// and returns its path and a channel that receives one value per call.
func watched(t *testing.T, every time.Duration) (string, <-chan struct{}) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f")
	write(t, path, "a")
	since, err := StampOf(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan struct{}, 10)
	done := make(chan struct{})
	go func() {
		Watch(ctx, path, since, every, func() { calls <- struct{}{} })
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return path, calls
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// expect waits up to d for a call (want true) or for none (want false).
func expect(t *testing.T, calls <-chan struct{}, want bool, d time.Duration, what string) {
	t.Helper()
	select {
	case <-calls:
		if !want {
			t.Fatalf("called %s", what)
		}
	case <-time.After(d):
		if want {
			t.Fatalf("not called %s", what)
		}
	}
}

// TestWatchWaitsForTheFileToSettle rewrites the file faster than the
// watch interval for a while: no call until the writes stop.
func TestWatchWaitsForTheFileToSettle(t *testing.T) {
	path, calls := watched(t, 20*time.Millisecond)
	for i := range 10 {
		write(t, path, strings.Repeat("b", i+2))
		expect(t, calls, false, 10*time.Millisecond, "while the file kept changing")
	}
	expect(t, calls, true, 5*time.Second, "once the file settled")
}

func TestWatchCallsOncePerChange(t *testing.T) {
	path, calls := watched(t, 5*time.Millisecond)
	expect(t, calls, false, 50*time.Millisecond, "without a change")
	write(t, path, "bb")
	expect(t, calls, true, 5*time.Second, "after a change")
	expect(t, calls, false, 50*time.Millisecond, "twice for one change")
}
