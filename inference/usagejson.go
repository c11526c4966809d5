package inference

import (
	"bytes"
	"encoding/json"
)

// Bounds of what jsonUsage keeps.
const (
	// maxUsageValue bounds the "usage" value kept: the servers' usage
	// objects (token counts and their details) are a few hundred bytes.
	maxUsageValue = 64 << 10
	// maxUsageKey bounds a top-level key kept for comparison; "usage"
	// written with escapes is at most 30 bytes.
	maxUsageKey = 32
)

// jsonUsage follows a JSON document chunk by chunk, tracking only string
// and nesting state, and hands each top-level "usage" value to a callback.
// A non-streamed answer is not held to be parsed at its end: a long one
// (a large completion, many choices, logprobs) is metered like a short
// one, and an answer in flight costs the processor nothing but this state.
// It does not validate the document: a value that is not JSON is simply
// not usage.
type jsonUsage struct {
	depth    int
	inString bool
	escaped  bool // the previous string byte was a backslash
	// wantKey: at depth 1, the next string is a key.
	wantKey bool
	// inKey: the string being read is a top-level key, kept in key.
	inKey bool
	key   []byte
	// isUsage: the last top-level key was "usage".
	isUsage bool
	// capturing: the bytes of the top-level usage value go to value.
	capturing bool
	value     []byte
	tooLong   bool
}

// write takes the next chunk; found is called with each whole top-level
// "usage" value.
func (j *jsonUsage) write(chunk []byte, found func(value []byte)) {
	for i := 0; i < len(chunk); i++ {
		if j.inString {
			i = j.stringBytes(chunk, i)
			continue
		}
		c := chunk[i]
		if j.capturing && !(j.depth == 1 && (c == ',' || c == '}')) {
			j.keep(c)
		}
		switch c {
		case '"':
			j.inString = true
			j.inKey = j.depth == 1 && j.wantKey
			j.key = j.key[:0]
		case '{', '[':
			j.depth++
			j.wantKey = j.depth == 1 && c == '{'
		case '}', ']':
			j.depth--
			if j.depth == 0 {
				j.endValue(found)
			}
		case ':':
			if j.depth == 1 {
				j.wantKey = false
				j.capturing, j.value, j.tooLong = j.isUsage, j.value[:0], false
			}
		case ',':
			if j.depth == 1 {
				j.endValue(found)
				j.wantKey = true
			}
		}
	}
}

// stringBytes reads string bytes from chunk[i:] up to and including the
// closing quote, if it is in the chunk, and returns the index of the last
// byte read. Value strings are skipped without looking at each byte.
func (j *jsonUsage) stringBytes(chunk []byte, i int) int {
	for ; i < len(chunk); i++ {
		if !j.escaped && !j.inKey && !j.capturing {
			n := bytes.IndexAny(chunk[i:], `"\`)
			if n < 0 {
				return len(chunk) - 1
			}
			i += n
		}
		c := chunk[i]
		if j.capturing {
			j.keep(c)
		}
		switch {
		case j.escaped:
			j.escaped = false
		case c == '\\':
			j.escaped = true
		case c == '"':
			j.inString = false
			if j.inKey {
				j.inKey = false
				j.isUsage = keyIsUsage(j.key)
			}
			return i
		}
		if j.inKey && len(j.key) <= maxUsageKey {
			j.key = append(j.key, c)
		}
	}
	return len(chunk) - 1
}

// keep appends one byte of the usage value.
func (j *jsonUsage) keep(c byte) {
	if len(j.value) >= maxUsageValue {
		j.tooLong = true
		return
	}
	j.value = append(j.value, c)
}

// endValue ends a top-level member: a captured usage value is handed on.
func (j *jsonUsage) endValue(found func([]byte)) {
	if j.capturing && !j.tooLong {
		found(j.value)
	}
	j.capturing, j.isUsage = false, false
}

// keyIsUsage says whether a raw key (without its quotes) is "usage",
// escapes decoded as JSON decodes them.
func keyIsUsage(raw []byte) bool {
	if len(raw) > maxUsageKey {
		return false
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == "usage"
	}
	var k string
	quoted := append(append([]byte{'"'}, raw...), '"')
	return json.Unmarshal(quoted, &k) == nil && k == "usage"
}
