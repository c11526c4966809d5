package inference

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrInvalidJSON means the body is not valid JSON (RFC 8259, UTF-8).
var ErrInvalidJSON = errors.New("request body is not valid JSON")

// maxDepth bounds nesting so a hostile body cannot exhaust the stack.
const maxDepth = 512

// scanner validates JSON and remembers where the values of the top-level
// fields routing reads are (the last occurrence of a key wins, as in
// encoding/json).
type scanner struct {
	b      []byte
	i      int
	err    error
	fields [numFields]span
	// repeated has bit f set when field f's key occurs more than once:
	// servers differ on which copy wins, so a guardrail must not trust
	// the one it read.
	repeated uint16
	// python: also accept the tokens Python's json module reads beyond
	// RFC 8259 (NaN, Infinity, -Infinity), for a document a server decodes
	// with it (tool-call arguments).
	python bool
}

// span is a value's byte range in the body; end == 0 means absent.
type span struct{ start, end int }

// The top-level fields routing reads.
const (
	fieldModel = iota
	fieldStream
	fieldPrompt
	fieldMessages
	fieldSystem
	fieldInput
	fieldInstructions
	fieldMaxTokens
	fieldMaxCompletionTokens
	fieldMaxOutputTokens
	fieldStreamOptions
	fieldChatTemplate
	fieldTools
	fieldSuffix
	fieldDocuments
	fieldChatTemplateKwargs
	numFields
)

// scanner.repeated holds one bit per field; this fails to compile if
// the fields outgrow it.
const _ = uint16(1 << (numFields - 1))

var fieldNames = [numFields]string{"model", "stream", "prompt", "messages", "system", "input",
	"instructions", "max_tokens", "max_completion_tokens", "max_output_tokens", "stream_options", "chat_template", "tools", "suffix",
	"documents", "chat_template_kwargs"}

// scan validates body as one JSON object and records its fields' spans.
func scan(body []byte) (scanner, error) {
	s := scanner{b: body}
	s.space()
	if s.peek() != '{' {
		if s.fail() == nil {
			return s, fmt.Errorf("%w: want a JSON object", ErrInvalidJSON)
		}
		return s, s.err
	}
	s.value(0)
	s.space()
	if s.err == nil && s.i != len(s.b) {
		s.errorf("data after the top-level value")
	}
	return s, s.err
}

// model returns the model field if it is a non-empty string.
func (s *scanner) model() (string, error) {
	sp := s.fields[fieldModel]
	if sp.end == 0 || s.b[sp.start] != '"' {
		return "", ErrMissingModel
	}
	m := stringValue(s.b[sp.start:sp.end], bytes.IndexByte(s.b[sp.start:sp.end], '\\') >= 0)
	if m == "" {
		return "", ErrMissingModel
	}
	return m, nil
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) errorf(format string, args ...any) {
	if s.err == nil {
		s.err = fmt.Errorf("%w: %s at byte %d", ErrInvalidJSON, fmt.Sprintf(format, args...), s.i)
	}
}

func (s *scanner) fail() error {
	if s.i >= len(s.b) {
		s.errorf("unexpected end")
	}
	return s.err
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) value(depth int) {
	if depth > maxDepth {
		s.errorf("nested deeper than %d", maxDepth)
		return
	}
	switch c := s.peek(); {
	case c == '{':
		s.object(depth)
	case c == '[':
		s.array(depth)
	case c == '"':
		s.str()
	case c == 't':
		s.literal("true")
	case c == 'f':
		s.literal("false")
	case c == 'n':
		s.literal("null")
	case s.python && c == 'N':
		s.literal("NaN")
	case s.python && c == 'I':
		s.literal("Infinity")
	case s.python && c == '-' && s.i+1 < len(s.b) && s.b[s.i+1] == 'I':
		s.literal("-Infinity")
	case c == '-' || (c >= '0' && c <= '9'):
		s.number()
	default:
		if s.fail() == nil {
			s.errorf("unexpected %q", c)
		}
	}
}

func (s *scanner) object(depth int) {
	s.i++ // {
	s.space()
	if s.peek() == '}' {
		s.i++
		return
	}
	for s.err == nil {
		s.space()
		if s.peek() != '"' {
			if s.fail() == nil {
				s.errorf("want an object key")
			}
			return
		}
		kStart := s.i
		kEscaped := s.str()
		kEnd := s.i
		if s.err != nil {
			return
		}
		s.space()
		if s.peek() != ':' {
			if s.fail() == nil {
				s.errorf("want ':'")
			}
			return
		}
		s.i++
		s.space()
		vStart := s.i
		s.value(depth + 1)
		if depth == 0 && s.err == nil {
			for f, name := range fieldNames {
				if keyIs(s.b[kStart:kEnd], kEscaped, name) {
					if s.fields[f].end != 0 {
						s.repeated |= 1 << f
					}
					s.fields[f] = span{vStart, s.i}
					break
				}
			}
		}
		s.space()
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return
		default:
			if s.fail() == nil {
				s.errorf("want ',' or '}'")
			}
			return
		}
	}
}

