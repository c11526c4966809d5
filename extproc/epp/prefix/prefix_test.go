package prefix

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/infergate/infergate/inference/wire"
)

func text(tokens int, seed string) string {
	var b strings.Builder
	for b.Len() < tokens*wire.DefaultBytesPerToken {
		b.WriteString(seed)
	}
	return b.String()[:tokens*wire.DefaultBytesPerToken]
}

func TestHashesChain(t *testing.T) {
	base := text(64, "abcdefgh")
	other := "X" + base[1:] // differs in block 0
	late := base[:40*wire.DefaultBytesPerToken] + "Y" + base[40*wire.DefaultBytesPerToken+1:]
	h := Hashes("m", base, 16, 100)
	if len(h) != 4 {
		t.Fatalf("64 tokens in blocks of 16: %d hashes", len(h))
	}
	if got := Hashes("m", base+"tail", 16, 100); len(got) != 4 || got[3] != h[3] {
		t.Fatal("a partial trailing block changed the hashes")
	}
	if o := Hashes("m", other, 16, 100); o[0] == h[0] || o[3] == h[3] {
		t.Fatal("a change in block 0 must change every hash after it")
	}
	l := Hashes("m", late, 16, 100)
	if l[0] != h[0] || l[1] != h[1] || l[2] == h[2] || l[3] == h[3] {
		t.Fatal("a change in block 2 must keep blocks 0-1 and change 2-3")
	}
	if Hashes("other-model", base, 16, 100)[0] == h[0] {
		t.Fatal("the model must seed the chain")
	}
	if len(Hashes("m", base, 16, 2)) != 2 || Hashes("m", "short", 16, 10) != nil {
		t.Fatal("maxBlocks or short prompts not honoured")
	}
}

func TestIndexMatchAndEviction(t *testing.T) {
	x := NewIndex(6)
	a := Hashes("m", text(64, "aaaa"), 16, 100) // 4 blocks
	b := Hashes("m", text(64, "bbbb"), 16, 100)
	x.Add("10.0.0.1:8000", a)
	if got := x.Match("10.0.0.1:8000", a); got != 4 {
		t.Fatalf("match %d, want 4", got)
	}
	if got := x.Match("10.0.0.2:8000", a); got != 0 {
		t.Fatalf("unknown endpoint matched %d", got)
	}
	// b needs 4 more blocks in a capacity of 6: a's last two blocks go
	// first, its shared beginning survives.
	x.Add("10.0.0.1:8000", b)
	if got := x.Match("10.0.0.1:8000", a); got != 2 {
		t.Fatalf("after eviction a matches %d blocks, want its first 2", got)
	}
	if got := x.Match("10.0.0.1:8000", b); got != 4 {
		t.Fatalf("b matches %d", got)
	}
	// Touching a makes it recent; b is evicted next.
	x.Add("10.0.0.1:8000", a[:2])
	x.SetCapacity("10.0.0.1:8000", 3)
	if got := x.Match("10.0.0.1:8000", a); got != 2 {
		t.Fatalf("recently used a lost blocks on shrink: %d", got)
	}
	if x.Stats()["10.0.0.1:8000"] != 3 {
		t.Fatalf("stats %v", x.Stats())
	}
}

func TestIndexPruneForgetsEndpointsUnusedSinceTheLastPrune(t *testing.T) {
	x := NewIndex(8)
	a := Hashes("m", text(64, "aaaa"), 16, 100)
	x.Add("10.0.0.1:8000", a)
	x.Add("10.0.0.2:8000", a)
	x.Prune() // both used since the start
	if len(x.Stats()) != 2 {
		t.Fatalf("the first prune forgot endpoints used before it: %v", x.Stats())
	}
	x.Match("10.0.0.1:8000", a) // a lookup is a use
	x.Prune()
	if got := x.Stats(); len(got) != 1 || got["10.0.0.1:8000"] != 4 {
		t.Fatalf("after the second prune: %v, want only the endpoint looked up between the two", got)
	}
	x.Prune()
	if len(x.Stats()) != 0 {
		t.Fatal("prune kept an idle endpoint")
	}
	// A forgotten endpoint starts afresh.
	if x.Match("10.0.0.1:8000", a) != 0 {
		t.Fatal("a pruned endpoint still matched")
	}
	x.Add("10.0.0.1:8000", a[:1])
	if x.Match("10.0.0.1:8000", a) != 1 {
		t.Fatal("an endpoint added after its prune is not remembered")
	}
}

