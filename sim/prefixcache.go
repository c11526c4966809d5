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
// Running sequences also hold blocks that are not cached: the partial last
// prompt block and the generated tokens. They count as reserved, take
// capacity away from the cache and show in the KV usage.
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

// allocation is what one running sequence holds; give it back with release.
type allocation struct {
	blocks   []*cacheBlock
	reserved int
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{capacity: capacity, blocks: map[uint64]*cacheBlock{}}
}

// allocate pins the prompt blocks given by their chained hashes, caching the
// missing ones, and reserves the rest of the total blocks the sequence
// needs. It returns how many leading blocks were already cached.
func (c *prefixCache) allocate(hashes []uint64, total int) (hits int, a *allocation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range hashes {
		if c.blocks[h] == nil {
			break
		}
		hits++
	}
	a = &allocation{}
	for _, h := range hashes {
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
	a.reserved = max(total-len(a.blocks), 0)
	c.reserved += a.reserved
	c.makeRoomLocked(0)
	return hits, a
}

// release unpins the blocks of a finished sequence. The last blocks of the
// prompt become the least recently used, so eviction eats a prefix from its
// end and the shared beginning survives longest.
func (c *prefixCache) release(a *allocation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(a.blocks) - 1; i >= 0; i-- {
		b := a.blocks[i]
		if b.refs--; b.refs == 0 {
			b.elem = c.lru.PushFront(b)
			c.pinned--
		}
	}
	c.reserved -= a.reserved
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

// contains reports whether the block is cached; for tests.
func (c *prefixCache) contains(h uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.blocks[h] != nil
}
