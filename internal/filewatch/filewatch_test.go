package filewatch

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWatchWaitsForTheFileToSettle rewrites the file on every tick for a
// while: no call until the writes stop.
func TestWatchWaitsForTheFileToSettle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	since, err := StampOf(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := make(chan struct{}, 10)
	go Watch(ctx, path, since, 20*time.Millisecond, func() { calls <- struct{}{} })
	for i := range 10 {
		if err := os.WriteFile(path, []byte(strings.Repeat("b", i+2)), 0o600); err != nil {
			t.Fatal(err)
		}
		select {
		case <-calls:
			t.Fatalf("called after write %d while the file kept changing", i)
		case <-time.After(10 * time.Millisecond):
		}
	}
	select {
	case <-calls:
	case <-time.After(5 * time.Second):
		t.Fatal("not called once the file settled")
	}
}

func TestWatchCallsOncePerChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	since, err := StampOf(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan struct{}, 10)
	done := make(chan struct{})
	go func() {
		Watch(ctx, path, since, 5*time.Millisecond, func() { calls <- struct{}{} })
		close(done)
	}()
	select {
	case <-calls:
		t.Fatal("called without a change")
	case <-time.After(50 * time.Millisecond):
	}
	if err := os.WriteFile(path, []byte("bb"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-calls:
	case <-time.After(5 * time.Second):
		t.Fatal("change not seen")
	}
	select {
	case <-calls:
		t.Fatal("one change reported twice")
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	<-done
}
