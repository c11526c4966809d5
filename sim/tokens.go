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
// list, so responses are deterministic. Every token is a space and three
// letters, exactly bytesPerToken bytes, so that the text of n generated
// tokens is n tokens to the simulator's tokenizer too, and a follow-up
// prompt that quotes an answer (the next turn of a chat) lines up with the
// blocks cached for that answer.
var fillerWords = strings.Fields(`the sim has one way for you and its bit but not
any new fun yet you may ask all the old law and get its end`)

// outputToken returns the text of generated token i.
func outputToken(i int) string {
	return " " + fillerWords[i%len(fillerWords)]
}

// outputText returns n generated tokens as one string.
func outputText(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(outputToken(i))
	}
	return b.String()
}

// seqBlocks is the KV cache footprint of one request.
type seqBlocks struct {
	// prompt are the hashes of the prompt's full blocks, looked up and
	// cached when the request is admitted.
	prompt []uint64
	// output are the hashes of the further full blocks (the prompt's partial
	// last block completed by generated tokens, then generated tokens only)
	// that are cached once generation is done.
	output []uint64
	// total is how many blocks the sequence holds while it runs.
	total int
}

// sequenceBlocks works out the blocks of a request that generates
// maxTokens tokens. Like vLLM it caches every full block of prompt and
// output; the KV of the last generated token is never computed (the
// sequence stops once it is sampled), so promptTokens+maxTokens-1 tokens
// occupy blocks. At most limit blocks of output are hashed, which bounds
// the work for absurd max_tokens values.
func sequenceBlocks(seed, prompt string, maxTokens, blockSize, limit int) seqBlocks {
	computed := countTokens(prompt) + maxTokens - 1
	full := min(computed/blockSize, len(prompt)/(blockSize*bytesPerToken)+limit)
	// The hashes chain over the bytes of prompt then output, so the prompt's
	// own full blocks come first and are what blockHashes(prompt) gives.
	outTokens := max(min(maxTokens, full*blockSize-len(prompt)/bytesPerToken+1), 0)
	hashes := blockHashes(seed, prompt+outputText(outTokens), blockSize)
	hashes = hashes[:min(full, len(hashes))]
	n := min(len(prompt)/(blockSize*bytesPerToken), len(hashes))
	return seqBlocks{
		prompt: hashes[:n],
		output: hashes[n:],
		total:  max((computed+blockSize-1)/blockSize, n, 1),
	}
}
