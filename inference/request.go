// Package inference is the protocol-neutral core shared by the processors
// and the Wasm plugin: it understands inference request bodies. It imports
// no gRPC or Kubernetes code so that it compiles for wasip1.
package inference

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
)

// ErrMissingModel means the body is valid JSON without a "model" string.
var ErrMissingModel = errors.New(`request body has no "model" field`)

// Request is what routing needs from an inference request body.
type Request struct {
	Model string
	// Prompt is the user-visible input flattened to text: the prompt of a
	// completion, or the system prompt and messages of a chat joined in
	// order. Routing uses it to estimate size and to find shared prefixes.
	Prompt string
	Stream bool
}

// ParseRequest reads an inference request body (OpenAI completions, chat
// completions, embeddings, responses; Anthropic messages) in one validating
// pass over the body and one over the prompt fields, building nothing else.
func ParseRequest(raw []byte) (*Request, error) {
	b, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	model, err := b.Model()
	if err != nil {
		return nil, err
	}
	return &Request{Model: model, Prompt: b.Prompt(), Stream: b.Stream()}, nil
}

// Body is a validated JSON request body with the positions of the
// top-level fields routing and guardrails read.
type Body struct {
	s scanner
}

// Parse validates raw as one JSON object. Malformed JSON (including invalid
// UTF-8) is ErrInvalidJSON with the byte offset in the message.
func Parse(raw []byte) (*Body, error) {
	s, err := scan(raw)
	if err != nil {
		return nil, err
	}
	return &Body{s: s}, nil
}

// Prompt is the request's prompt text, as ParseRequest gives it, read from
// the positions the validating pass remembered (the body is not scanned
// again).
func (b *Body) Prompt() string {
	var sb strings.Builder
	sb.Grow(b.textFieldBytes())
	b.walkTexts(textWalker{sb: &sb}, textFields[:])
	return sb.String()
}

// Model returns the non-empty "model" string or ErrMissingModel. As in
// encoding/json, the last of duplicate keys wins; unlike it, the key must
// be exactly "model" (inference APIs are case-sensitive).
func (b *Body) Model() (string, error) { return b.s.model() }

// ModelSpan is where the "model" value is in the body (with its quotes),
// for rewriting it; ok is false when the body has no model string.
func (b *Body) ModelSpan() (Span, bool) {
	sp := b.s.fields[fieldModel]
	if sp.end == 0 || b.s.b[sp.start] != '"' {
		return Span{}, false
	}
	return Span{sp.start, sp.end}, true
}

// Stream reports "stream": true.
func (b *Body) Stream() bool {
	sp := b.s.fields[fieldStream]
	if sp.end == 0 {
		return false
	}
	return truthy(b.s.b[sp.start:sp.end])
}

// truthy says whether a JSON value is true as the model servers read a
// boolean field: vLLM and SGLang declare "stream" a bool in pydantic
// models, which in lax mode also take 1 (or 1.0) and the strings "1",
// "on", "t", "true", "y" and "yes" in any case (pydantic's bool
// validation). A request one of them streams must be metered as a stream.
func truthy(raw []byte) bool {
	v := string(raw)
	switch {
	case v == "true":
		return true
	case len(v) > 0 && (v[0] == '-' || v[0] >= '0' && v[0] <= '9'):
		f, err := strconv.ParseFloat(v, 64)
		return err == nil && f == 1
	case len(v) > 1 && v[0] == '"': // validated by the scan already
		switch strings.ToLower(stringValue(raw, bytes.IndexByte(raw, '\\') >= 0)) {
		case "1", "on", "t", "true", "y", "yes":
			return true
		}
	}
	return false
}

// StreamUsageEdit returns the edit that makes a streamed request ask for
// its usage (stream_options.include_usage: true), so a token-based limit
// can charge it: OpenAI-compatible servers report usage on a stream only
// when asked. ok is false when the request does not stream or already
// asks. Other stream_options keys are kept. Only for the OpenAI chat and
// completions APIs: the caller checks the path.
func (b *Body) StreamUsageEdit() (e Edit, ok bool) {
	if !b.Stream() {
		return Edit{}, false
	}
	sp := b.s.fields[fieldStreamOptions]
	if sp.end == 0 {
		// Insert first in the object: the opening brace is the first
		// byte that is not white space.
		at := 0
		for at < len(b.s.b) && b.s.b[at] != '{' {
			at++
		}
		return Edit{Span: Span{at + 1, at + 1}, JSON: []byte(`"stream_options":{"include_usage":true},`)}, true
	}
	opts := map[string]json.RawMessage{}
	if json.Unmarshal(b.s.b[sp.start:sp.end], &opts) != nil || opts == nil {
		opts = map[string]json.RawMessage{} // null or not an object: replaced
	}
	if string(opts["include_usage"]) == "true" {
		return Edit{}, false
	}
	opts["include_usage"] = json.RawMessage("true")
	out, err := json.Marshal(opts)
	if err != nil {
		return Edit{}, false
	}
	return Edit{Span: Span{sp.start, sp.end}, JSON: out}, true
}

