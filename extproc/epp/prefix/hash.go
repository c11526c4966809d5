// Package prefix is the endpoint picker's approximate view of which model
// server holds which prompt prefix in its KV cache. It never sees the
// servers' caches: it remembers which endpoint recently served which
// prefix blocks, bounded like the servers' own caches, and matches new
// requests against that memory.
package prefix

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/infergate/infergate/inference/wire"
)

// Hashes returns the chained hashes of the prompt's full blocks of
// blockTokens estimated tokens (wire.DefaultBytesPerToken bytes each: block
// identity only needs to be stable, not exact, so a byte count stands in
// for a tokenizer), at most maxBlocks of them. Block i's hash
// covers its bytes and block i−1's hash, and the chain is seeded by the
// model, so equal hashes mean equal prefixes of the same model: a hit on
// block i implies the whole prefix up to i. A trailing partial block is not
// hashed, as servers cache only full blocks.
func Hashes(model, prompt string, blockTokens, maxBlocks int) []uint64 {
	blockBytes := blockTokens * wire.DefaultBytesPerToken
	n := min(len(prompt)/blockBytes, maxBlocks)
	if n <= 0 {
		return nil
	}
	out := make([]uint64, n)
	prev := xxhash.Sum64String(model)
	var d xxhash.Digest
	var seed [8]byte
	for i := range n {
		d.Reset()
		binary.LittleEndian.PutUint64(seed[:], prev)
		_, _ = d.Write(seed[:])
		_, _ = d.WriteString(prompt[i*blockBytes : (i+1)*blockBytes])
		prev = d.Sum64()
		out[i] = prev
	}
	return out
}
