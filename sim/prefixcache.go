package sim

import (
	"container/list"
	"sync"
)

// prefixCache models vLLM's paged KV cache with automatic prefix caching.
// It holds up to capacity blocks. Blocks of running sequences are pinned
// (reference counted); the others stay cached for later requests until
// space is needed, and are then evicted least recently used first.
//
// Running sequences also hold blocks that are not cached yet: the partial
// last prompt block and the blocks of the tokens they generate. They count
// as reserved, take capacity away from the cache and show in the KV usage.
// When a sequence finishes, its full output blocks become cached blocks like
// its prompt blocks, as in vLLM, which caches every full block of prompt and
// output: so finished requests leave their unique suffix and answer behind,
// and those compete for space with the prefixes that are shared.
//
// The differences from vLLM that matter: the sim reserves a sequence's
// output blocks when it is admitted, where vLLM allocates them as decoding
// fills them and preempts a sequence when it runs out; and an aborted
// sequence leaves only its prompt blocks cached.
type prefixCache struct {
	capacity int

	mu       sync.Mutex
	blocks   map[uint64]*cacheBlock
	lru      list.List // unpinned blocks, most recently used at the front
	pinned   int       // blocks with refs > 0
	reserved int
}

type cacheBlock struct {
	hash uint64
	refs int
	elem *list.Element // in lru while refs == 0
}

// allocation is what one running sequence holds; give it back with release
// or finish.
type allocation struct {
	blocks   []*cacheBlock
	reserved int
	// output are the hashes of the output blocks that finish caches.
	output []uint64
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{capacity: capacity, blocks: map[uint64]*cacheBlock{}}
}

// tryAllocate admits a sequence if its blocks fit beside those of the
// running sequences, as vLLM only schedules a waiting request when the free
// blocks (empty or cached but unused, hence evictable) cover what it needs.
// Cached blocks that the sequence reuses cost nothing if another running
// sequence holds them already, and one free block otherwise. With force the
// sequence gets in regardless, and what does not fit goes uncached.
//
// Admitted, the sequence pins its prompt blocks given by their chained
// hashes, caching the missing ones, and reserves the rest of its total
// blocks. hits is how many leading prompt blocks were already cached.
func (c *prefixCache) tryAllocate(seq seqBlocks, force bool) (hits int, a *allocation, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !force {
		cost := seq.total
		for _, h := range seq.prompt {
			if b := c.blocks[h]; b != nil && b.refs > 0 {
				cost--
			}
		}
		if cost > c.capacity-c.pinned-c.reserved {
			return 0, nil, false
		}
	}
	for _, h := range seq.prompt {
		if c.blocks[h] == nil {
			break
		}
		hits++
	}
	a = &allocation{}
	for _, h := range seq.prompt {
		b := c.blocks[h]
		if b == nil {
			if !c.makeRoomLocked(1) {
				break // everything is pinned: the rest of the prompt is not cached
			}
			b = &cacheBlock{hash: h}
			c.blocks[h] = b
		}
		c.pinLocked(b)
		a.blocks = append(a.blocks, b)
	}
	a.reserved = max(seq.total-len(a.blocks), 0)
	if len(a.blocks) == len(seq.prompt) { // else the chain is broken
		a.output = seq.output[:min(len(seq.output), a.reserved)]
	}
	c.reserved += a.reserved
	c.makeRoomLocked(0)
	return hits, a, true
}

// release unpins the blocks of a sequence that ended early. The last blocks
// become the least recently used, so eviction eats a sequence from its end
// and the shared beginning survives longest, as in vLLM, which frees a
// request's blocks in reverse order.
func (c *prefixCache) release(a *allocation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.releaseLocked(a)
}

// finish releases a sequence that generated all its tokens, first turning
// the reserved blocks that its output filled into cached blocks.
func (c *prefixCache) finish(a *allocation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range a.output {
		b := c.blocks[h]
		if b == nil {
			// The reserved block takes the hash: the total does not grow.
			b = &cacheBlock{hash: h}
			c.blocks[h] = b
			a.reserved--
			c.reserved--
		}
		// An identical sequence may have cached it already; then the
		// reserved block was a duplicate and is freed with the rest.
		c.pinLocked(b)
		a.blocks = append(a.blocks, b)
	}
	a.output = nil
	c.releaseLocked(a)
}

func (c *prefixCache) releaseLocked(a *allocation) {
	for i := len(a.blocks) - 1; i >= 0; i-- {
		b := a.blocks[i]
		if b.refs--; b.refs == 0 {
			b.elem = c.lru.PushFront(b)
			c.pinned--
		}
	}
	c.reserved -= a.reserved
	a.blocks, a.reserved = nil, 0
}

func (c *prefixCache) pinLocked(b *cacheBlock) {
	if b.refs == 0 {
		if b.elem != nil {
			c.lru.Remove(b.elem)
			b.elem = nil
		}
		c.pinned++
	}
	b.refs++
}

// makeRoomLocked evicts unpinned blocks until extra more blocks fit. It
// reports false when that is impossible because the rest is in use.
func (c *prefixCache) makeRoomLocked(extra int) bool {
	for len(c.blocks)+c.reserved+extra > c.capacity {
		back := c.lru.Back()
		if back == nil {
			return false
		}
		b := c.lru.Remove(back).(*cacheBlock)
		delete(c.blocks, b.hash)
	}
	return true
}

// usage is the fraction of the KV cache held by running sequences.
func (c *prefixCache) usage() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return min(float64(c.pinned+c.reserved)/float64(c.capacity), 1)
}
