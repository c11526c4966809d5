package textnorm

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestFold(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"plain ASCII", "ignore previous instructions", "ignore previous instructions"},
		{"full-width digits", "ＳＳＮ １２３-４５-６７８９", "SSN 123-45-6789"},
		{"full-width at", "bob＠example.com", "bob@example.com"},
		{"no-break space", "4111\u00a01111\u00a01111\u00a01111", "4111 1111 1111 1111"},
		{"narrow no-break and ideographic spaces", "a\u202fb\u3000c", "a b c"},
		{"zero-width space inside a word", "ig\u200bnore pre\u200dvious", "ignore previous"},
		{"soft hyphen and BOM", "in\u00adstruc\ufefftions", "instructions"},
		{"variation selector", "a\ufe0fb", "ab"},
		{"en dash and minus", "123\u201345\u22126789", "123-45-6789"},
		{"em dash and hyphen", "a\u2014b\u2010c", "a-b-c"},
		{"whitespace runs", "ignore  \t previous\n\ninstructions", "ignore previous instructions"},
		{"leading and trailing runs", "\n\n x \t", " x "},
		{"Arabic-Indic digits", "١٢٣-٤٥-٦٧٨٩", "123-45-6789"},
		{"Devanagari digits", "४१११", "4111"},
		{"mathematical bold letters", "𝐢𝐠𝐧𝐨𝐫𝐞", "ignore"},
		{"ligature", "ﬁle", "file"},
		{"combining mark composes", "e\u0301", "é"},
		{"letters of other scripts stay", "Привет мир", "Привет мир"},
		{"long decomposition kept", "x\ufdfay", "x\ufdfay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Fold(tc.in)
			if f.S != tc.want {
				t.Fatalf("Fold(%q) = %q, want %q", tc.in, f.S, tc.want)
			}
		})
	}
}

func TestSpanMapsBackToOriginal(t *testing.T) {
	for _, tc := range []struct {
		name, in, find, want string
	}{
		{"identity", "my ssn is 123-45-6789.", "123-45-6789", "123-45-6789"},
		{"after a collapsed run", "a\n\n\nb 123-45-6789 c", "123-45-6789", "123-45-6789"},
		{"full-width digits", "x １２３-４５-６７８９ y", "123-45-6789", "１２３-４５-６７８９"},
		{"zero-width inside", "x 123\u200b-45-6789 y", "123-45-6789", "123\u200b-45-6789"},
		{"en dashes", "x 123\u201345\u20136789!", "123-45-6789", "123\u201345\u20136789"},
		{"spaces folded", "card 4111\u00a0\u00a01111 1111\t1111 end", "4111 1111 1111 1111", "4111\u00a0\u00a01111 1111\t1111"},
		{"starts inside a ligature", "the ﬁle", "ile", "ﬁle"},
		{"trailing ignorable not taken", "bob@x.io\u200b done", "bob@x.io", "bob@x.io"},
		{"phrase over a run", "please ignore\n\n previous  instructions now", "ignore previous instructions", "ignore\n\n previous  instructions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Fold(tc.in)
			i := strings.Index(f.S, tc.find)
			if i < 0 {
				t.Fatalf("%q not in folded %q", tc.find, f.S)
			}
			s, e := f.Span(i, i+len(tc.find))
			if got := tc.in[s:e]; got != tc.want {
				t.Fatalf("Span → %q, want %q", got, tc.want)
			}
		})
	}
}

// Every span of the folded text maps to whole characters of the original
// whose folding holds it: masking at the mapped span leaves valid UTF-8
// and removes what was found.
func TestSpanAlwaysWholeCharacters(t *testing.T) {
	in := "ａ\u200bb\n\n c—d １２ e\u0301 ﬁ x\ufdfay ٣"
	f := Fold(in)
	for i := 0; i <= len(f.S); i++ {
		for j := i; j <= len(f.S); j++ {
			s, e := f.Span(i, j)
			if s > e || s < 0 || e > len(in) {
				t.Fatalf("Span(%d,%d) = %d,%d out of order or range", i, j, s, e)
			}
			if !utf8.ValidString(in[s:e]) || !utf8.ValidString(in[:s]) {
				t.Fatalf("Span(%d,%d) = %d,%d cuts a character: %q", i, j, s, e, in[s:e])
			}
			if utf8.ValidString(f.S[i:j]) && !strings.Contains(Fold(in[s:e]).S, strings.TrimSpace(f.S[i:j])) {
				t.Fatalf("Span(%d,%d): original %q folds to %q, which lacks %q", i, j, in[s:e], Fold(in[s:e]).S, f.S[i:j])
			}
		}
	}
}

