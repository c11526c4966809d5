package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/inference/wire"
)

// The shapes of issue 37 whose cost is not the body's size but what
// deciding it takes: text the guardrails fold character by character, and
// a million findings to mask. They run under guardrailsConfig.

// guardrailsConfig is the policy the costly shapes run under: every
// built-in detector and a deny rule, as the tester's processor had.
const guardrailsConfig = `pii:
- {name: email, detector: email, action: mask}
- {name: card, detector: credit-card, action: mask}
- {name: phone, detector: phone, action: mask}
- {name: ip, detector: ip, action: mask}
- {name: ssn, detector: ssn, action: reject}
- {name: iban, detector: iban, action: reject}
deny:
- name: prompt-injection
  contains: ["ignore previous instructions", "ignore all previous instructions"]
  regex: '(?i)\byou are now DAN\b'
`

// chatBody is a chat request whose user message is content, a JSON string
// written as it is (escapes and all).
func chatBody(size int, content func(b *bytes.Buffer, size int)) []byte {
	var b bytes.Buffer
	b.Grow(size + 64)
	b.WriteString(`{"model":"m","messages":[{"role":"user","content":"`)
	content(&b, size-len(`"}]}`))
	b.WriteString(`"}]}`)
	return b.Bytes()
}

// denseBody is a chat prompt of about size bytes of letters and digits,
// each followed by zero-width spaces (U+200B) and combining marks (U+0332
// low line, U+20DD enclosing circle, U+0305 overline), written as UTF-8:
// the text that folding reads character by character and a deny rule
// reads in several readings.
func denseBody(size int) []byte {
	const unit = "a\u200b\u03321\u20dd\u200bb\u0305\u200b2\u0332\u20dd"
	return chatBody(size, func(b *bytes.Buffer, size int) {
		for b.Len()+len(unit) <= size {
			b.WriteString(unit)
		}
	})
}

// cardsBody is a chat prompt of n test card numbers, 4111 1111 1111 1111,
// space-separated (700,000 of them are 13.4 MiB).
func cardsBody(n int) []byte {
	const card = "4111 1111 1111 1111 "
	return chatBody(n*len(card), func(b *bytes.Buffer, size int) {
		for range n {
			b.WriteString(card)
		}
	})
}

// emailArgsBody is a chat request whose one tool call's arguments is a
// JSON-encoded string holding an object with a list of n distinct e-mail
// addresses (1,000,000 of them are 14.3 MiB, within the default 16 MiB
// body limit): the policy decodes the string, masks each address and
// encodes the string again.
func emailArgsBody(n int) []byte {
	var b bytes.Buffer
	b.Grow(n * 15)
	b.WriteString(`{"model":"m","messages":[{"role":"user","content":"send it"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"send","arguments":"{\"to\":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`\"`)
		b.WriteString(strconv.FormatInt(int64(i), 36))
		b.WriteString(`@ex.io\"`)
	}
	b.WriteString(`]}"}}]}]}`)
	return b.Bytes()
}

// answers tallies how the processor answered the hostile requests of a
// shape: "forwarded", an immediate answer's status and drop reason, or
// the error that ended the stream.
type answers struct {
	mu     sync.Mutex
	counts map[string]int
}

func (a *answers) add(what string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.counts == nil {
		a.counts = map[string]int{}
	}
	a.counts[what]++
}

// String lists the answers, most frequent first.
func (a *answers) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	keys := make([]string, 0, len(a.counts))
	for k := range a.counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y string) int {
		if a.counts[x] != a.counts[y] {
			return a.counts[y] - a.counts[x]
		}
		return strings.Compare(x, y)
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", a.counts[k], k))
	}
	if len(parts) == 0 {
		return "none answered"
	}
	return strings.Join(parts, ", ")
}

// answerOf names an answer for the tally.
func answerOf(ir *extprocv3.ImmediateResponse, err error) string {
	switch {
	case err != nil:
		return "failed"
	case ir == nil:
		return "forwarded"
	}
	reason := ""
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == wire.DropReasonHeader {
			reason = " " + string(h.GetHeader().GetRawValue())
		}
	}
	return fmt.Sprint(int(ir.GetStatus().GetCode()), reason)
}

// costly has clients send body in a loop, each on an attacker
// connection, until ctx ends, and tallies the answers.
func costly(clients int, body func(scale float64) []byte) func(context.Context, target) (reporter, error) {
	return func(ctx context.Context, t target) (reporter, error) {
		b := body(min(t.scale, 1))
		var started atomic.Int64
		var tally answers
		for i := range t.n(clients) {
			go func() {
				for ctx.Err() == nil {
					started.Add(1)
					ir, err := sendWhole(ctx, t.client(i), b)
					if ctx.Err() != nil {
						return // the run ended under it: not an answer
					}
					tally.add(answerOf(ir, err))
				}
			}()
		}
		return func() (string, int64) {
			return fmt.Sprintf("%d × %.1f MiB sent: %s", started.Load(), float64(len(b))/(1<<20), tally.String()), started.Load()
		}, nil
	}
}
