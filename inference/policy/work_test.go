package policy

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// costlyBodies are the request shapes that cost a guardrail decision most
// per byte, n bytes of prompt or so each: text dense in invisible
// characters and combining marks (folded and mapped back), escapes (decoded),
// findings to mask up to the bound, in a prompt and in encoded tool-call
// arguments, and plain prose for scale.
func costlyBodies(n, findings int) map[string][]byte {
	prompt := func(p string) []byte {
		b, _ := json.Marshal(map[string]any{"model": "m", "prompt": p})
		return b
	}
	fill := func(unit string) string { return strings.Repeat(unit, max(1, n/len(unit))) }
	emails := make([]string, findings)
	for i := range emails {
		emails[i] = fmt.Sprintf("user%d@example.com", i)
	}
	doc, _ := json.Marshal(map[string]any{"to": emails, "pad": fill("a")})
	args, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{map[string]any{"role": "assistant",
		"tool_calls": []any{map[string]any{"id": "c", "type": "function", "function": map[string]any{"name": "f", "arguments": string(doc)}}}}}})
	return map[string][]byte{
		"prose":                   prompt(fill("the quick brown fox jumps over the lazy dog. ")),
		"zero-width between each": prompt(fill("x\u200b")),
		"marks and zero-width":    prompt(fill("a\u200b\u0332b\u20dd1\u0305")),
		"marks on digits":         prompt(fill("1\u0332")),
		"escaped letters":         []byte(`{"model":"m","prompt":"` + fill(`\u0041`) + `"}`),
		"cards to mask":           prompt(strings.Repeat("4111 1111 1111 1111 ", findings) + fill("a")),
		"e-mails in arguments":    args,
		"empty strings":           []byte(`{"model":"m","messages":[{"role":"user","content":[` + strings.TrimSuffix(fill(`{"type":"text","text":""},`), ",") + `]}]}`),
	}
}

const testGuard = `{"pii":[{"name":"email","detector":"email","action":"mask"},{"name":"card","detector":"credit-card","action":"mask"},{"name":"phone","detector":"phone","action":"mask"},{"name":"ip","detector":"ip","action":"mask"},{"name":"ssn","detector":"ssn","action":"reject"},{"name":"iban","detector":"iban","action":"reject"}],"deny":[{"name":"pi","contains":["ignore previous instructions"],"regex":"(?i)\\byou are now DAN\\b"}],"limits":{"maxBodyBytes":67108864}}`

// TestWorkBytesBoundsApply: what Apply allocates on the costliest shapes,
// a bound on what it holds at once, stays within WorkBytes, the figure a
// server charges to its budget for the decision.
func TestWorkBytesBoundsApply(t *testing.T) {
	c, err := DecodeJSON([]byte(testGuard))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []struct{ size, findings int }{
		{4 << 10, 64},
		{1 << 20, p.maxFindings},     // every finding masked
		{1 << 20, p.maxFindings + 1}, // refused at the bound
	} {
		size := run.size
		for name, body := range costlyBodies(size, run.findings) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			res := p.Apply(body)
			runtime.ReadMemStats(&after)
			used, bound := int64(after.TotalAlloc-before.TotalAlloc), p.WorkBytes(len(body))
			t.Logf("%s, %d bytes: allocated %d (%.1f per byte), bound %d; masked %v, refused %v", name, len(body), used, float64(used)/float64(len(body)), bound, res.Masked, res.Reject != nil)
			if used > bound {
				t.Errorf("%s, %d bytes: Apply allocated %d bytes, over WorkBytes %d", name, len(body), used, bound)
			}
		}
	}
}
