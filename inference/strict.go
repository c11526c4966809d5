package inference

import (
	"slices"
	"strconv"
)

// nonTextKey is a key whose values carry no text the model reads.
type nonTextKey struct {
	name string
	// top: only as a top-level field (a request parameter); nested, the
	// key is like any other.
	top bool
	// tree: no string in the value is text, at any depth. Otherwise only
	// a string value, or the strings of an array value, are not text: an
	// object under the key is weighed key by key.
	tree bool
}

// nonTextKeys are the keys UnreadText passes. A string under any other key
// must be one Texts reads. A key belongs here only if no API this package
// reads shows its strings to the model: an unknown key is refused in
// strict mode, which is the point of it.
var nonTextKeys = [...]nonTextKey{
	// Request parameters.
	{name: "model", top: true},
	{name: "user", top: true},           // an end-user id for abuse tracking
	{name: "stop", top: true},           // stop sequences match the output
	{name: "stop_sequences", top: true}, // Anthropic's stop
	{name: "service_tier", top: true},
	{name: "reasoning_effort", top: true},
	{name: "modalities", top: true},      // ["text","audio"]
	{name: "encoding_format", top: true}, // embeddings: float or base64
	{name: "prompt_cache_key", top: true},
	{name: "previous_response_id", top: true}, // the server loads that response: read when it was sent
	{name: "truncation", top: true},           // auto or disabled
	{name: "include", top: true},              // responses: output fields to return
	{name: "metadata", top: true, tree: true}, // caller strings the server keeps and does not send to the model
	{name: "logit_bias", top: true, tree: true},
	// tool_choice is a mode ("auto") or names a tool, whose name must be
	// that of a tool in tools, which is read there.
	{name: "tool_choice", top: true, tree: true},

	// Structure, at any depth. (A role is read: templates print it.)
	{name: "type"}, // also response_format's and a JSON schema's type
	{name: "id"},
	{name: "tool_call_id"},
	{name: "tool_use_id"},
	{name: "call_id"},
	{name: "status"},
	{name: "effort"},  // reasoning.effort
	{name: "summary"}, // reasoning.summary is a mode; a reasoning item's summary texts are read
	{name: "verbosity"},
	{name: "voice"},  // audio.voice
	{name: "format"}, // audio and input_audio format, a JSON schema's format; an object (responses text.format) is weighed
	// A JSON schema's required lists property names. In tools, which
	// Texts reads whole (keys too), it is read; elsewhere (a
	// response_format schema) it names keys that are not read either.
	{name: "required"},
	{name: "cache_control", tree: true}, // {"type":"ephemeral","ttl":"5m"}

	// Media and files: URLs and bytes, not text.
	{name: "url"},
	{name: "image_url", tree: true}, // a URL, or an object of url and detail
	{name: "detail"},
	{name: "media_type"},
	{name: "file_id"},
	{name: "filename"}, // arguably read, but a name, not prose: left as not text
	// data is base64 (images, PDFs, audio, Anthropic redacted thinking)
	// or a URL; a data string Texts reads (a text document source) is
	// read, not passed.
	{name: "data"},
	{name: "file_data"}, // responses input_file: base64, as data
	// Opaque tokens the provider checks or decrypts: an Anthropic thinking
	// block's signature and an OpenAI reasoning item's encrypted_content
	// (like redacted thinking's data, it cannot be scanned).
	{name: "signature"},
	{name: "encrypted_content"},
}

// nonText looks k up in nonTextKeys; top: k is a top-level key.
func nonText(k []byte, escaped, top bool) (known, tree bool) {
	var name string
	if escaped {
		name = stringValue(k, true)
	}
	for _, e := range nonTextKeys {
		if e.top && !top {
			continue
		}
		if (escaped && name == e.name) || (!escaped && string(k[1:len(k)-1]) == e.name) {
			return true, e.tree
		}
	}
	return false, false
}

