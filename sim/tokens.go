package sim

import (
	"encoding/binary"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// bytesPerToken is the simulator's tokenizer: every 4 bytes of prompt text
// are one token. It is crude on purpose: it needs no vocabulary and makes
// identical text prefixes produce identical token (and block) streams.
const bytesPerToken = 4

// countTokens estimates the tokens of text, counting a trailing partial
// token as one.
func countTokens(text string) int {
	return (len(text) + bytesPerToken - 1) / bytesPerToken
}

// blockHashes returns the chained hashes of the full blocks of text. Each
// hash covers the block's bytes and the previous hash, so a block only
// matches when everything before it matches too. The seed keeps the caches
// of different models (base and adapters) apart, as their KV differs.
func blockHashes(seed, text string, blockSize int) []uint64 {
	blockBytes := blockSize * bytesPerToken
	n := len(text) / blockBytes
	hashes := make([]uint64, n)
	prev := xxhash.Sum64String(seed)
	d := xxhash.New()
	var buf [8]byte
	for i := range n {
		d.Reset()
		binary.LittleEndian.PutUint64(buf[:], prev)
		_, _ = d.Write(buf[:])
		_, _ = d.WriteString(text[i*blockBytes : (i+1)*blockBytes])
		prev = d.Sum64()
		hashes[i] = prev
	}
	return hashes
}

// fillerWords make up generated text; output token i is word i modulo the
// list, so responses are deterministic.
var fillerWords = strings.Fields(`the quick simulated model answers every
request with these filler words until it reaches the requested number of
tokens and then stops`)

// outputToken returns the text of generated token i.
func outputToken(i int) string {
	w := fillerWords[i%len(fillerWords)]
	if i == 0 {
		return w
	}
	return " " + w
}

// outputText returns n generated tokens as one string.
func outputText(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(outputToken(i))
	}
	return b.String()
}
