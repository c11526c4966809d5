package main

import (
	"testing"
	"time"
)

// TestMedian: each figure's median is taken on its own, so the medians may
// mix rounds (the fastest round need not have the lowest p99).
func TestMedian(t *testing.T) {
	ss := []sample{
		{rate: 100, p99: 30 * time.Millisecond, cpuPer1k: 0.5, rssMiB: 90},
		{rate: 300, p99: 10 * time.Millisecond, cpuPer1k: 0.3, rssMiB: 70},
		{rate: 200, p99: 50 * time.Millisecond, cpuPer1k: 0.4, rssMiB: 80},
	}
	m := median(ss)
	if m.rate != 200 || m.p99 != 30*time.Millisecond || m.cpuPer1k != 0.4 || m.rssMiB != 80 {
		t.Errorf("median %+v, want rate 200, p99 30ms, CPU 0.4, RSS 80", m)
	}
	if one := median(ss[:1]); one.rate != 100 {
		t.Errorf("one round: rate %v, want 100", one.rate)
	}
}

// TestRoundRatios: each round's ratio pairs the two processors of that
// round, not their medians.
func TestRoundRatios(t *testing.T) {
	ref := []sample{{rate: 100, p99: 40 * time.Millisecond}, {rate: 200, p99: 20 * time.Millisecond}}
	ours := []sample{{rate: 400, p99: 10 * time.Millisecond}, {rate: 500, p99: 10 * time.Millisecond}}
	rates, p99s := roundRatios(ref, ours)
	if rates != "4.00×, 2.50×" || p99s != "0.25×, 0.50×" {
		t.Errorf("rates %q, p99s %q", rates, p99s)
	}
}
