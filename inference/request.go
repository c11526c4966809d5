// Package inference is the protocol-neutral core shared by the processors
// and the Wasm plugin: it understands inference request bodies. It imports
// no gRPC or Kubernetes code so that it compiles for wasip1.
package inference

import (
	"errors"
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
// completions, responses; Anthropic messages) in one validating pass over
// the body and one over the prompt fields, building nothing else.
func ParseRequest(raw []byte) (*Request, error) {
	s, err := scan(raw)
	if err != nil {
		return nil, err
	}
	model, err := s.model()
	if err != nil {
		return nil, err
	}
	var sb strings.Builder
	sb.Grow(s.fields[fieldSystem].end - s.fields[fieldSystem].start + s.fields[fieldPrompt].end - s.fields[fieldPrompt].start +
		s.fields[fieldInput].end - s.fields[fieldInput].start + s.fields[fieldMessages].end - s.fields[fieldMessages].start)
	for _, f := range []int{fieldSystem, fieldPrompt, fieldInput, fieldMessages} {
		if sp := s.fields[f]; sp.end > 0 {
			w := textWalker{b: raw[:sp.end], i: sp.start, sb: &sb}
			w.value(true)
		}
	}
	sp := s.fields[fieldStream]
	return &Request{Model: model, Prompt: sb.String(), Stream: sp.end > 0 && string(raw[sp.start:sp.end]) == "true"}, nil
}

// textWalker collects the text of an already validated JSON value: a
// string, the strings in an array, and in objects only the "text" and
// "content" fields (so roles, types and image URLs are left out).
type textWalker struct {
	b  []byte
	i  int
	sb *strings.Builder
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

func (w *textWalker) value(collect bool) {
	w.space()
	if w.i >= len(w.b) {
		return
	}
	switch w.b[w.i] {
	case '"':
		q, escaped := w.str()
		switch {
		case !collect:
		case escaped:
			w.sb.WriteString(stringValue(q, true))
		default:
			w.sb.Write(q[1 : len(q)-1])
		}
	case '[':
		w.i++
		for {
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
	case '{':
		w.i++
		for {
			w.space()
			if w.i >= len(w.b) || w.b[w.i] == '}' {
				w.i++
				return
			}
			k, escaped := w.str()
			w.space()
			w.i++ // ':'
			w.value(collect && (keyIs(k, escaped, "text") || keyIs(k, escaped, "content")))
			w.space()
			if w.i < len(w.b) && w.b[w.i] == ',' {
				w.i++
			}
		}
	default: // number or literal: skip to the next delimiter
		for w.i < len(w.b) && !strings.ContainsRune(",]} \t\n\r", rune(w.b[w.i])) {
			w.i++
		}
	}
}
