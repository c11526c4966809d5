package prefix

import (
	"sync"
	"sync/atomic"
)

// lru is one endpoint's block memory: a hash map into a slab of nodes
// linked most-recent first. Nodes are addressed by index, not pointer, so
// a large index costs the garbage collector nothing to scan.
type lru struct {
	mu       sync.Mutex
	capacity int
	pos      map[uint64]int32
	nodes    []node
	head     int32 // most recently used, nilNode when empty
	tail     int32 // least recently used
	free     []int32
	// usedRound is the Index's Prune round when the endpoint was last
	// looked up.
	usedRound atomic.Int64
}

type node struct {
	hash       uint64
	prev, next int32
}

const nilNode = -1

func newLRU(capacity int) *lru {
	return &lru{capacity: capacity, pos: map[uint64]int32{}, head: nilNode, tail: nilNode}
}

func (l *lru) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pos)
}

func (l *lru) match(hashes []uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, h := range hashes {
		if _, ok := l.pos[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// add touches every hash, inserting missing ones. The first block of a
// prefix is touched last, so it is the most recent: eviction then eats
// prefixes from their ends, and a shared beginning survives longest, as in
// the servers' caches.
func (l *lru) add(hashes []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if n, ok := l.pos[h]; ok {
			l.unlink(n)
			l.pushFront(n)
			continue
		}
		for len(l.pos) >= l.capacity {
			l.evict()
		}
		l.pushFront(l.node(h))
	}
}

func (l *lru) setCapacity(c int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.capacity = c
	for len(l.pos) > l.capacity {
		l.evict()
	}
}

func (l *lru) evict() {
	n := l.tail
	l.unlink(n)
	delete(l.pos, l.nodes[n].hash)
	l.free = append(l.free, n)
}

func (l *lru) unlink(n int32) {
	nd := &l.nodes[n]
	if nd.prev != nilNode {
		l.nodes[nd.prev].next = nd.next
	} else {
		l.head = nd.next
	}
	if nd.next != nilNode {
		l.nodes[nd.next].prev = nd.prev
	} else {
		l.tail = nd.prev
	}
	nd.prev, nd.next = nilNode, nilNode
}

func (l *lru) pushFront(n int32) {
	nd := &l.nodes[n]
	nd.prev, nd.next = nilNode, l.head
	if l.head != nilNode {
		l.nodes[l.head].prev = n
	}
	l.head = n
	if l.tail == nilNode {
		l.tail = n
	}
}

// appendRecent appends up to n hashes, most recently used first.
func (l *lru) appendRecent(dst []uint64, n int) []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := l.head; i != nilNode && n > 0; i, n = l.nodes[i].next, n-1 {
		dst = append(dst, l.nodes[i].hash)
	}
	return dst
}

// addOlder inserts the hashes it lacks behind every block it holds, in the
// order given (most recent first), while there is room: what a peer
// remembers never pushes out what this memory learned itself.
func (l *lru) addOlder(hashes []uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	added := 0
	for _, h := range hashes {
		if len(l.pos) >= l.capacity {
			break
		}
		if _, ok := l.pos[h]; ok {
			continue
		}
		n := l.node(h)
		l.pushBack(n)
		added++
	}
	return added
}

// remove forgets the hashes it holds.
func (l *lru) remove(hashes []uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	removed := 0
	for _, h := range hashes {
		if n, ok := l.pos[h]; ok {
			l.unlink(n)
			delete(l.pos, h)
			l.free = append(l.free, n)
			removed++
		}
	}
	return removed
}

// clear forgets everything, keeping the capacity.
func (l *lru) clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.pos)
	l.nodes, l.free = l.nodes[:0], l.free[:0]
	l.head, l.tail = nilNode, nilNode
}

func (l *lru) capacityOf() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.capacity
}

// node takes a free node for h and indexes it, unlinked.
func (l *lru) node(h uint64) int32 {
	var n int32
	if k := len(l.free); k > 0 {
		n = l.free[k-1]
		l.free = l.free[:k-1]
	} else {
		l.nodes = append(l.nodes, node{})
		n = int32(len(l.nodes) - 1)
	}
	l.nodes[n] = node{hash: h, prev: nilNode, next: nilNode}
	l.pos[h] = n
	return n
}

func (l *lru) pushBack(n int32) {
	nd := &l.nodes[n]
	nd.prev, nd.next = l.tail, nilNode
	if l.tail != nilNode {
		l.nodes[l.tail].next = n
	}
	l.tail = n
	if l.head == nilNode {
		l.head = n
	}
}
