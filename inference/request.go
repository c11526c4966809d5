// Package inference is the protocol-neutral core shared by the processors
// and the Wasm plugin: it understands inference request bodies. It imports
// no gRPC or Kubernetes code so that it compiles for wasip1.
package inference

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
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
	fields := textFields[:]
	if b.s.fields[fieldMessages].end > 0 {
		// A chat request: the chat API has no instructions field (the
		// responses API, which reads it, takes input), so the server
		// ignores one and it reaches no model.
		fields = chatTextFields[:]
	}
	b.walkTexts(textWalker{sb: &sb}, fields)
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

// HasChatTemplate reports a top-level "chat_template", or one in
// "chat_template_kwargs": vLLM and SGLang let a request replace the
// server's prompt template with its own, which decides how every message
// (and the system prompt) reaches the model, and the template kwargs are
// passed to the template renderer, whose own chat_template argument is
// the same override.
func (b *Body) HasChatTemplate() bool {
	if b.s.fields[fieldChatTemplate].end > 0 {
		return true
	}
	sp := b.s.fields[fieldChatTemplateKwargs]
	return sp.end > 0 && hasKey(b.s.b[:sp.end], sp.start, "chat_template")
}

// hasKey reports whether the validated value at start of b is an object
// with the key name (at its own level).
func hasKey(b []byte, start int, name string) bool {
	w := textWalker{b: b, i: start}
	if w.b[w.i] != '{' {
		return false
	}
	w.i++
	for {
		w.space()
		if w.i >= len(w.b) || w.b[w.i] == '}' {
			return false
		}
		k, escaped := w.str()
		if keyIs(k, escaped, name) {
			return true
		}
		w.space()
		w.i++ // ':'
		w.value(false)
		w.space()
		if w.i < len(w.b) && w.b[w.i] == ',' {
			w.i++
		}
	}
}