// TestIndexConcurrentUse runs lookups, additions and new endpoints against
// prunes (go test -race checks the lock-free reads).
func TestIndexConcurrentUse(t *testing.T) {
	x := NewIndex(64)
	a := Hashes("m", text(64, "aaaa"), 16, 100)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				addr := fmt.Sprintf("10.0.%d.%d:8000", g, i%16)
				x.Add(addr, a)
				x.Match(addr, a)
				if i%100 == 0 {
					x.Prune()
				}
			}
		})
	}
	wg.Wait()
	for addr, n := range x.Stats() {
		if n != len(a) {
			t.Errorf("%s holds %d blocks, want %d", addr, n, len(a))
		}
	}
}

// TestIndexMemoryIsBounded fills several endpoints far past capacity and
// reports the bytes each costs at capacity.
func TestIndexMemoryIsBounded(t *testing.T) {
	const capacity, endpoints = 31250, 4
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := NewIndex(capacity)
	for e := range endpoints {
		addr := fmt.Sprintf("10.0.0.%d:8000", e)
		for i := range 3 * capacity / 128 { // three times the capacity in 128-block prompts
			x.Add(addr, Hashes("m", text(128*16, fmt.Sprintf("%d-%d|", e, i)), 16, 1<<20))
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	for addr, n := range x.Stats() {
		if n != capacity {
			t.Fatalf("%s holds %d blocks, capacity %d", addr, n, capacity)
		}
	}
	perEndpoint := float64(after.HeapAlloc-before.HeapAlloc) / endpoints
	t.Logf("prefix index: %.0f bytes per endpoint at %d blocks (%.0f bytes per block)", perEndpoint, capacity, perEndpoint/capacity)
	if perEndpoint/capacity > 128 {
		t.Fatalf("%.0f bytes per block; the index is meant to stay compact", perEndpoint/capacity)
	}
	runtime.KeepAlive(x)
}

func BenchmarkHashes2048Tokens(b *testing.B) {
	p := text(2048, "lorem ipsum dolor ")
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		Hashes("m", p, 16, 2048)
	}
}

func BenchmarkMatch(b *testing.B) {
	x := NewIndex(31250)
	h := Hashes("m", text(2048, "lorem ipsum dolor "), 16, 2048)
	x.Add("a", h)
	b.ResetTimer()
	for b.Loop() {
		x.Match("a", h)
	}
}

func TestIndexPeerStateFillsGapsWithoutEvicting(t *testing.T) {
	own := Hashes("m", text(64, "own!"), 16, 100)   // 4 blocks learned here
	peer := Hashes("m", text(128, "peer"), 16, 100) // 8 blocks a peer holds
	x := NewIndex(10)
	x.Add("a", own)
	if n := x.AddOlder("a", append(peer, own...)); n != 6 {
		t.Fatalf("AddOlder added %d, want 6 (room for 6 of the peer's 8; own blocks already held)", n)
	}
	if x.Match("a", own) != 4 {
		t.Fatal("a peer's blocks evicted this index's own")
	}
	if got := x.Match("a", peer); got != 6 {
		t.Fatalf("peer prefix matched %d blocks, want the 6 that fitted", got)
	}
	// The peer's blocks are the oldest: new learning evicts them first.
	x.Add("a", Hashes("m", text(16, "new."), 16, 100))
	if x.Match("a", own) != 4 || x.Match("a", peer) != 5 {
		t.Fatalf("after one new block: own %d (want 4), peer %d (want 5)", x.Match("a", own), x.Match("a", peer))
	}
	recent := x.Recent("a", 100)
	if len(recent) != 10 || recent[len(recent)-1] != peer[4] {
		t.Fatalf("Recent: %d blocks, last %x; want 10 ending with the peer's 5th block", len(recent), recent[len(recent)-1])
	}
	if x.Capacity("a") != 10 || x.Capacity("nobody") != 0 || x.Recent("nobody", 5) != nil {
		t.Fatal("capacity or Recent of an unknown endpoint")
	}
}

func TestIndexRemoveAndClear(t *testing.T) {
	h := Hashes("m", text(64, "abcd"), 16, 100)
	x := NewIndex(100)
	x.Add("a", h)
	if n := x.Remove("a", []uint64{h[2], 12345}); n != 1 {
		t.Fatalf("Remove returned %d, want 1", n)
	}
	if x.Match("a", h) != 2 {
		t.Fatalf("after removing block 2 the prefix matches %d blocks, want 2", x.Match("a", h))
	}
	x.Add("a", h) // the freed node is reused
	if x.Match("a", h) != 4 || x.Stats()["a"] != 4 {
		t.Fatal("re-adding after Remove")
	}
	x.Clear("a")
	if x.Match("a", h) != 0 || x.Stats()["a"] != 0 || x.Capacity("a") != 100 {
		t.Fatal("Clear must forget every block and keep the capacity")
	}
	x.Add("a", h)
	if x.Match("a", h) != 4 {
		t.Fatal("learning after Clear")
	}
	x.Clear("nobody")
	if x.Remove("nobody", h) != 0 {
		t.Fatal("Remove on an unknown endpoint")
	}
}