func (s *scanner) array(depth int) {
	s.i++ // [
	s.space()
	if s.peek() == ']' {
		s.i++
		return
	}
	for s.err == nil {
		s.space()
		s.value(depth + 1)
		s.space()
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return
		default:
			if s.fail() == nil {
				s.errorf("want ',' or ']'")
			}
			return
		}
	}
}

// plain marks bytes that may appear in a string as they are: printable
// ASCII other than '"' and '\'. The loop over them is the hot path.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str moves past a string and reports whether it had escapes.
func (s *scanner) str() (escaped bool) {
	s.i++ // opening quote
	b := s.b
	for {
		i := s.i
		for i < len(b) && plain[b[i]] {
			i++
		}
		s.i = i
		if i >= len(b) {
			s.errorf("unterminated string")
			return escaped
		}
		switch c := b[i]; {
		case c == '"':
			s.i++
			return escaped
		case c == '\\':
			escaped = true
			s.escape()
			if s.err != nil {
				return escaped
			}
		case c < 0x20:
			s.errorf("control character in string")
			return escaped
		default: // non-ASCII: must be valid UTF-8
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n <= 1 {
				s.errorf("invalid UTF-8")
				return escaped
			}
			s.i += n
		}
	}
}

func (s *scanner) escape() {
	s.i++ // backslash
	switch s.peek() {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		s.i++
	case 'u':
		if s.i+5 > len(s.b) {
			s.errorf("short \\u escape")
			return
		}
		for _, h := range s.b[s.i+1 : s.i+5] {
			if !isHex(h) {
				s.errorf("bad \\u escape")
				return
			}
		}
		s.i += 5
	default:
		s.errorf("bad escape")
	}
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func (s *scanner) literal(word string) {
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		s.errorf("bad literal")
		return
	}
	s.i += len(word)
}

// number follows RFC 8259: -? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?
func (s *scanner) number() {
	if s.peek() == '-' {
		s.i++
	}
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		s.errorf("bad number")
		return
	}
	if s.peek() == '.' {
		s.i++
		if !s.digits() {
			s.errorf("bad fraction")
			return
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if !s.digits() {
			s.errorf("bad exponent")
		}
	}
}

func (s *scanner) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}

// keyIs compares a quoted key with name, decoding escapes only if present.
func keyIs(quoted []byte, escaped bool, name string) bool {
	if !escaped {
		return len(quoted) == len(name)+2 && string(quoted[1:len(quoted)-1]) == name
	}
	return stringValue(quoted, true) == name
}

// stringValue decodes a validated quoted string.
func stringValue(quoted []byte, escaped bool) string {
	inner := quoted[1 : len(quoted)-1]
	if !escaped {
		return string(inner)
	}
	var sb strings.Builder
	sb.Grow(len(inner)) // decoding never lengthens a string
	writeUnescaped(&sb, inner)
	return sb.String()
}

// bytesValue is stringValue as bytes, for a value only read (a decoded
// document), without the copy a conversion of the string would make.
func bytesValue(quoted []byte, escaped bool) []byte {
	inner := quoted[1 : len(quoted)-1]
	if !escaped {
		return inner
	}
	b := bytes.NewBuffer(make([]byte, 0, len(inner)))
	writeUnescaped(b, inner)
	return b.Bytes()
}

// unescapeWriter is what writeUnescaped writes to.
type unescapeWriter interface {
	Write([]byte) (int, error)
	WriteByte(byte) error
	WriteRune(rune) (int, error)
}

// writeUnescaped writes the decoded form of the inside of a validated
// string to sb: runs without escapes are copied as they are.
func writeUnescaped[W unescapeWriter](sb W, inner []byte) {
	for len(inner) > 0 {
		i := bytes.IndexByte(inner, '\\')
		if i < 0 {
			sb.Write(inner)
			return
		}
		sb.Write(inner[:i])
		r, n := unescape(inner[i:])
		if r < utf8.RuneSelf {
			sb.WriteByte(byte(r))
		} else {
			sb.WriteRune(r)
		}
		inner = inner[i+n:]
	}
}

// unescapedLen is the length of the decoded form of the inside of a
// validated string, found without building it.
func unescapedLen(inner []byte) int {
	n := 0
	for len(inner) > 0 {
		i := bytes.IndexByte(inner, '\\')
		if i < 0 {
			return n + len(inner)
		}
		r, k := unescape(inner[i:])
		n += i + utf8.RuneLen(r)
		inner = inner[i+k:]
	}
	return n
}

// unescape decodes the validated escape that starts e (at its backslash):
// the character it stands for and the bytes it takes. A \u escape of a
// surrogate pair takes both halves; a lone surrogate stands for U+FFFD, as
// encoding/json decodes it.
func unescape(e []byte) (rune, int) {
	switch e[1] {
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r, n := hex4(e[2:6]), 6
		if r >= 0xD800 && r < 0xDC00 && len(e) >= 12 && e[6] == '\\' && e[7] == 'u' {
			if lo := hex4(e[8:12]); lo >= 0xDC00 && lo < 0xE000 {
				r, n = (r-0xD800)<<10+(lo-0xDC00)+0x10000, 12
			}
		}
		if r >= 0xD800 && r < 0xE000 {
			r = utf8.RuneError
		}
		return r, n
	}
	return rune(e[1]), 2 // '"', '\\', '/'
}

func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}
