package main

import (
	"os"
	"runtime/debug"
)

// serverGCPercent is the GC target the long-running servers use unless
// GOGC is set. Their live heap is small (tens of MB), so Go's default of
// 100 runs the collector many times a second under load; measured with
// bench/eppload, 400 about doubles the picker's throughput on two cores
// for a few tens of MB more memory.
const serverGCPercent = 400

func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(serverGCPercent)
	}
}
