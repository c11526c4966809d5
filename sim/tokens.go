package sim

import (
	"encoding/binary"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// tokenizer is the simulator's stand-in for a model's tokenizer. It needs
// no vocabulary: it cuts text into byte ranges, so that identical text
// prefixes give identical token (and block) streams, and servers whose
// tokenizers differ can still be told apart by how many tokens the same
// text makes.
//
// Token boundaries are local: a boundary before the end of a text depends
// only on the bytes up to it and the one after, so a text's tokens are
// those of any longer text that starts with it, but for its last token,
// which the text that follows may extend. That last piece is still one
// token of the text alone.
type tokenizer interface {
	// tokenEnd returns the end offset of the token of text that starts at
	// offset start, a token boundary with 0 <= start < len(text).
	tokenEnd(text string, start int) int
	// count returns the number of tokens of text.
	count(text string) int
	// outputToken returns the text of generated token i: a space and a
	// word. It is one token on its own, after text that ends with a whole
	// token (for words, a non-space byte) and before the next output token,
	// so that the text of n generated tokens is n tokens and a follow-up
	// prompt that quotes an answer (the next turn of a chat) lines up with
	// the blocks cached for that answer.
	outputToken(i int) string
}

// newTokenizer returns the tokenizer that a validated Config names.
func newTokenizer(cfg Config) tokenizer {
	if cfg.Tokenizer == TokenizerWords {
		return wordsTokenizer{}
	}
	return newBytesTokenizer(cfg.BytesPerToken)
}

// CountTokens returns how many tokens text makes under the tokenizer that
// a Config's Tokenizer and BytesPerToken name (zero values for the
// defaults), as a server so configured counts a prompt. The configuration
// must be one that Config.Validate accepts.
func CountTokens(tokenizer string, bytesPerToken int, text string) int {
	return newTokenizer(Config{Tokenizer: tokenizer, BytesPerToken: bytesPerToken}.WithDefaults()).count(text)
}

// bytesTokenizer makes every n bytes one token, a trailing partial token
// counting as one.
type bytesTokenizer struct {
	n      int
	output []string // generated tokens, n bytes each
}

func newBytesTokenizer(n int) bytesTokenizer {
	words := fillerWords[n-1]
	output := make([]string, len(words))
	for i, w := range words {
		output[i] = " " + w
	}
	return bytesTokenizer{n: n, output: output}
}

func (t bytesTokenizer) tokenEnd(text string, start int) int {
	return min(start+t.n, len(text))
}

func (t bytesTokenizer) count(text string) int { return (len(text) + t.n - 1) / t.n }

func (t bytesTokenizer) outputToken(i int) string { return t.output[i%len(t.output)] }

// fillerWords make up the generated text of the bytes tokenizers: for n
// bytes a token, output token i is a space and word i (modulo the list) of
// n-1 letters, fillerWords[n-1]. The lists of 4 bytes a token, the
// default, give the text the simulator has always generated.
var fillerWords = [MaxBytesPerToken][]string{
	1: strings.Fields(`a o i e u y s t n r`),
	2: strings.Fields(`of to in it is be as at so we he by or on do if me my up an go no us am`),
	3: strings.Fields(`the sim has one way for you and its bit but not
any new fun yet you may ask all the old law and get its end`),
	4: strings.Fields(`that with have this will your from they know want been good much some
time very when come here just like long make many more only over such take than them well were`),
	5: strings.Fields(`about other which their there would these could first water after where
right think three place sound great again still every small found those never under might while`),
	6: strings.Fields(`before should little around number always father mother answer school
family letter second enough across public follow change simple during better toward moment though`),
	7: strings.Fields(`another between example picture country without thought because nothing
several against general problem morning himself already certain develop measure through present`),
}

// wordBytes is the longest run of non-space bytes that the words tokenizer
// makes one token.
const wordBytes = 8

// wordsTokenizer makes a token of a run of white space followed by a run
// of non-space bytes, that run split every wordBytes bytes: " hello" is one
// token, " internationalization" three (" internat", "ionaliza",
// "tion"). White space that no non-space byte follows, at the end of a
// text, is a token of its own; white space at the start of a text belongs
// to the first word, as anywhere else. Bytes are bytes: a multi-byte UTF-8
// character is as many bytes of a word, and only ASCII white space
// separates words. English prose comes out at about 5 bytes a token (its
// punctuation sticks to the words), random words of 2 to 9 letters at 5.7.
type wordsTokenizer struct{}

// asciiSpace marks the bytes that separate words.
var asciiSpace = [256]bool{' ': true, '\t': true, '\n': true, '\v': true, '\f': true, '\r': true}

func (wordsTokenizer) tokenEnd(text string, start int) int {
	i := start
	for i < len(text) && asciiSpace[text[i]] {
		i++
	}
	end := min(i+wordBytes, len(text))
	for j := i; j < end; j++ {
		if asciiSpace[text[j]] {
			return j
		}
	}
	return end
}

func (t wordsTokenizer) count(text string) int {
	n := 0
	for p := 0; p < len(text); p = t.tokenEnd(text, p) {
		n++
	}
	return n
}

func (wordsTokenizer) outputToken(i int) string { return answerWords[i%len(answerWords)] }

// answerWords are the generated tokens of the words tokenizer: a space and
// a word of at most wordBytes letters each, some 5 bytes a token.
var answerWords = func() []string {
	words := strings.Fields(`the server streams these filler words one token at a time until it
reaches the limit set by the request and then stops with length as its finish reason`)
	for i, w := range words {
		words[i] = " " + w
	}
	return words
}()

// outputText returns n generated tokens as one string.
func outputText(tk tokenizer, n int) string { return withOutput(tk, "", n) }

// withOutput returns text followed by n generated tokens.
func withOutput(tk tokenizer, text string, n int) string {
	var b strings.Builder
	b.Grow(len(text) + n*(len(tk.outputToken(0))+1))
	b.WriteString(text)
	for i := range n {
		b.WriteString(tk.outputToken(i))
	}
	return b.String()
}

// hashBlocks returns the chained hashes of the blocks of text that end at
// ends, the first starting at offset 0. Each hash covers the block's bytes
// and the previous hash, so a block only matches when everything before it
// matches too. The seed keeps the caches of different models (base and
// adapters) apart, as their KV differs.
//
// It is a twin of the picker's prefix.Hashes (extproc/epp/prefix/hash.go)
// on purpose, not a shared helper: the simulator plays the model server,
// whose cache the picker can only guess at, so the two must be free to
// differ (here blocks end at token boundaries of the simulated tokenizer;
// the picker cuts prompts at wire.DefaultBytesPerToken bytes a token). A
// change to one is not a reason to change the other.
func hashBlocks(seed, text string, ends []int) []uint64 {
	hashes := make([]uint64, len(ends))
	prev := xxhash.Sum64String(seed)
	d := xxhash.New()
	var buf [8]byte
	start := 0
	for i, end := range ends {
		d.Reset()
		binary.LittleEndian.PutUint64(buf[:], prev)
		_, _ = d.Write(buf[:])
		_, _ = d.WriteString(text[start:end])
		prev = d.Sum64()
		hashes[i] = prev
		start = end
	}
	return hashes
}

// seqBlocks is the KV cache footprint of one request.
type seqBlocks struct {
	// promptTokens is the number of tokens of the prompt.
	promptTokens int
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

// sequenceBlocks works out the tokens and blocks of a request that
// generates maxTokens tokens. Like vLLM it caches every full block of
// prompt and output; the KV of the last generated token is never computed
// (the sequence stops once it is sampled), so promptTokens+maxTokens-1
// tokens occupy blocks. At most limit blocks of output are hashed, which
// bounds the work for absurd max_tokens values.
//
// The blocks are those of the tokens of prompt and answer together, as a
// next turn that quotes the answer tokenizes them. Where the answer's first
// token extends the prompt's last one (a partial token of the bytes
// tokenizer; white space ending the prompt, for the words tokenizer) that
// token is part of the answer's blocks, so the prompt's full blocks are
// blockHashes(prompt) but for one that such a token would complete. The
// prompt is tokenized once, with the answer.
func sequenceBlocks(tk tokenizer, seed, prompt string, maxTokens, blockSize, limit int) seqBlocks {
	text := withOutput(tk, prompt, max(min(maxTokens, limit*blockSize+1), 1))
	ends := make([]int, 0, len(prompt)/blockSize/2+16) // of full blocks
	tokens, p := 0, 0
	left := blockSize // tokens until the block is full
	// The tokens that end within the prompt.
	for p < len(prompt) {
		end := tk.tokenEnd(text, p)
		if end > len(prompt) {
			break
		}
		p = end
		tokens++
		if left--; left == 0 {
			ends, left = append(ends, end), blockSize
		}
	}
	promptTokens := tokens
	if p < len(prompt) {
		promptTokens++ // the rest is one token of the prompt alone
	}
	n := len(ends)
	computed := promptTokens + maxTokens - 1
	full := min(computed/blockSize, n+limit)
	// The blocks that generated tokens complete. The text holds enough of
	// them: at least full*blockSize tokens in all.
	for p < len(text) && len(ends) < full {
		p = tk.tokenEnd(text, p)
		if left--; left == 0 {
			ends, left = append(ends, p), blockSize
		}
	}
	hashes := hashBlocks(seed, text, ends[:min(full, len(ends))])
	n = min(n, len(hashes))
	return seqBlocks{
		promptTokens: promptTokens,
		prompt:       hashes[:n],
		output:       hashes[n:],
		total:        max((computed+blockSize-1)/blockSize, n, 1),
	}
}
