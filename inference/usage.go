package inference

import (
	"bytes"
	"encoding/json"
)

// Usage is the token count a model server reports for one response.
type Usage struct {
	PromptTokens, CompletionTokens, TotalTokens int64
}

// MaxUsageBuffer bounds what a UsageReader holds of one SSE line; a
// longer line passes without its usage being read.
const MaxUsageBuffer = 1 << 20

// UsageReader finds the usage of a response as its body streams past,
// without holding the whole response: for server-sent events it keeps only
// the current line and reads the data lines that carry "usage" (OpenAI's
// final chunk with stream_options.include_usage, Anthropic's message_start
// and message_delta, the responses API's response.completed); for a JSON
// body it follows the document's structure and keeps only the top-level
// "usage" value, so an answer of any size is metered while the reader
// holds a few hundred bytes.
type UsageReader struct {
	sse      bool
	buf      []byte
	overflow bool
	doc      jsonUsage
	usage    Usage
	found    bool
}

// NewUsageReader reads a response of the given content type.
func NewUsageReader(contentType string) *UsageReader {
	return &UsageReader{sse: bytes.HasPrefix(bytes.TrimSpace([]byte(contentType)), []byte("text/event-stream"))}
}

// Write takes the next body chunk; it never fails.
func (u *UsageReader) Write(chunk []byte) {
	if !u.sse {
		u.doc.write(chunk, u.readUsage)
		return
	}
	for len(chunk) > 0 {
		nl := bytes.IndexByte(chunk, '\n')
		if nl < 0 {
			u.appendLine(chunk)
			return
		}
		u.appendLine(chunk[:nl])
		if !u.overflow {
			u.line(u.buf)
		}
		u.buf, u.overflow = u.buf[:0], false
		chunk = chunk[nl+1:]
	}
}

func (u *UsageReader) appendLine(b []byte) {
	if u.overflow {
		return
	}
	if len(u.buf)+len(b) > MaxUsageBuffer {
		u.overflow, u.buf = true, u.buf[:0]
		return
	}
	u.buf = append(u.buf, b...)
}

// line reads one SSE line.
func (u *UsageReader) line(l []byte) {
	data, ok := bytes.CutPrefix(bytes.TrimRight(l, "\r"), []byte("data:"))
	if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
		return
	}
	u.read(bytes.TrimSpace(data))
}

// Usage returns what was found once the body has ended (it also reads a
// final SSE line without a newline).
func (u *UsageReader) Usage() (Usage, bool) {
	if u.sse && len(u.buf) > 0 && !u.overflow {
		u.line(u.buf)
		u.buf = u.buf[:0]
	}
	if u.found && u.usage.TotalTokens == 0 {
		u.usage.TotalTokens = u.usage.PromptTokens + u.usage.CompletionTokens
	}
	return u.usage, u.found
}

// wireUsage covers OpenAI's and Anthropic's names.
type wireUsage struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	TotalTokens      *int64 `json:"total_tokens"`
	InputTokens      *int64 `json:"input_tokens"`
	OutputTokens     *int64 `json:"output_tokens"`
}

// read merges the usage of one JSON document: at the top level, or under
// "message" (Anthropic message_start) or "response" (responses API events).
func (u *UsageReader) read(doc []byte) {
	var d struct {
		Usage    *wireUsage                  `json:"usage"`
		Message  *struct{ Usage *wireUsage } `json:"message"`
		Response *struct{ Usage *wireUsage } `json:"response"`
	}
	if json.Unmarshal(doc, &d) != nil {
		return
	}
	for _, w := range []*wireUsage{d.Usage, nested(d.Message), nested(d.Response)} {
		u.merge(w)
	}
}

// readUsage takes a top-level "usage" value of a JSON body; as when
// decoding a document, the last of repeated keys wins.
func (u *UsageReader) readUsage(value []byte) {
	u.usage, u.found = Usage{}, false
	var w *wireUsage
	if json.Unmarshal(value, &w) == nil {
		u.merge(w)
	}
}

// merge takes the counts of one usage object.
func (u *UsageReader) merge(w *wireUsage) {
	if w == nil {
		return
	}
	u.found = true
	set := func(dst *int64, vals ...*int64) {
		for _, v := range vals {
			if v != nil && *v > 0 {
				*dst = *v
			}
		}
	}
	set(&u.usage.PromptTokens, w.PromptTokens, w.InputTokens)
	set(&u.usage.CompletionTokens, w.CompletionTokens, w.OutputTokens)
	set(&u.usage.TotalTokens, w.TotalTokens)
}

func nested(s *struct{ Usage *wireUsage }) *wireUsage {
	if s == nil {
		return nil
	}
	return s.Usage
}

// UsageChunkFilter removes, from an OpenAI server-sent event stream, the
// usage-only chunk (`"choices":[]` with a usage object) that
// stream_options.include_usage adds before `data: [DONE]`: when the
// gateway asked for usage on the client's behalf, the client gets the
// stream it asked for. Complete lines pass at once; a partial line is held
// until its end (never more than MaxUsageBuffer, past which it passes
// unread).
type UsageChunkFilter struct {
	partial   []byte
	dropBlank bool // the dropped event's blank line is next
}

// Write takes the next body chunk and returns what to send on.
func (f *UsageChunkFilter) Write(chunk []byte, endOfStream bool) []byte {
	out := make([]byte, 0, len(chunk)+len(f.partial))
	for len(chunk) > 0 {
		nl := bytes.IndexByte(chunk, '\n')
		if nl < 0 {
			f.partial = append(f.partial, chunk...)
			if len(f.partial) > MaxUsageBuffer {
				out, f.partial = append(out, f.partial...), nil
			}
			break
		}
		line := chunk[:nl+1]
		if len(f.partial) > 0 {
			line = append(f.partial, line...)
			f.partial = nil
		}
		out = f.line(out, line)
		chunk = chunk[nl+1:]
	}
	if endOfStream && len(f.partial) > 0 {
		out, f.partial = f.line(out, f.partial), nil
	}
	return out
}

func (f *UsageChunkFilter) line(out, line []byte) []byte {
	if f.dropBlank && len(bytes.TrimRight(line, "\r\n")) == 0 {
		f.dropBlank = false
		return out
	}
	f.dropBlank = false
	if usageOnly(line) {
		f.dropBlank = true
		return out
	}
	return append(out, line...)
}

// usageOnly reports a data line holding the usage-only chunk.
func usageOnly(line []byte) bool {
	data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
	if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
		return false
	}
	var d struct {
		Choices *[]json.RawMessage `json:"choices"`
		Usage   json.RawMessage    `json:"usage"`
	}
	if json.Unmarshal(bytes.TrimSpace(data), &d) != nil {
		return false
	}
	return d.Choices != nil && len(*d.Choices) == 0 && len(d.Usage) > 0 && string(d.Usage) != "null"
}
