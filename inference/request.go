// Package inference is the protocol-neutral core shared by the processors
// and the Wasm plugin: it understands inference request bodies. It imports
// no gRPC or Kubernetes code so that it compiles for wasip1.
package inference

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrMissingModel means the body is valid JSON without a "model" string.
var ErrMissingModel = errors.New(`request body has no "model" field`)

// Request is what routing needs from an inference request body.
type Request struct {
	Model string
	// Prompt is the user-visible input flattened to text: the prompt of a
	// completion, or the messages of a chat joined in order. Routing uses
	// it to estimate size and, later, to find shared prefixes.
	Prompt string
	Stream bool
}

// body lists the fields of the OpenAI and Anthropic request shapes that
// routing reads; everything else is ignored.
type body struct {
	Prompt   json.RawMessage `json:"prompt"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	System json.RawMessage `json:"system"`
	Input  json.RawMessage `json:"input"`
	Stream bool            `json:"stream"`
}

// ParseRequest reads an inference request body. The model is found by
// ModelOf, so both agree on what a valid body and its model are.
func ParseRequest(raw []byte) (*Request, error) {
	model, err := ModelOf(raw)
	if err != nil {
		return nil, err
	}
	var b body
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidJSON, err)
	}
	var sb strings.Builder
	appendText(&sb, b.System)
	appendText(&sb, b.Prompt)
	appendText(&sb, b.Input)
	for _, m := range b.Messages {
		appendText(&sb, m.Content)
	}
	return &Request{Model: model, Prompt: sb.String(), Stream: b.Stream}, nil
}

// appendText adds the text of a string, an array of strings, or an array
// of content parts ({"type":"text","text":...}); other shapes add nothing.
func appendText(sb *strings.Builder, raw json.RawMessage) {
	if len(raw) == 0 {
		return
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		sb.WriteString(s)
		return
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return
	}
	for _, p := range parts {
		var part struct {
			Text    *string         `json:"text"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(p, &s) == nil {
			sb.WriteString(s)
		} else if json.Unmarshal(p, &part) == nil {
			if part.Text != nil {
				sb.WriteString(*part.Text)
			}
			appendText(sb, part.Content)
		}
	}
}
