//go:build !linux

package main

import (
	"os/exec"
	"time"
)

func setProcAttr(*exec.Cmd) {}

func selfCPU() time.Duration { return 0 }

// loadAverage is unknown here.
func loadAverage() string { return "-" }