// HasChatTemplate reports a top-level "chat_template": vLLM and SGLang
// let a request replace the server's prompt template with its own, which
// decides how every message (and the system prompt) reaches the model.
func (b *Body) HasChatTemplate() bool { return b.s.fields[fieldChatTemplate].end > 0 }

// RepeatedKey returns the first top-level key among those that route or
// carry the prompt (model, stream, stream_options, prompt, messages,
// system, input, instructions) that occurs more than once, or "". JSON
// parsers differ on which copy wins: a guardrail that read one copy must
// not forward a body whose server reads the other.
func (b *Body) RepeatedKey() string {
	for _, f := range []int{fieldModel, fieldStream, fieldStreamOptions, fieldPrompt, fieldMessages, fieldSystem, fieldInput, fieldInstructions,
		fieldTools, fieldSuffix, fieldChatTemplate} {
		if b.s.repeated&(1<<f) != 0 {
			return fieldNames[f]
		}
	}
	return ""
}

// MaxTokensField is one output-token cap of the request as written.
type MaxTokensField struct {
	// Name is max_tokens, max_completion_tokens or max_output_tokens.
	Name string
	// Span covers the value.
	Span
	// JSON is the value as written.
	JSON []byte
	// Repeated is true when the key occurs more than once in the body:
	// servers differ on which copy they honour.
	Repeated bool
}

// maxTokensFields are the caps the request APIs read: max_tokens
// (completions, chat, Anthropic messages), max_completion_tokens (chat)
// and max_output_tokens (responses).
var maxTokensFields = [...]int{fieldMaxTokens, fieldMaxCompletionTokens, fieldMaxOutputTokens}

// MaxTokensFields returns every output-token cap field present, in the
// order above. All of them count: a server honours whichever its API
// reads (chat reads max_completion_tokens before max_tokens), so a
// ceiling checked on one field alone is passed through another.
func (b *Body) MaxTokensFields() []MaxTokensField {
	var out []MaxTokensField
	for _, f := range maxTokensFields {
		s := b.s.fields[f]
		if s.end == 0 {
			continue
		}
		out = append(out, MaxTokensField{Name: fieldNames[f], Span: Span{s.start, s.end}, JSON: b.s.b[s.start:s.end],
			Repeated: b.s.repeated&(1<<f) != 0})
	}
	return out
}

// Count reads the cap as a number of tokens. ok is false unless the value
// is a JSON integer written without sign, fraction or exponent: servers
// coerce 2000.0, 2e3 and "2000" to 2000, so a ceiling that let those by
// unread could be passed. An integer too large for int64 counts as
// math.MaxInt64, over any ceiling.
func (f MaxTokensField) Count() (n int64, ok bool) {
	if len(f.JSON) == 0 {
		return 0, false
	}
	for _, c := range f.JSON {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(f.JSON), 10, 64)
	if err != nil { // only a range error is left: the digits are valid
		return math.MaxInt64, true
	}
	return n, true
}

// Span is a byte range [Start, End) of the body.
type Span struct{ Start, End int }

// Text is one text string of the request: a prompt, a system prompt or
// instructions, an input, or the content of a message or a text part.
type Text struct {
	// Span covers the JSON string including its quotes.
	Span
	quoted  []byte
	escaped bool
}

// Value decodes the string.
func (t Text) Value() string { return stringValue(t.quoted, t.escaped) }

// Len is the length of the decoded string, found without a copy unless
// the string has escapes.
func (t Text) Len() int {
	if !t.escaped {
		return len(t.quoted) - 2
	}
	return len(stringValue(t.quoted, true))
}

// appendTo writes the decoded string to sb, without an intermediate
// string when it has no escapes (the routing hot path: prompt extraction).
func (t Text) appendTo(sb *strings.Builder) {
	if t.escaped {
		sb.WriteString(stringValue(t.quoted, true))
		return
	}
	sb.Write(t.quoted[1 : len(t.quoted)-1])
}

// textFields are read in prompt order: what the model sees first comes first.
var textFields = [...]int{fieldSystem, fieldInstructions, fieldPrompt, fieldInput, fieldMessages}

// guardFields are the top-level fields the guardrails read: textFields,
// plus the tool definitions a chat template renders into the prompt and a
// completion's suffix.
var guardFields = [...]int{fieldSystem, fieldInstructions, fieldTools, fieldPrompt, fieldSuffix, fieldInput, fieldMessages}

