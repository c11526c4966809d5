package prefix

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Index remembers, per endpoint, the most recently used prefix blocks up
// to a capacity, evicting the least recently used, as a server's prefix
// cache does. It is safe for concurrent use; each endpoint has its own
// lock, so lookups for different endpoints do not contend.
type Index struct {
	// servers is read without a lock on every lookup (a request looks up
	// every endpoint in the pool) and replaced whole, under mu, when an
	// endpoint comes or goes, which is rare.
	servers atomic.Pointer[map[string]*lru]
	mu      sync.Mutex
	// round counts Prune's calls; a lookup marks its endpoint with the
	// current round, so that Prune can tell which were used since the
	// last one without a clock read per lookup.
	round atomic.Int64
	// defaultCapacity applies until an endpoint's own capacity is known.
	defaultCapacity int
}

// NewIndex returns an index holding up to defaultCapacity blocks per
// endpoint until SetCapacity says otherwise.
func NewIndex(defaultCapacity int) *Index {
	x := &Index{defaultCapacity: max(defaultCapacity, 1)}
	x.servers.Store(&map[string]*lru{})
	return x
}

// server is addr's memory, created when create is set, marked used.
func (x *Index) server(addr string, create bool) *lru {
	s := (*x.servers.Load())[addr]
	if s == nil && create {
		x.mu.Lock()
		cur := *x.servers.Load()
		if s = cur[addr]; s == nil {
			s = newLRU(x.defaultCapacity)
			next := maps.Clone(cur)
			next[addr] = s
			x.servers.Store(&next)
		}
		x.mu.Unlock()
	}
	if s != nil {
		// Written only when the round has changed: every lookup of a
		// busy endpoint from every core would otherwise write the line.
		if r := x.round.Load(); s.usedRound.Load() != r {
			s.usedRound.Store(r)
		}
	}
	return s
}

// Match returns how many leading hashes the endpoint holds.
func (x *Index) Match(addr string, hashes []uint64) int {
	if len(hashes) == 0 {
		return 0
	}
	s := x.server(addr, false)
	if s == nil {
		return 0
	}
	return s.match(hashes)
}

// Add records that the endpoint now holds these blocks, most recent last
// used, evicting its least recently used blocks beyond capacity.
func (x *Index) Add(addr string, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	x.server(addr, true).add(hashes)
}

// SetCapacity sizes an endpoint's memory (e.g. from the KV-cache size it
// publishes), evicting at once if it shrinks.
func (x *Index) SetCapacity(addr string, blocks int) {
	if blocks <= 0 {
		return
	}
	x.server(addr, true).setCapacity(blocks)
}

// Prune forgets the endpoints not used since the last Prune (gone from
// the pool): called every d, it forgets those unused for d to 2d.
func (x *Index) Prune() {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.round.Add(1)
	cur := *x.servers.Load()
	next := make(map[string]*lru, len(cur))
	for addr, s := range cur {
		if s.usedRound.Load() >= r-1 {
			next[addr] = s
		}
	}
	x.servers.Store(&next)
}

// Stats reports the blocks held per endpoint.
func (x *Index) Stats() map[string]int {
	servers := *x.servers.Load()
	out := make(map[string]int, len(servers))
	for a, s := range servers {
		out[a] = s.len()
	}
	return out
}

// Recent returns up to n of the endpoint's blocks, most recently used
// first: what a replica that joins is given.
func (x *Index) Recent(addr string, n int) []uint64 {
	s := (*x.servers.Load())[addr]
	if s == nil || n <= 0 {
		return nil
	}
	return s.appendRecent(nil, n)
}

// Capacity is the endpoint's memory size, 0 when it has none yet.
func (x *Index) Capacity(addr string) int {
	if s := (*x.servers.Load())[addr]; s != nil {
		return s.capacityOf()
	}
	return 0
}

// AddOlder records blocks another replica remembers for the endpoint,
// given most recent first, behind those this index learned itself and
// only while it has room: a peer's memory fills gaps, never evicts. It
// returns how many blocks were new.
func (x *Index) AddOlder(addr string, hashes []uint64) int {
	if len(hashes) == 0 {
		return 0
	}
	return x.server(addr, true).addOlder(hashes)
}

// Remove forgets blocks the endpoint no longer holds (its engine said it
// evicted them) and returns how many it held.
func (x *Index) Remove(addr string, hashes []uint64) int {
	s := (*x.servers.Load())[addr]
	if s == nil {
		return 0
	}
	return s.remove(hashes)
}

// Clear forgets all the endpoint's blocks (its engine cleared its cache,
// or restarted).
func (x *Index) Clear(addr string) {
	if s := (*x.servers.Load())[addr]; s != nil {
		s.clear()
	}
}
