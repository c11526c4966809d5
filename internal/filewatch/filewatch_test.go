package filewatch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

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