func (b *Body) textFieldBytes() int {
	n := 0
	for _, f := range textFields {
		n += b.s.fields[f].end - b.s.fields[f].start
	}
	return n
}

// Texts calls fn for each string the model reads, for the guardrails, in
// prompt order (system prompt and instructions, tool definitions, prompt
// and suffix, input, messages) until fn returns false. Inside those fields
// it visits strings, the strings in arrays, and in objects, at any depth:
//   - the values of the guardTextKey keys (text, content, name,
//     description, thinking, output, Anthropic document title and
//     context, JSON schema title, enum, const, examples and default);
//   - every string under "arguments" and "input" (tool calls and their
//     inputs are free-form JSON the model reads whole);
//   - "data" when its object has "type":"text" (an Anthropic document
//     source of plain text), whatever the key order; a data string that
//     comes before its type is visited when its object ends.
//
// Roles, types, ids, URLs and base64 data (images, PDFs, audio) are left
// alone: masking a base64 run that looks like a phone number would
// corrupt the file.
func (b *Body) Texts(fn func(Text) bool) {
	b.walkTexts(textWalker{fn: fn, guard: true}, guardFields[:])
}

// walkTexts runs w over fields in prompt order.
func (b *Body) walkTexts(w textWalker, fields []int) {
	for _, f := range fields {
		sp := b.s.fields[f]
		if sp.end == 0 {
			continue
		}
		w.b, w.i = b.s.b[:sp.end], sp.start
		w.value(true)
		if w.stop {
			return
		}
	}
}

// textWalker visits the text of an already validated JSON value, calling
// fn for each text or, on the routing hot path, appending it to sb (no
// closure and no string per text).
type textWalker struct {
	b    []byte
	i    int
	fn   func(Text) bool
	sb   *strings.Builder
	stop bool
	// guard widens what is read (Texts): an object's keys are weighed
	// at every depth, not only under text and content.
	guard bool
	// all: inside a guardTreeKey value, every string is read.
	all bool
	// data holds where the "data" strings are that came before their
	// object's "type" "text" could be known, beyond the first of each
	// object (kept by value): each is visited when its object ends if a
	// type was "text". Looking ahead from each data key instead would
	// scan the rest of the object once per enclosing object that has one,
	// up to maxDepth times over; this keeps the walk linear. It stays
	// empty (no allocation) unless an object repeats the data key.
	data []int
}

// guardTextKey: the key's string values, and the strings in its arrays,
// are text a model reads. title and context: an Anthropic document's
// title and context, and a JSON schema's title. enum, const, examples and
// default: chat templates render tool parameter schemas whole, so these
// schema values reach the model as the descriptions do (read here rather
// than passed as not text: a guardrail must see what the model sees).
func guardTextKey(k []byte, escaped bool) bool {
	for _, name := range [...]string{"text", "content", "name", "description", "thinking", "output",
		"title", "context", "enum", "const", "examples", "default"} {
		if keyIs(k, escaped, name) {
			return true
		}
	}
	return false
}

// guardTreeKey: the key holds free-form JSON whose every string the
// model reads (tool call arguments, Anthropic tool_use input).
func guardTreeKey(k []byte, escaped bool) bool {
	return keyIs(k, escaped, "arguments") || keyIs(k, escaped, "input")
}

func (w *textWalker) space() {
	for w.i < len(w.b) && (w.b[w.i] == ' ' || w.b[w.i] == '\t' || w.b[w.i] == '\n' || w.b[w.i] == '\r') {
		w.i++
	}
}

// str moves past a string and returns its raw quoted form and whether it
// has escapes.
func (w *textWalker) str() ([]byte, bool) {
	start := w.i
	w.i++
	escaped := false
	for w.i < len(w.b) {
		for w.i < len(w.b) && plain[w.b[w.i]] {
			w.i++
		}
		if w.i >= len(w.b) {
			break
		}
		switch w.b[w.i] {
		case '\\':
			escaped = true
			w.i += 2
			continue
		case '"':
			w.i++
			return w.b[start:w.i], escaped
		}
		w.i++
	}
	return w.b[start:], escaped
}

// visitAt visits the string at start (guard mode), unless stopped.
func (w *textWalker) visitAt(start int) {
	if w.stop {
		return
	}
	t := textWalker{b: w.b, i: start}
	q, escaped := t.str()
	if !w.fn(Text{Span: Span{start, t.i}, quoted: q, escaped: escaped}) {
		w.stop = true
	}
}

