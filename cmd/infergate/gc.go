package main

// GC targets of the long-running servers, used unless GOGC is set (server.Flags.LimitGoMemory bounds the heap besides).
//
// The picker keeps a small live heap (tens of MB) and
// allocate a little per request; Go's default of 100 runs the collector
// many times a second under load, and 400, measured with bench/eppload,
// about doubles the picker's throughput on two cores for a few tens of MB
// more memory.
//
// The payload processor holds every request body while it arrives, so its
// garbage grows with the bodies: at 400 its resident memory was twice the
// reference body-based router's with 64 KiB bodies over 32 streams (248
// against 120 MiB, medians of 3, bench/eppload --body-bytes 65536
// --chunk-bytes 16384), at 100 about the same (121 MiB) while it still
// served 1.6 times the router's requests (README "Memory").
const (
	serverGCPercent  = 400
	payloadGCPercent = 100
)
