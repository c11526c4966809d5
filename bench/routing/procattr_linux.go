package main

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// setProcAttr makes the kernel kill a child if the driver dies without
// stopping it (kill -9, crash).
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// selfCPU is the CPU time the driver itself has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAverage is the machine's 1-minute load average, for the progress
// lines: the driver shares the machine, and a run under other load is one
// to repeat.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "-"
}