// value walks the value at w.i; collect says whether its strings are text.
func (w *textWalker) value(collect bool) {
	w.space()
	if w.i >= len(w.b) || w.stop {
		return
	}
	switch w.b[w.i] {
	case '"':
		w.text(collect)
	case '[':
		w.array(collect)
	case '{':
		w.object(collect)
	default: // number or literal: skip to the next delimiter
		for w.i < len(w.b) && !strings.ContainsRune(",]} \t\n\r", rune(w.b[w.i])) {
			w.i++
		}
	}
}

// text walks the string at w.i, collecting or visiting it if collect.
func (w *textWalker) text(collect bool) {
	start := w.i
	q, escaped := w.str()
	switch t := (Text{Span: Span{start, w.i}, quoted: q, escaped: escaped}); {
	case !collect:
	case w.sb != nil:
		t.appendTo(w.sb)
	case !w.fn(t):
		w.stop = true
	}
}

// array walks the array at w.i.
func (w *textWalker) array(collect bool) {
	w.i++
	for !w.stop {
		w.space()
		if w.i >= len(w.b) || w.b[w.i] == ']' {
			w.i++
			return
		}
		w.value(collect)
		w.space()
		if w.i < len(w.b) && w.b[w.i] == ',' {
			w.i++
		}
	}
}

// object walks the object at w.i.
func (w *textWalker) object(collect bool) {
	w.i++
	// isText: a "type" key of this object has the value "text";
	// first, and w.data from more: where this object's data strings
	// that wait for the end of it start.
	isText, first, more := false, -1, len(w.data)
	for !w.stop {
		w.space()
		if w.i >= len(w.b) || w.b[w.i] == '}' {
			w.i++
			if isText && first >= 0 {
				w.visitAt(first)
				for _, at := range w.data[more:] {
					w.visitAt(at)
				}
			}
			w.data = w.data[:more]
			return
		}
		k, escaped := w.str()
		w.space()
		w.i++ // ':'
		switch {
		case !w.guard:
			w.value(collect && (keyIs(k, escaped, "text") || keyIs(k, escaped, "content")))
		case w.all:
			w.value(true)
		case guardTreeKey(k, escaped):
			w.all = true
			w.value(true)
			w.all = false
		case keyIs(k, escaped, "type"):
			w.space()
			if w.i < len(w.b) && w.b[w.i] == '"' {
				// Any type "text" counts: servers differ on which of
				// repeated keys wins, and reading too much is safe.
				q, qe := w.str()
				isText = isText || keyIs(q, qe, "text")
			} else {
				w.value(false)
			}
		case keyIs(k, escaped, "data"):
			w.space()
			if isText || w.i >= len(w.b) || w.b[w.i] != '"' {
				w.value(isText)
				break
			}
			if first < 0 {
				first = w.i
			} else {
				w.data = append(w.data, w.i)
			}
			w.str()
		default:
			// Objects are weighed key by key at every depth, whatever
			// holds them: a tool's description sits under function,
			// a tool call's arguments under tool_calls[].function.
			w.value(guardTextKey(k, escaped))
		}
		w.space()
		if w.i < len(w.b) && w.b[w.i] == ',' {
			w.i++
		}
	}
	w.data = w.data[:more]
}

// Edit replaces a span of the body with raw JSON.
type Edit struct {
	Span
	JSON []byte
}

// Rewrite returns a copy of the body with the edits applied. Edits must not
// overlap; they may come in any order.
func (b *Body) Rewrite(edits []Edit) []byte {
	sortEdits(edits)
	raw := b.s.b
	n := len(raw)
	for _, e := range edits {
		n += len(e.JSON) - (e.End - e.Start)
	}
	out := make([]byte, 0, n)
	at := 0
	for _, e := range edits {
		out = append(out, raw[at:e.Start]...)
		out = append(out, e.JSON...)
		at = e.End
	}
	return append(out, raw[at:]...)
}

// sortEdits is an insertion sort: edits come almost in order (prompt order
// differs from body order only across fields).
func sortEdits(e []Edit) {
	for i := 1; i < len(e); i++ {
		for j := i; j > 0 && e[j].Start < e[j-1].Start; j-- {
			e[j], e[j-1] = e[j-1], e[j]
		}
	}
}

// AppendQuoted appends s as a JSON string. It escapes what RFC 8259
// requires plus U+2028/U+2029 (as encoding/json does, for script safety);
// s must be valid UTF-8 (decoded JSON strings are).
func AppendQuoted(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < 0x80 {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		// U+2028 and U+2029 are E2 80 A8 / E2 80 A9.
		if c == 0xE2 && i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xA8 || s[i+2] == 0xA9) {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[s[i+2]&0xF])
			i += 3
			start = i
			continue
		}
		i++
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