// RepeatedKey returns the first top-level key among those that route or
// carry text the guardrails read (model, stream, stream_options, prompt,
// messages, system, input, instructions, tools, suffix, chat_template,
// documents, chat_template_kwargs) that occurs more than once, or "". JSON
// parsers differ on which copy wins: a guardrail that read one copy must
// not forward a body whose server reads the other.
func (b *Body) RepeatedKey() string {
	for _, f := range []int{fieldModel, fieldStream, fieldStreamOptions, fieldPrompt, fieldMessages, fieldSystem, fieldInput, fieldInstructions,
		fieldTools, fieldSuffix, fieldChatTemplate, fieldDocuments, fieldChatTemplateKwargs} {
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
// instructions, an input, the content of a message or a text part, an
// object key or a number of a tree the model reads whole (a number as
// Python prints it), or a string, key or number of a JSON document encoded
// in a string (tool-call arguments).
type Text struct {
	// Span covers the JSON string including its quotes; for a text of an
	// encoded document, the string of the body that holds the document.
	Span
	quoted  []byte
	escaped bool
	// bare: quoted is a number token, unquoted; printed is the number as
	// a server prints it when that differs from the token (see
	// printedNumber).
	bare    bool
	printed []byte
	// tree: the text is a string, key or number of a tree read whole
	// (see Tree).
	tree bool
	// doc is the decoded document that holds quoted at at, for a text of
	// an encoded document; nil otherwise.
	doc []byte
	at  int
	// role: a message's role (see Role).
	role bool
}

// Role reports a message's role string. Templates print it as a header
// between messages, so it is read on its own rather than as part of the
// prose around it: a phrase split over two messages must not read as
// broken by the second one's role.
func (t Text) Role() bool { return t.role }

// Tree reports a text of a tree read whole (tool definitions, tool-call
// arguments and inputs, template kwargs, documents): a template prints
// such a tree with tojson, so two of its texts stand apart by JSON's
// quotes and commas, not as two parts of one prose.
func (t Text) Tree() bool { return t.tree }

// number is the token of a bare text as the model reads it.
func (t Text) number() []byte {
	if t.printed != nil {
		return t.printed
	}
	return t.quoted
}

// Value decodes the string.
func (t Text) Value() string {
	if t.bare {
		return string(t.number())
	}
	return stringValue(t.quoted, t.escaped)
}

// Is reports whether the decoded string is s, found without a copy
// unless the string has escapes.
func (t Text) Is(s string) bool {
	if t.bare {
		return string(t.number()) == s
	}
	return keyIs(t.quoted, t.escaped, s)
}

// Len is the length of the decoded string, found without a copy.
func (t Text) Len() int {
	n, _ := t.Head()
	return n
}

// Head returns the length of the decoded string and its first byte (0
// when it is empty), found without a copy: what a join of the texts needs
// to place one without decoding it.
func (t Text) Head() (n int, first byte) {
	if t.bare {
		n := t.number()
		return len(n), n[0]
	}
	inner := t.quoted[1 : len(t.quoted)-1]
	if len(inner) == 0 {
		return 0, 0
	}
	if !t.escaped {
		return len(inner), inner[0]
	}
	n = unescapedLen(inner)
	if inner[0] != '\\' {
		return n, inner[0]
	}
	var b [utf8.UTFMax]byte
	r, _ := unescape(inner)
	utf8.EncodeRune(b[:], r)
	return n, b[0]
}

// WriteValue writes the decoded string to sb without a string of its own:
// a string without escapes is copied as it is. The guardrails join the
// texts with it, and the routing walk builds the prompt.
func (t Text) WriteValue(sb *strings.Builder) {
	switch {
	case t.bare:
		sb.Write(t.number())
	case t.escaped:
		writeUnescaped(sb, t.quoted[1:len(t.quoted)-1])
	default:
		sb.Write(t.quoted[1 : len(t.quoted)-1])
	}
}

// walkField is a top-level field a walk reads; tree: every string and
// object key in it, at any depth, is text.
type walkField struct {
	f    int
	tree bool
}

// textFields are read in prompt order: what the model sees first comes
// first. chatTextFields: the same for a chat request (see Prompt).
var (
	textFields     = [...]walkField{{f: fieldSystem}, {f: fieldInstructions}, {f: fieldPrompt}, {f: fieldInput}, {f: fieldMessages}}
	chatTextFields = [...]walkField{{f: fieldSystem}, {f: fieldPrompt}, {f: fieldInput}, {f: fieldMessages}}
)

// guardFields are the top-level fields the guardrails read: textFields,
// plus what a chat template renders into the prompt whole (trees): the
// tool definitions (tool | tojson prints every key and string), the
// template variables of chat_template_kwargs (every value at any depth is
// one) and the RAG documents of vLLM and SGLang; and a completion's
// suffix.
var guardFields = [...]walkField{{f: fieldSystem}, {f: fieldInstructions}, {f: fieldTools, tree: true},
	{f: fieldChatTemplateKwargs, tree: true}, {f: fieldDocuments, tree: true},
	{f: fieldPrompt}, {f: fieldSuffix}, {f: fieldInput}, {f: fieldMessages}}

func (b *Body) textFieldBytes() int {
	n := 0
	for _, f := range textFields {
		n += b.s.fields[f.f].end - b.s.fields[f.f].start
	}
	return n
}

// TextBound bounds the bytes of the texts Texts visits, decoded, plus one
// byte per text: the size of the fields they come from (a string is at
// least its two quotes longer than its value, an encoded document no
// longer than the string holding it).
func (b *Body) TextBound() int {
	n := 0
	for _, f := range guardFields {
		n += b.s.fields[f.f].end - b.s.fields[f.f].start
	}
	return n
}

// Texts calls fn for each string the model reads, for the guardrails, in
// prompt order (system prompt and instructions, tool definitions,
// template kwargs and documents, prompt and suffix, input, messages)
// until fn returns false. Inside those fields it visits strings, the
// strings in arrays, and in objects, at any depth:
//   - the values of the guardTextKey keys (text, content, name, role,
//     description, thinking, reasoning, reasoning_content, refusal,
//     output, Anthropic document title and context, JSON schema title,
//     enum, const, examples and default);
//   - every string, object key and number of a tree the model reads
//     whole: the tools, chat_template_kwargs and documents fields, and
//     the values of "arguments" and "input" (tool calls and their
//     inputs); a number as Python prints the value (see printedNumber);
//   - for an "arguments" string that holds a JSON object, array or string
//     (servers decode tool-call arguments with Python's json before the
//     template prints them), the strings, keys and numbers of that
//     document as decoded, in place of the string itself: "\u002d" inside
//     must read as "-";
//   - "data" when its object has "type":"text" (an Anthropic document
//     source of plain text), whatever the key order; a data string that
//     comes before its type is visited when its object ends.
//
// Types, ids, URLs and base64 data (images, PDFs, audio) are left alone
// outside the trees: masking a base64 run that looks like a phone number
// would corrupt the file.
func (b *Body) Texts(fn func(Text) bool) {
	b.walkTexts(textWalker{fn: fn, guard: true}, guardFields[:])
}

// walkTexts runs w over fields in prompt order.
func (b *Body) walkTexts(w textWalker, fields []walkField) {
	for _, f := range fields {
		sp := b.s.fields[f.f]
		if sp.end == 0 {
			continue
		}
		w.b, w.i, w.all = b.s.b[:sp.end], sp.start, f.tree
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
	// empty (no allocation) unless an object repeats the data key. The
	// routing walk keeps here the "text" strings that came before their
	// object's type, alike.
	data []int
	// outer is set while the walk is inside an encoded document (b is
	// the document): the body string that holds it.
	outer *Span
	// emitted: a text was handed on.
	emitted bool
}

// guardTextKey: the key's string values, and the strings in its arrays,
// are text a model reads. title and context: an Anthropic document's
// title and context, and a JSON schema's title. enum, const, examples and
// default: chat templates render tool parameter schemas whole, so these
// schema values reach the model as the descriptions do (read here rather
// than passed as not text: a guardrail must see what the model sees).
// (A role is read too, on its own: see Text.Role.) reasoning, reasoning_content and
// refusal: an earlier assistant turn's reasoning and refusal, which
// templates print back (as messages' fields or content parts of those
// types).
func guardTextKey(k []byte, escaped bool) bool {
	for _, name := range [...]string{"text", "content", "name", "description", "thinking", "output",
		"title", "context", "enum", "const", "examples", "default", "reasoning", "reasoning_content", "refusal"} {
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
// has escapes. The string is validated already, so its end is the first
// quote not escaped, found with IndexByte rather than byte by byte.
func (w *textWalker) str() ([]byte, bool) {
	start := w.i
	i := start + 1
	escaped := false
	for {
		q := bytes.IndexByte(w.b[i:], '"')
		if q < 0 {
			w.i = len(w.b)
			return w.b[start:], escaped || bytes.IndexByte(w.b[i:], '\\') >= 0
		}
		end := i + q
		if !escaped {
			escaped = bytes.IndexByte(w.b[i:end], '\\') >= 0
		}
		// The quote is escaped when an odd run of backslashes ends
		// before it.
		bs := 0
		for k := end - 1; k > start && w.b[k] == '\\'; k-- {
			bs++
		}
		if bs%2 == 0 {
			w.i = end + 1
			return w.b[start:w.i], escaped
		}
		i = end + 1
	}
}

// visitAt visits (or, routing, appends) the string at start, unless
// stopped.
func (w *textWalker) visitAt(start int) {
	if w.stop {
		return
	}
	t := textWalker{b: w.b, i: start}
	q, escaped := t.str()
	w.emit(Text{Span: Span{start, t.i}, quoted: q, escaped: escaped})
}

// emit hands one text on: appended to sb (routing) or given to fn. Inside
// an encoded document the text is placed in the body string holding it.
func (w *textWalker) emit(t Text) {
	w.emitted = true
	switch {
	case w.sb != nil:
		t.WriteValue(w.sb)
		return
	case w.outer != nil:
		t.doc, t.at, t.Span = w.b, t.Start, *w.outer
	}
	t.tree = w.all
	if !w.fn(t) {
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
		start := w.i
		for w.i < len(w.b) && !strings.ContainsRune(",]} \t\n\r", rune(w.b[w.i])) {
			w.i++
		}
		// In a tree the model reads the numbers as the template printed
		// them: "[4111111111111111]" holds a card, and so does
		// 4.111111111111111e15, printed 4111111111111111.0.
		if collect && w.all && isNumber(w.b[start:w.i]) {
			tok := w.b[start:w.i]
			w.emit(Text{Span: Span{start, w.i}, quoted: tok, bare: true, printed: printedNumber(tok)})
		}
	}
}

// isNumber: a number token (not NaN or -Infinity, which hide no digits).
func isNumber(tok []byte) bool {
	return len(tok) > 0 && (tok[0] >= '0' && tok[0] <= '9' || tok[0] == '-' && len(tok) > 1 && tok[1] >= '0' && tok[1] <= '9')
}

// printedNumber returns a number token as Python prints the value its
// json module reads (servers decode tool-call arguments with it before a
// template prints them), or nil when that is the token itself: an
// integer prints as its digits, a float as repr does, fixed-point with
// ".0" between 1e-4 and 1e16 and in exponent form beyond.
func printedNumber(tok []byte) []byte {
	if !bytes.ContainsAny(tok, ".eE") {
		return nil
	}
	x, err := strconv.ParseFloat(string(tok), 64)
	var out []byte
	switch ax := math.Abs(x); {
	case err != nil && !math.IsInf(x, 0):
		return nil
	case math.IsInf(x, 1):
		out = []byte("Infinity")
	case math.IsInf(x, -1):
		out = []byte("-Infinity")
	case ax == 0 || ax >= 1e-4 && ax < 1e16:
		out = strconv.AppendFloat(nil, x, 'f', -1, 64)
		if bytes.IndexByte(out, '.') < 0 {
			out = append(out, '.', '0')
		}
	default:
		out = strconv.AppendFloat(nil, x, 'e', -1, 64)
	}
	if bytes.Equal(out, tok) {
		return nil
	}
	return out
}

// text walks the string at w.i, collecting or visiting it if collect.
func (w *textWalker) text(collect bool) {
	start := w.i
	q, escaped := w.str()
	if collect {
		w.emit(Text{Span: Span{start, w.i}, quoted: q, escaped: escaped})
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

// objectState is what a walk learns of one object as it goes.
type objectState struct {
	// isText: a "type" key of the object names text ("text" for the
	// guardrails' data sources; a text part type for routing); sawType:
	// the object has a string type.
	isText, sawType bool
	// first, and w.data from more: where the object's strings that wait
	// for its end start (data for the guardrails, text for routing).
	first, more int
}

// wait keeps the string at w.i for the object's end and moves past it.
func (w *textWalker) wait(st *objectState) {
	if st.first < 0 {
		st.first = w.i
	} else {
		w.data = append(w.data, w.i)
	}
	w.str()
}

// object walks the object at w.i.
func (w *textWalker) object(collect bool) {
	w.i++
	st := objectState{first: -1, more: len(w.data)}
	for !w.stop {
		w.space()
		if w.i >= len(w.b) || w.b[w.i] == '}' {
			w.i++
			if st.first >= 0 && (st.isText || (w.sb != nil && !st.sawType)) {
				w.visitAt(st.first)
				for _, at := range w.data[st.more:] {
					w.visitAt(at)
				}
			}
			w.data = w.data[:st.more]
			return
		}
		kStart := w.i
		k, escaped := w.str()
		w.space()
		w.i++ // ':'
		if w.guard {
			w.guardMember(&st, Text{Span: Span{kStart, kStart + len(k)}, quoted: k, escaped: escaped})
		} else {
			w.routeMember(&st, k, escaped, collect)
		}
		w.space()
		if w.i < len(w.b) && w.b[w.i] == ',' {
			w.i++
		}
	}
	w.data = w.data[:st.more]
}

// guardMember walks the value of the key k (guard mode).
func (w *textWalker) guardMember(st *objectState, k Text) {
	switch {
	case w.all:
		// A tree is printed whole: its keys are text too.
		w.emit(k)
		w.value(true)
	case guardTreeKey(k.quoted, k.escaped):
		w.tree(keyIs(k.quoted, k.escaped, "arguments"))
	case keyIs(k.quoted, k.escaped, "role"):
		w.space()
		if w.i < len(w.b) && w.b[w.i] == '"' {
			start := w.i
			q, qe := w.str()
			w.emit(Text{Span: Span{start, w.i}, quoted: q, escaped: qe, role: true})
		} else {
			w.value(true)
		}
	case keyIs(k.quoted, k.escaped, "type"):
		w.space()
		if w.i < len(w.b) && w.b[w.i] == '"' {
			// Any type "text" counts: servers differ on which of
			// repeated keys wins, and reading too much is safe.
			q, qe := w.str()
			st.isText = st.isText || keyIs(q, qe, "text")
		} else {
			w.value(false)
		}
	case keyIs(k.quoted, k.escaped, "data"):
		w.space()
		if st.isText || w.i >= len(w.b) || w.b[w.i] != '"' {
			w.value(st.isText)
			break
		}
		w.wait(st)
	default:
		// Objects are weighed key by key at every depth, whatever
		// holds them: a tool's description sits under function,
		// a tool call's arguments under tool_calls[].function.
		w.value(guardTextKey(k.quoted, k.escaped))
	}
}

// routeMember walks the value of the key k for the routing estimate:
// text and content are counted, but not the text of a part whose type is
// not text (an image_url or input_audio part's text is ignored by the
// servers), whatever the key order: a text before its type waits for the
// object's end.
func (w *textWalker) routeMember(st *objectState, k []byte, escaped, collect bool) {
	switch {
	case keyIs(k, escaped, "type"):
		w.space()
		if w.i < len(w.b) && w.b[w.i] == '"' {
			q, qe := w.str()
			st.sawType = true
			st.isText = st.isText || textType(q, qe)
		} else {
			w.value(false)
		}
	case collect && keyIs(k, escaped, "text"):
		w.space()
		if st.isText || !st.sawType && w.i < len(w.b) && w.b[w.i] == '"' {
			if st.isText {
				w.value(true)
			} else {
				w.wait(st)
			}
			break
		}
		w.value(!st.sawType)
	default:
		w.value(collect && keyIs(k, escaped, "content"))
	}
}

// textType reports a part type whose text the servers read: "text",
// and the responses API's input_text, output_text, summary_text and
// reasoning_text.
func textType(q []byte, escaped bool) bool {
	v := q[1 : len(q)-1]
	if escaped {
		v = []byte(stringValue(q, true))
	}
	return string(v) == "text" || bytes.HasSuffix(v, []byte("_text"))
}

// tree walks the value at w.i as a tree: every string and key is text.
// An arguments string that holds a JSON document is walked as that
// document (see encoded).
func (w *textWalker) tree(arguments bool) {
	w.space()
	if arguments && w.outer == nil && w.i < len(w.b) && w.b[w.i] == '"' && w.encoded() {
		return
	}
	w.all = true
	w.value(true)
	w.all = false
}

// encoded walks the string at w.i as the JSON document (an object or an
// array) it holds, and reports whether it holds one (else w.i is
// unmoved). Servers decode tool-call arguments before the template prints
// them, so the model reads the document's strings decoded: a scan of the
// string as sent would read "\\u002d" where the model sees "-".
func (w *textWalker) encoded() bool {
	start := w.i
	t := textWalker{b: w.b, i: start}
	q, escaped := t.str()
	if !mayBeDocument(q) {
		return false
	}
	doc := bytesValue(q, escaped) // read only: an unescaped one is the body's own bytes
	if !isDocument(doc) {
		return false
	}
	outer := Span{start, t.i}
	sub := textWalker{b: doc, fn: w.fn, guard: true, all: true, outer: &outer}
	sub.value(true)
	if !sub.emitted && !sub.stop {
		// A document of no strings nor numbers ({}, [true]): the string
		// itself is read, so that it counts as read (strict mode).
		w.emit(Text{Span: outer, quoted: q, escaped: escaped})
	}
	w.stop, w.i = w.stop || sub.stop, t.i
	return true
}

// mayBeDocument: the quoted string's first byte that is not white space
// (or an escape, which could be escaped white space or the quote of a
// JSON string) opens an object or an array; the common plain string is
// passed over without decoding.
func mayBeDocument(q []byte) bool {
	for _, c := range q[1 : len(q)-1] {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '{', '[', '\\':
			return true
		}
		return false
	}
	return false
}

// isDocument reports whether doc is one JSON object, array or string, as
// Python's json module reads them (NaN and Infinity allowed): arguments
// holding a JSON string ("\"…\"") are decoded to its text before a
// template prints them, escapes and all.
func isDocument(doc []byte) bool {
	s := scanner{b: doc, python: true}
	s.space()
	if c := s.peek(); c != '{' && c != '[' && c != '"' {
		return false
	}
	s.value(0)
	s.space()
	return s.err == nil && s.i == len(doc)
}

// Edit replaces a span of the body with raw JSON.
type Edit struct {
	Span
	JSON []byte
}

// TextEdits gathers new values for texts (in the order Texts visits them)
// and turns them into edits of the body: a text's string is replaced by
// the new value quoted; the texts of one encoded document (tool-call
// arguments) are replaced in the decoded document, which then replaces
// the string that held it, encoded again (the same document with those
// strings changed: valid JSON, its layout kept).
type TextEdits struct {
	edits []Edit
	// The encoded document being edited: the body string holding it,
	// the document and its edits.
	outer Span
	doc   []byte
	inner []Edit
	// buf holds the quoted values one after another; an edit's JSON is
	// a slice of it, so quoting allocates only when buf grows.
	buf []byte
}

// quote appends v quoted to buf and returns it. A full buf is replaced
// by one twice its size rather than grown: the edits made so far keep
// the old one, so nothing is copied.
func (e *TextEdits) quote(v string) []byte {
	if need := len(v) + 2; cap(e.buf)-len(e.buf) < need {
		e.buf = make([]byte, 0, max(2*cap(e.buf), need+need/8, 256))
	}
	at := len(e.buf)
	e.buf = AppendQuoted(e.buf, v)
	return e.buf[at:len(e.buf):len(e.buf)]
}

// Set gives t the new value v.
func (e *TextEdits) Set(t Text, v string) {
	if t.doc == nil {
		e.flush()
		e.edits = append(e.edits, Edit{Span: t.Span, JSON: e.quote(v)})
		return
	}
	if e.doc != nil && e.outer != t.Span {
		e.flush()
	}
	e.outer, e.doc = t.Span, t.doc
	e.inner = append(e.inner, Edit{Span: Span{t.at, t.at + len(t.quoted)}, JSON: e.quote(v)})
}

// flush turns the pending edits of an encoded document into one edit.
func (e *TextEdits) flush() {
	if e.doc == nil {
		return
	}
	doc := (&Body{s: scanner{b: e.doc}}).Rewrite(e.inner)
	e.edits = append(e.edits, Edit{Span: e.outer, JSON: appendQuoted(nil, doc)})
	e.doc, e.inner = nil, e.inner[:0]
}

// Edits returns the edits gathered.
func (e *TextEdits) Edits() []Edit {
	e.flush()
	return e.edits
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
func AppendQuoted(dst []byte, s string) []byte { return appendQuoted(dst, s) }

func appendQuoted[S string | []byte](dst []byte, s S) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(slices.Grow(dst, len(s)+2), '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if !quoteSpecial[c] {
			i++
			continue
		}
		if c < 0x80 {
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
		if i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xA8 || s[i+2] == 0xA9) {
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

// quoteSpecial marks the bytes AppendQuoted looks at: those it escapes,
// and 0xE2, which starts U+2028 and U+2029.
var quoteSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'], t[0xE2] = true, true, true
	return t
}()