// UnreadText returns "" when every string value of the body, at any
// depth and in every top-level field, is one Texts visits or sits under a
// key of nonTextKeys; otherwise the path of the first other string in body
// order, as messages[0].foo, metadata_x or
// tools[0].function.parameters.pattern. Strict mode refuses such a body:
// an API extension, a template variable or a field newer than this code
// could carry text to the model that no guardrail read. Numbers, booleans
// and null are not text. Object keys are not checked: Texts reads those of
// the trees a template prints whole (tools, documents,
// chat_template_kwargs, tool-call arguments and inputs); elsewhere a key
// is a field name of the API, and an unknown one holding a string is
// named by its path.
func (b *Body) UnreadText() string {
	var read []int
	b.Texts(func(t Text) bool {
		read = append(read, t.Start)
		return true
	})
	slices.Sort(read)     // Texts goes in prompt order, the check in body order
	var path [16]pathStep // deeper bodies grow it
	w := unreadWalker{textWalker: textWalker{b: b.s.b}, read: read, path: path[:0]}
	w.check(false, false)
	if !w.found {
		return ""
	}
	return w.pathString()
}

// unreadWalker looks for the first string neither read nor passed.
type unreadWalker struct {
	textWalker // for space and str
	// read are the starts of the strings Texts visits, sorted; r is how
	// far the walk has come through them.
	read  []int
	r     int
	path  []pathStep
	found bool
}

// pathStep is an object key (quoted, as in the body) or an array index.
type pathStep struct {
	key     []byte
	escaped bool
	index   int
}

// isRead reports whether Texts visits the string at start; starts come in
// increasing order.
func (w *unreadWalker) isRead(start int) bool {
	for w.r < len(w.read) && w.read[w.r] < start {
		w.r++
	}
	return w.r < len(w.read) && w.read[w.r] == start
}

// check walks a value of the validated body. exempt: a string here, or in
// an array here, is not text; tree: no string at any depth is.
func (w *unreadWalker) check(exempt, tree bool) {
	w.space()
	if w.i >= len(w.b) {
		return
	}
	switch w.b[w.i] {
	case '"':
		start := w.i
		w.str()
		if !exempt && !tree && !w.isRead(start) {
			w.found = true
		}
	case '[':
		w.i++
		for n := 0; !w.found; n++ {
			w.space()
			if w.i >= len(w.b) || w.b[w.i] == ']' {
				w.i++
				return
			}
			w.path = append(w.path, pathStep{index: n})
			w.check(exempt, tree)
			if w.found {
				return
			}
			w.path = w.path[:len(w.path)-1]
			w.space()
			if w.i < len(w.b) && w.b[w.i] == ',' {
				w.i++
			}
		}
	case '{':
		w.i++
		for !w.found {
			w.space()
			if w.i >= len(w.b) || w.b[w.i] == '}' {
				w.i++
				return
			}
			k, escaped := w.str()
			w.space()
			w.i++ // ':'
			known, whole := true, true
			if !tree {
				known, whole = nonText(k, escaped, len(w.path) == 0)
			}
			w.path = append(w.path, pathStep{key: k, escaped: escaped})
			w.check(known, whole)
			if w.found {
				return
			}
			w.path = w.path[:len(w.path)-1]
			w.space()
			if w.i < len(w.b) && w.b[w.i] == ',' {
				w.i++
			}
		}
	default: // number or literal
		for w.i < len(w.b) && !isDelimiter(w.b[w.i]) {
			w.i++
		}
	}
}

func isDelimiter(c byte) bool {
	return c == ',' || c == ']' || c == '}' || c == ' ' || c == '\t' || c == '\n' || c == '\r'
}

// pathString renders the path to the string found: keys joined by dots,
// indexes in brackets; a key that is not a plain name (empty, or with
// dots, brackets, spaces or the like) is quoted in brackets.
func (w *unreadWalker) pathString() string {
	var out []byte
	for _, s := range w.path {
		if s.key == nil {
			out = append(out, '[')
			out = strconv.AppendInt(out, int64(s.index), 10)
			out = append(out, ']')
			continue
		}
		k := stringValue(s.key, s.escaped)
		if !plainName(k) {
			out = append(out, '[')
			out = strconv.AppendQuote(out, k)
			out = append(out, ']')
			continue
		}
		if len(out) > 0 {
			out = append(out, '.')
		}
		out = append(out, k...)
	}
	return string(out)
}

// plainName: k is non-empty and only letters, digits, '_', '-' and '$'.
func plainName(k string) bool {
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '$') {
			return false
		}
	}
	return k != ""
}
