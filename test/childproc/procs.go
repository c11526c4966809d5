// Package childproc has the small process helpers the demo and the benchmark
// drivers share: free loopback addresses for the children they start, the
// tail of a child's log, and a child's CPU time, memory and system calls
// from /proc.
package childproc

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// FreeAddr returns a loopback address with a port free right now, for a
// child process that takes its port as a flag. Another process may take it
// before the child binds; children here start at once, so that is rare.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free loopback port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Tail returns the last n lines of a log file, for error messages.
func Tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// CPUTime is the user+system CPU a process has used, from /proc (Linux).
func CPUTime(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 12th and 13th of them, in clock ticks of 1/100 s.
	_, rest, ok := strings.Cut(string(raw), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0, errors.New("unexpected /proc stat format")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("unexpected /proc stat values")
	}
	return time.Duration(u+s) * 10 * time.Millisecond, nil
}

// Syscalls is how many read and write system calls (of any kind: files,
// sockets, pipes) a process has made, from /proc (Linux).
func Syscalls(pid int) (reads, writes int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	found := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ": ")
		var dst *int64
		switch {
		case !ok:
			continue
		case name == "syscr":
			dst = &reads
		case name == "syscw":
			dst = &writes
		default:
			continue
		}
		if *dst, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/io %s: %w", pid, name, err)
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("/proc/%d/io: syscr or syscw not found", pid)
	}
	return reads, writes, sc.Err()
}

// RSS is a process's resident memory in bytes, from /proc (Linux).
func RSS(pid int) (int64, error) { return statusBytes(pid, "VmRSS") }

// PeakRSS is a process's peak resident memory in bytes (VmHWM) since it
// started or since ResetPeakRSS, from /proc (Linux).
func PeakRSS(pid int) (int64, error) { return statusBytes(pid, "VmHWM") }

// ResetPeakRSS sets a process's peak resident memory to its current RSS
// (Linux 4.0 and later), so that a peak read later is what came after.
func ResetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// statusBytes reads a field in kB of /proc/<pid>/status, in bytes.
func statusBytes(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status %s: %w", pid, field, err)
			}
			return kb * 1024, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}