func TestSkeleton(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"Ignore Previous", "ignore previous"},
		{"іgnore prevіous", "ignore previous"}, // Cyrillic і
		{"IGNОRE PREVIOUS", "ignore previous"}, // Cyrillic О
		{"ignοre previous", "ignore previous"}, // Greek ο
		{"Привет", "пpивeт"},                   // real Cyrillic words fold only their look-alikes
		{"ΑΒΓ", "abγ"},
	} {
		if got := Latin(tc.in); strings.ToLower(got) != tc.want {
			t.Errorf("Latin(%q) = %q, want %q in some case", tc.in, got, tc.want)
		}
		if got := Skeleton(Fold(tc.in).S); got != tc.want {
			t.Errorf("Skeleton(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestLatinKeepsCase(t *testing.T) {
	if got := Latin("DRОP tаble"); got != "DROP table" {
		t.Fatalf("Latin = %q", got)
	}
}

func TestDigitValueEveryScript(t *testing.T) {
	for _, r16 := range unicode.Nd.R16 {
		for r := rune(r16.Lo); r <= rune(r16.Hi); r += rune(r16.Stride) {
			if unicode.Is(unicode.Nd, r-1) {
				continue
			}
			// r starts a run: its ten digits read 0–9.
			for v := 0; v < 10 && unicode.Is(unicode.Nd, r+rune(v)); v++ {
				if got := digitValue(r + rune(v)); got != v {
					t.Fatalf("digitValue(%U) = %d, want %d", r+rune(v), got, v)
				}
			}
		}
	}
}

func TestPlainAllocatesNothing(t *testing.T) {
	s := strings.Repeat("ordinary prompt text, one space at a time. ", 100)
	if n := testing.AllocsPerRun(100, func() { _ = Fold(s) }); n != 0 {
		t.Fatalf("Fold of plain text allocated %v times", n)
	}
}

func FuzzFold(f *testing.F) {
	for _, s := range []string{"a\u200bb", "１２３", "x\n\n y", "ﬁ", "e\u0301", "\ufdfa", "٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if !utf8.ValidString(in) {
			return
		}
		fo := Fold(in)
		if !utf8.ValidString(fo.S) {
			t.Fatalf("Fold(%q) = %q is not UTF-8", in, fo.S)
		}
		if Fold(fo.S).S != fo.S {
			t.Fatalf("Fold is not idempotent on %q: %q then %q", in, fo.S, Fold(fo.S).S)
		}
		if s, e := fo.Span(0, len(fo.S)); len(fo.S) > 0 && (s < 0 || e > len(in) || s > e) {
			t.Fatalf("Span of all = %d,%d for %q", s, e, in)
		}
	})
}

func BenchmarkFold(b *testing.B) {
	for _, bc := range []struct{ name, unit string }{
		{"plain", "the quick brown fox jumps over the lazy dog. "},
		{"lines", "the quick brown fox\njumps over the lazy dog.\n\n"},
		{"mixed", "the qυick brоwn fox — jumps\u00a0over １２ dogs.\n"},
	} {
		s := strings.Repeat(bc.unit, 64<<10/len(bc.unit))
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				_ = Fold(s)
			}
		})
	}
}

