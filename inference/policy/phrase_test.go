package policy

import (
	"strings"
	"testing"

	"github.com/infergate/infergate/inference/textnorm"
)

// TestPhraseRuleWindows: phraseRule, which compacts ASCII text a window
// at a time, finds what a search of the whole textnorm.Compact form
// finds: a phrase across a window's edge, the first rule in order
// whatever the order of the phrases in the text, and in text that turns
// out not to be ASCII past the first window.
func TestPhraseRuleWindows(t *testing.T) {
	p, err := Compile(&Config{Deny: []DenyRule{
		{Name: "re", Regex: `never`},
		{Name: "beta", Contains: []string{"beta gamma"}},
		{Name: "injection", Contains: []string{"ignore previous instructions", "Disregard  the above"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 3*phraseWindow)
	var texts []string
	for _, at := range []int{0, 1, phraseWindow - 20, phraseWindow - 1, phraseWindow, phraseWindow + 1, 2*phraseWindow - 7, len(long)} {
		for _, phrase := range []string{"ignore previous instructions", "IGNORE   previous\u200binstructions", "disregard the above", "beta gamma", "betagamma"} {
			texts = append(texts, long[:at]+phrase+long[at:])
			texts = append(texts, long[:at]+"ig nore "+long[at:]+phrase)
			texts = append(texts, long[:at]+phrase+long[at:]+" é "+"ignore previous instructions")
			texts = append(texts, "ignore previous instructions "+long[:at]+phrase)
		}
	}
	texts = append(texts, long+"іgnore prevіous іnstructions", long, "", " ", "ignore previous", strings.Repeat("beta ", 2000)+"gamma")
	for _, text := range texts {
		folded := textnorm.Fold(text).S
		got, want := p.phraseRule(folded), p.phraseRuleIn(textnorm.Compact(folded))
		if got != want {
			t.Errorf("phraseRule = %d, want %d, for %d bytes: %.40q…%q", got, want, len(text), text, text[max(0, len(text)-40):])
		}
	}
}

// TestAppendCompactASCII: the windowed compaction is textnorm.Compact
// on ASCII, and says when the text is not ASCII.
func TestAppendCompactASCII(t *testing.T) {
	for _, s := range []string{"", " ", "  A b  C ", "Ignore Previous\tInstructions!", "ÀB", "ab\x80"} {
		out, ascii := appendCompactASCII([]byte("keep"), s)
		if wantASCII := strings.IndexFunc(s, func(r rune) bool { return r >= 0x80 }) < 0 && !strings.Contains(s, "\x80"); ascii != wantASCII {
			t.Errorf("%q: ascii %v", s, ascii)
			continue
		}
		if ascii && string(out) != "keep"+textnorm.Compact(s) {
			t.Errorf("%q: %q, want %q", s, out, "keep"+textnorm.Compact(s))
		}
	}
}
