package prefix

import (
	"sync"
	"time"
)

// Index remembers, per endpoint, the most recently used prefix blocks up
// to a capacity, evicting the least recently used, as a server's prefix
// cache does. It is safe for concurrent use; each endpoint has its own
// lock, so lookups for different endpoints do not contend.
type Index struct {
	mu      sync.Mutex
	servers map[string]*lru
	// defaultCapacity applies until an endpoint's own capacity is known.
	defaultCapacity int
}

// NewIndex returns an index holding up to defaultCapacity blocks per
// endpoint until SetCapacity says otherwise.
func NewIndex(defaultCapacity int) *Index {
	return &Index{servers: map[string]*lru{}, defaultCapacity: max(defaultCapacity, 1)}
}

func (x *Index) server(addr string, create bool) *lru {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.servers[addr]
	if s == nil && create {
		s = newLRU(x.defaultCapacity)
		x.servers[addr] = s
	}
	if s != nil {
		s.lastUsed.Store(time.Now().UnixNano())
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

// Prune drops endpoints not used since before cutoff (gone from the pool).
func (x *Index) Prune(cutoff time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for addr, s := range x.servers {
		if s.lastUsed.Load() < cutoff.UnixNano() {
			delete(x.servers, addr)
		}
	}
}

// Stats reports the blocks held per endpoint.
func (x *Index) Stats() map[string]int {
	x.mu.Lock()
	servers := make(map[string]*lru, len(x.servers))
	for a, s := range x.servers {
		servers[a] = s
	}
	x.mu.Unlock()
	out := make(map[string]int, len(servers))
	for a, s := range servers {
		out[a] = s.len()
	}
	return out
}
