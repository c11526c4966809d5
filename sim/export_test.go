package sim

// contains reports whether the block is cached.
func (c *prefixCache) contains(h uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.blocks[h] != nil
}
