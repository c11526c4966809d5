package main

import (
	"os/exec"
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