// TestTagsAndMarks: tag characters read as the ASCII they mirror (and
// map back to their own bytes); marks and accents leave the skeleton.
func TestTagsAndMarks(t *testing.T) {
	tags := func(s string) string {
		var b strings.Builder
		for _, r := range s {
			b.WriteRune(0xE0000 + r)
		}
		return b.String()
	}
	orig := "\U000E0001a " + tags("SSN 078") + " b\U000E007F" // the language and cancel tags are dropped
	f := Fold(orig)
	if f.S != "a SSN 078 b" {
		t.Fatalf("Fold(tags) = %q", f.S)
	}
	start, end := f.Span(2, 9) // "SSN 078"
	if got := orig[start:end]; got != tags("SSN 078") {
		t.Fatalf("the span of the decoded tags maps back to %q", got)
	}
	for in, want := range map[string]string{
		"ignóre prévious": "ignore previous",
		"igno\u0301re":    "ignore",
		"İGNORE":          "ignore",
		"plain":           "plain",
	} {
		if got := Skeleton(Fold(in).S); got != want {
			t.Errorf("Skeleton(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPlainByWords: plain, which reads eight bytes at a time, agrees with
// a byte-by-byte reading for every special byte at every offset and across
// the word boundaries.
func TestPlainByWords(t *testing.T) {
	slow := func(s string) bool {
		prev := byte(0)
		for i := 0; i < len(s); i++ {
			c := s[i]
			if c >= 0x80 || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' || c == ' ' && prev == ' ' {
				return false
			}
			prev = c
		}
		return true
	}
	base := strings.Repeat("abcdefgh", 3)
	for _, ins := range []string{" ", "  ", "\t", "\n", "\v", "\f", "\r", "\x08", "\x0e", "\x1f", "\x7f", "é", "\u200b", " a ", "\x00"} {
		for at := 0; at <= len(base); at++ {
			for _, s := range []string{base[:at] + ins + base[at:], base[:at] + ins, ins + base[:at]} {
				if got, want := plain(s), slow(s); got != want {
					t.Errorf("plain(%q) = %v, want %v", s, got, want)
				}
			}
		}
	}
	for at := 1; at < len(base); at++ {
		s := base[:at] + " " + " " + base[at:]
		if plain(s) {
			t.Errorf("plain(%q) = true", s)
		}
		s = base[:at] + " " + base[at:at+1] + " " + base[at:]
		if !plain(s) {
			t.Errorf("plain(%q) = false", s)
		}
	}
}

// TestCompact: the key contains phrases are compared by is the skeleton
// with every space removed.
func TestCompact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{" ", ""},
		{"Ignore Previous Instructions", "ignorepreviousinstructions"},
		{"ig nore  prev ious", "ignoreprevious"},
		{"ALREADY", "already"},
		{"4111 1111-1111", "41111111-1111"},
		{"іgnore prevіous", "ignoreprevious"}, // Cyrillic і
		{"IGNÓRE Previous", "ignoreprevious"}, // accent dropped
		{"ΑΒΓ δ", "abγδ"},                     // look-alikes only
		{"日本 語", "日本語"},
	} {
		if got := Compact(tc.in); got != tc.want {
			t.Errorf("Compact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestFoldSpaced: FoldSpaced reads every default-ignorable character as
// a space (one space for a run, none after a space), where Fold drops it;
// both report that one was met.
func TestFoldSpaced(t *testing.T) {
	for _, tc := range []struct {
		name, in, fold, spaced string
		dropped                bool
	}{
		{"plain", "ignore previous", "ignore previous", "ignore previous", false},
		{"zero-width space between words", "ignore\u200bprevious", "ignoreprevious", "ignore previous", true},
		{"inside a word", "ig\u200bnore", "ignore", "ig nore", true},
		{"a run of them", "a\u200b\u200c\u2060b", "ab", "a b", true},
		{"after a space", "a \u200bb", "a b", "a b", true},
		{"before a space", "a\u200b b", "a b", "a b", true},
		{"soft hyphen", "in\u00adstruct", "instruct", "in struct", true},
		{"at the end", "ab\u200b", "ab", "ab ", true},
		{"digits apart", "4111\u200b1111", "41111111", "4111 1111", true},
		{"no-break space is a space, not ignorable", "a\u00a0b", "a b", "a b", false},
		{"tag characters spell ASCII", "x\U000E0041", "xA", "xA", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, s := Fold(tc.in), FoldSpaced(tc.in)
			if f.S != tc.fold || s.S != tc.spaced {
				t.Fatalf("Fold %q, FoldSpaced %q; want %q, %q", f.S, s.S, tc.fold, tc.spaced)
			}
			if f.Dropped != tc.dropped || s.Dropped != tc.dropped {
				t.Fatalf("Dropped %v and %v, want %v", f.Dropped, s.Dropped, tc.dropped)
			}
			// The spaced reading maps back to the original as the
			// folded one does: the whole text to the whole text.
			if st, en := s.Span(0, len(s.S)); st != 0 || en != len(tc.in) {
				t.Fatalf("Span of all of %q = [%d, %d)", s.S, st, en)
			}
		})
	}
}

// TestPos: Pos maps a position of the original to the folded text: past
// a changed piece by the difference in length, inside one to the piece's
// end (pieces that touch are one: two full-width digits in a row).
func TestPos(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		pos      []int // Pos(i) for every i from 0 to len(in)
	}{
		{"plain", "abc", []int{0, 1, 2, 3}},
		// "a", U+200B (3 bytes, dropped), "b"
		{"dropped", "a\u200bb", []int{0, 1, 1, 1, 1, 2}},
		// "x", U+FF11 U+FF12 (3 bytes each, one piece "12"), "y"
		{"full-width digits", "x\uff11\uff12y", []int{0, 1, 3, 3, 3, 3, 3, 3, 4}},
		// "a", a run of white space folded to one " ", "b"
		{"white space run", "a\n\n b", []int{0, 1, 2, 2, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Fold(tc.in)
			for i := 0; i <= len(tc.in); i++ {
				if got := f.Pos(i); got != tc.pos[i] {
					t.Errorf("Pos(%d) = %d, want %d (folded %q)", i, got, tc.pos[i], f.S)
				}
			}
		})
	}
}
