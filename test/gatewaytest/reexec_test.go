package gatewaytest_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/infergate/infergate/test/gatewaytest"
)

// orphanEnv makes the test binary the program TestReexecLeavesNoProcess
// runs instead of its tests; its value is the sleep's argument.
const orphanEnv = "INFERGATE_TEST_ORPHAN"

// orphanExit is the program's exit code inside the namespace.
const orphanExit = 7

func TestMain(m *testing.M) {
	if arg := os.Getenv(orphanEnv); arg != "" {
		os.Exit(orphan(arg))
	}
	os.Exit(m.Run())
}

// orphan re-runs itself through Reexec and, in the namespace, starts a
// sleep without a Pdeathsig and exits without waiting for it, as a test
// binary does when it panics at its -timeout with envtest's API server
// running.
func orphan(arg string) int {
	if !gatewaytest.InNamespace() {
		return gatewaytest.Reexec([]string{"--net"})
	}
	if err := exec.Command("sleep", arg).Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return orphanExit
}

// TestReexecLeavesNoProcess: when the re-run ends, what it started and
// left ends with it, and its exit code is the program's.
func TestReexecLeavesNoProcess(t *testing.T) {
	// A sleep no other process runs: its argument names it in /proc.
	arg := fmt.Sprintf("3600.%09d", time.Now().Nanosecond())
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), orphanEnv+"="+arg)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != orphanExit {
		t.Fatalf("re-run: %v, want exit code %d:\n%s", err, orphanExit, out)
	}
	// The kernel kills the rest of a PID namespace as its first process
	// exits, and waits for them (zap_pid_ns_processes) before unshare can
	// see that process end.
	if pids := sleeping(t, arg); len(pids) > 0 {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		t.Fatalf("sleep %s (pids %v) outlived the re-run that started it", arg, pids)
	}
}

// sleeping lists the pids of the machine's processes running sleep arg.
func sleeping(t *testing.T, arg string) []int {
	t.Helper()
	want := []byte("sleep\x00" + arg + "\x00")
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, path := range dirs {
		cmdline, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(cmdline, want) {
			continue // ended meanwhile, or another process
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
