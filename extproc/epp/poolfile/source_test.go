package poolfile

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// pool describes what the store holds: its endpoints and the priority of
// objective "batch".
func pool(s *datastore.Store) string {
	var addrs []string
	for _, e := range s.Endpoints() {
		addrs = append(addrs, e.Address+"/"+e.Engine)
	}
	o, ok := s.Objective("batch")
	if !ok {
		return strings.Join(addrs, ",") + " no batch"
	}
	return fmt.Sprintf("%s batch %d", strings.Join(addrs, ","), o.Priority)
}

func TestOpenAndFollow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pool.yaml")
	write(t, path, "endpoints:\n- address: 10.0.0.1:8000\n  labels: {engine: sglang}\nobjectives:\n- {name: batch, priority: -1}\n")
	store := datastore.New()
	src, err := Open(Options{Path: path, EngineLabel: "engine", Poll: 5 * time.Millisecond, Store: store, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pool(store), "10.0.0.1:8000/sglang batch -1"; got != want || !store.Synced() {
		t.Fatalf("after Open: %q (synced %v), want %q", got, store.Synced(), want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { src.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for pool(store) != want {
			if time.Now().After(deadline) {
				t.Fatalf("store holds %q, want %q", pool(store), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	write(t, path, "endpoints:\n- address: 10.0.0.1:8000\n- address: 10.0.0.2:8000\nobjectives:\n- {name: batch, priority: 2}\n")
	waitFor("10.0.0.1:8000/vllm,10.0.0.2:8000/vllm batch 2")

	// A broken edit keeps the previous pool, objectives included.
	write(t, path, "endpoints:\n- address: not-an-ip:8000\n")
	time.Sleep(50 * time.Millisecond)
	if got, want := pool(store), "10.0.0.1:8000/vllm,10.0.0.2:8000/vllm batch 2"; got != want {
		t.Fatalf("after a broken edit: %q, want %q", got, want)
	}
	write(t, path, "endpoints:\n- address: 10.0.0.3:8000\n")
	waitFor("10.0.0.3:8000/vllm no batch")
}

func TestOpenRefusesABrokenFile(t *testing.T) {
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken.yaml")
	write(t, broken, "endpoints:\n- address: 10.0.0.1\n")
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(dir, "missing.yaml"), "pool file: "},
		{broken, "pool file " + broken + ": endpoints[0]"},
	} {
		store := datastore.New()
		_, err := Open(Options{Path: tc.path, Store: store, Logger: logr.Discard()})
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to start %q", tc.path, err, tc.want)
		}
		if store.Synced() {
			t.Errorf("%s: the store was filled", tc.path)
		}
	}
}
