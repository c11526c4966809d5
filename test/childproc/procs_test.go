package childproc

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSelfFigures(t *testing.T) {
	cpu, err := CPUTime(os.Getpid())
	if err != nil || cpu < 0 {
		t.Fatalf("cpu %v, %v", cpu, err)
	}
	rss, err := RSS(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Fatalf("rss %d, %v: a Go test binary holds more than 1 MiB", rss, err)
	}
	peak, err := PeakRSS(os.Getpid())
	if err != nil || peak < rss {
		t.Fatalf("peak RSS %d below the RSS %d, %v", peak, rss, err)
	}
	if err := ResetPeakRSS(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	r0, w0, err := Syscalls(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(t.TempDir(), "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r1, w1, err := Syscalls(os.Getpid()); err != nil || w1 <= w0 || r1 < r0 {
		t.Fatalf("writes %d → %d, reads %d → %d after writing a file, %v", w0, w1, r0, r1, err)
	}
	if _, err := CPUTime(-1); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}

func TestTailAndFreeAddr(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(p, []byte("a\nb\nc\nd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := Tail(p, 2); got != "c\nd" {
		t.Fatalf("tail %q", got)
	}
	addr, err := FreeAddr()
	if err != nil || addr == "" {
		t.Fatalf("%q %v", addr, err)
	}
}
