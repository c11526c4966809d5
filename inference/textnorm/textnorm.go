// Package textnorm folds text to the form a reader (and a tokenizer) sees,
// so that guardrails match what the model reads rather than the bytes a
// client chose: full-width digits, no-break and zero-width spaces, en
// dashes and look-alike letters all spell the same words and numbers to a
// model as their plain ASCII forms do.
//
// Fold keeps a map back to the original bytes, because a guardrail that
// masks must rewrite the original text (the JSON it sends on), not the
// folded copy.
package textnorm

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Folded is a text in folded form with the way back to the original.
//
// The folding, in order:
//   - Unicode NFKC: compatibility forms become their plain letters and
//     digits (full-width "４１１１" → "4111", "＠" → "@", "ﬁ" → "fi", no-break
//     and other fixed-width spaces → " ").
//   - Tag characters (U+E0020–U+E007E) become the ASCII they mirror: they
//     render as nothing, but a model reads them ("ASCII smuggling").
//   - Other default-ignorable code points (zero-width spaces and joiners,
//     soft hyphens, bidi controls, variation selectors, the language and
//     cancel tags) are dropped: they render as nothing and tokenizers
//     mostly skip them.
//   - Every run of white space (tabs, newlines, any Unicode space) becomes
//     one " ".
//   - Combining marks (nonspacing Mn, spacing Mc, and the enclosing marks
//     Me such as the keycap and the enclosing circle) on an ASCII
//     character are dropped: an
//     underline or overline drawn on a digit ("4\u0332"), a circle
//     around a letter, leave the character what it is to a reader, and
//     NFKC composes the marks Latin letters really take (é) first.
//     Marks on the letters of other scripts stay: they are spelling there.
//   - Every dash (Unicode Pd) and what is drawn as one (the minus sign,
//     the modifier letter minus, the hyphen bullet, the heavy minus sign,
//     every horizontal and vertical line of the box-drawing block) becomes "-".
//   - Decimal digits of any script become ASCII digits.
//
// Letters keep their case and script: look-alike letters are folded by
// Skeleton, which only matching needs.
type Folded struct {
	// S is the folded text.
	S string
	// Dropped reports that folding dropped a default-ignorable character
	// (see FoldSpaced: such a character may also be read as a space).
	Dropped bool
	// changed lists the pieces of S that differ from the original, in
	// order; everything between them is copied unchanged.
	changed []piece
}

// piece says S[from:to] came from original[ofrom:oto].
type piece struct{ from, to, ofrom, oto int }

// maxGrowth bounds what NFKC may make of one segment: a handful of
// characters decompose into long phrases ("ﷺ" into 18 letters), and a
// prompt of them must not multiply the memory a guardrail pass takes.
// Such characters carry no digits or Latin words to hide, so they stay as
// they are.
const maxGrowth = 4

// Fold folds s. Text that is already plain (ASCII without tabs, line
// breaks or doubled spaces) is returned as is, without allocating.
func Fold(s string) Folded { return fold(s, false, true) }

// FoldSpaced is Fold with every default-ignorable character (zero-width
// space, joiner, word joiner, soft hyphen...) read as a space instead of
// dropped. A zero-width space inside a word is nothing to a reader, but
// one that is the only separator between words ("ignore\u200bprevious")
// is a word break to a tokenizer that splits on it, so a guardrail checks
// both readings: Fold for the first, FoldSpaced for the second.
func FoldSpaced(s string) Folded { return fold(s, true, true) }

// FoldSpacedString is FoldSpaced(s).S without the way back, for a
// reading only matched, never masked: it keeps no record per change, which
// a text dense in invisible characters would make as large as the text.
func FoldSpacedString(s string) string { return fold(s, true, false).S }

func fold(s string, spaced, mapped bool) Folded {
	if plain(s) {
		return Folded{S: s}
	}
	f := folder{src: s, spaced: spaced, mapped: mapped}
	f.out = make([]byte, 0, len(s))
	var it norm.Iter // holds its buffers across segments; Form.Append would allocate them per call
	var seg []byte
	for at := 0; at < len(s); {
		// Most text is in NFKC already; only the segments after a quick
		// span are normalized, one at a time (normalization never crosses
		// a segment boundary).
		n := at + norm.NFKC.QuickSpanString(s[at:])
		f.fold(at, n)
		if n == len(s) {
			break
		}
		// The iterator gives a segment over one or more calls, advancing
		// its position with the last.
		it.InitString(norm.NFKC, s[n:])
		seg = seg[:0]
		for !it.Done() {
			seg = append(seg, it.Next()...)
			if it.Pos() > 0 {
				break
			}
		}
		end := n + it.Pos()
		f.segment(n, end, seg)
		at = end
	}
	return Folded{S: string(f.out), Dropped: f.dropped, changed: f.changed}
}

// segment appends src[from:to], whose NFKC form is nfkc.
func (f *folder) segment(from, to int, nfkc []byte) {
	switch in := f.src[from:to]; {
	case string(nfkc) == in:
		f.fold(from, to)
	case len(nfkc) > maxGrowth*len(in)+utf8.UTFMax:
		f.keep(from, to)
	default:
		f.replace(from, to, nfkc)
	}
}

// plain reports text Fold leaves unchanged. It reads eight bytes at a
// time (every prompt is read here, most of them plain).
func plain(s string) bool {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
		lows  = 0x7f7f7f7f7f7f7f7f
	)
	prevSpace := false
	i := 0
	for ; i+8 <= len(s); i += 8 {
		v := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		if v&highs != 0 {
			return false // non-ASCII
		}
		// With every byte below 0x80, (v|highs) - n*ones borrows
		// across no byte: a byte's high bit stays set iff it is >= n.
		if ((v|highs)-'\t'*ones)&^((v|highs)-('\r'+1)*ones)&highs != 0 {
			return false // \t, \n, \v, \f or \r
		}
		// The bytes that are spaces: x is zero there, and (x + lows) | x
		// has its high bit clear exactly where x is zero.
		x := v ^ ' '*ones
		spaces := ^((x + lows) | x) & highs
		if spaces&(spaces<<8) != 0 || prevSpace && spaces&0x80 != 0 {
			return false // a doubled space
		}
		prevSpace = spaces>>63 != 0
	}
	prev := byte(0)
	if prevSpace {
		prev = ' '
	}
	for ; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf || (c < ' ' && asciiSpace(c)) || (c == ' ' && prev == ' ') {
			return false
		}
		prev = c
	}
	return true
}

func asciiSpace(c byte) bool { return c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' }

type folder struct {
	src     string
	out     []byte
	changed []piece
	// spaced: ignorable characters read as a space (FoldSpaced);
	// dropped: one was met; mapped: changed is kept.
	spaced, dropped, mapped bool
}

// fold appends src[from:to] (in NFKC already) rune by rune.
func (f *folder) fold(from, to int) {
	for i := from; i < to; {
		// The common case: a run of ASCII that stays as it is.
		start := i
		for i < to {
			c := f.src[i]
			if c >= utf8.RuneSelf || asciiSpace(c) || (c == ' ' && (i > start && f.src[i-1] == ' ' || i == start && f.afterSpace())) {
				break
			}
			i++
		}
		f.out = append(f.out, f.src[start:i]...)
		if i == to {
			return
		}
		r, n := utf8.DecodeRuneInString(f.src[i:])
		at := len(f.out)
		if mark(r) && f.onASCII() {
			// Dropped with its base: the base and its marks are one
			// piece, so a finding that ends at the base masks them too,
			// and a run of marked characters is one piece, not one per
			// mark.
			if k := len(f.changed) - 1; k >= 0 && f.changed[k].to == at {
				f.record(at, i, i+n) // the base ends a piece already
			} else {
				f.record(at-1, i-1, i+n) // the base was copied as it is
			}
			i += n
			continue
		}
		f.appendRune(r)
		if string(f.out[at:]) != f.src[i:i+n] {
			f.record(at, i, i+n)
		}
		i += n
	}
}

// onASCII reports that the last character out is ASCII: a mark that
// comes next sits on it (invisible characters between render as nothing).
func (f *folder) onASCII() bool { return len(f.out) > 0 && f.out[len(f.out)-1] < utf8.RuneSelf }

// mark reports a combining mark: nonspacing (Mn), enclosing (Me) or
// spacing (Mc).
func mark(r rune) bool { return r >= 0x300 && unicode.In(r, unicode.Mn, unicode.Me, unicode.Mc) }

// keep appends src[from:to] unchanged, as one piece the matchers may not
// look inside.
func (f *folder) keep(from, to int) {
	at := len(f.out)
	f.out = append(f.out, f.src[from:to]...)
	f.record(at, from, to)
}

// replace appends the NFKC form of src[from:to], folded, as one changed
// piece: a match that starts or ends inside it covers all of it.
func (f *folder) replace(from, to int, nfkc []byte) {
	at := len(f.out)
	for len(nfkc) > 0 {
		r, n := utf8.DecodeRune(nfkc)
		if !mark(r) || !f.onASCII() {
			f.appendRune(r)
		}
		nfkc = nfkc[n:]
	}
	f.record(at, from, to)
}

// record notes that out[at:] came from src[from:to], merging with the
// previous piece when they touch (a run of white space is one piece) or
// only one byte copied as it is stands between them: a text dense in
// invisible characters or marks ("x\u200bx\u200b…") would otherwise make
// a piece every few bytes, a map larger than the text. A finding that
// reaches into such a run maps to all of it, which masking only widens.
func (f *folder) record(at, from, to int) {
	if !f.mapped {
		return
	}
	if k := len(f.changed) - 1; k >= 0 {
		p := &f.changed[k]
		if gap := at - p.to; (gap == 0 || gap == 1) && from-p.oto == gap {
			p.to, p.oto = len(f.out), to
			return
		}
	}
	f.changed = append(f.changed, piece{at, len(f.out), from, to})
}

func (f *folder) afterSpace() bool { return len(f.out) > 0 && f.out[len(f.out)-1] == ' ' }

// appendRune appends the folded form of one (NFKC) rune.
func (f *folder) appendRune(r rune) {
	switch {
	case unicode.IsSpace(r) || unicode.Is(unicode.Zs, r):
		if !f.afterSpace() {
			f.out = append(f.out, ' ')
		}
	case r < utf8.RuneSelf:
		f.out = append(f.out, byte(r))
	case r >= tagFirst && r <= tagLast:
		// A tag character renders as nothing but spells its ASCII
		// ("ASCII smuggling"): tokenizers give it tokens a model can read.
		f.out = append(f.out, byte(r-tagBase))
	case ignorable(r):
		f.dropped = true
		if f.spaced && !f.afterSpace() {
			f.out = append(f.out, ' ')
		}
	case unicode.Is(unicode.Pd, r) || dashLike(r):
		f.out = append(f.out, '-')
	case unicode.Is(unicode.Nd, r):
		f.out = append(f.out, byte('0'+digitValue(r)))
	default:
		f.out = utf8.AppendRune(f.out, r)
	}
}

// ignorable approximates Unicode's Default_Ignorable_Code_Point: format
// characters (Cf: zero-width space and joiners, soft hyphen, bidi
// controls, the BOM), variation selectors, and the other code points
// Unicode lists as invisible (combining grapheme joiner, Hangul fillers).
func ignorable(r rune) bool {
	return unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Variation_Selector, r) ||
		unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r)
}

// digitValue is the value of a decimal digit of any script: Unicode
// allocates each script's digits 0–9 as a contiguous run of ten, so the
// value is the distance from the run's start, modulo ten for the few
// blocks that hold several runs back to back.
func digitValue(r rune) int {
	zero := r
	for unicode.Is(unicode.Nd, zero-1) {
		zero--
	}
	return int(r-zero) % 10
}

// Span maps a span of S back to the original text: the smallest span of
// the original whose folding covers S[start:end]. A span that begins or
// ends inside a changed piece widens to the whole piece, so the original
// span is always whole characters.
func (f *Folded) Span(start, end int) (int, int) {
	return f.orig(start, false), f.orig(end, true)
}

// Pos maps a position of the original text to S: the position in S where
// the folding of original[i:] begins (a position inside a changed piece
// maps to that piece's end in S, as if the piece were behind it).
func (f *Folded) Pos(i int) int {
	// k is the number of pieces that begin before i in the original.
	k := sort.Search(len(f.changed), func(n int) bool { return f.changed[n].ofrom >= i })
	if k == 0 {
		return i
	}
	p := f.changed[k-1]
	if i < p.oto {
		return p.to
	}
	return p.to + (i - p.oto)
}

// orig maps a position of S to the original. An end position belongs to
// the piece it closes (pieces that begin there are not part of the span);
// a start position to the piece it opens.
func (f *Folded) orig(j int, isEnd bool) int {
	// k is the number of pieces that begin before j (at or before, for a start).
	k := sort.Search(len(f.changed), func(i int) bool {
		if isEnd {
			return f.changed[i].from >= j
		}
		return f.changed[i].from > j
	})
	if k == 0 {
		return j
	}
	p := f.changed[k-1]
	if j < p.to || (isEnd && j == p.to) {
		if isEnd {
			return p.oto
		}
		return p.ofrom
	}
	return p.oto + (j - p.to)
}

// Latin replaces letters that are drawn like Latin letters in other
// scripts (Cyrillic "о", Greek "Ι") with those Latin letters, keeping
// their case, so that a pattern written in Latin matches a word spelt with
// look-alikes. Its result is for matching only: it turns real Cyrillic and
// Greek words into mixed-script strings.
func Latin(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return s
	}
	return strings.Map(func(r rune) rune {
		if r < lookalikeMin || r > lookalikeMax {
			return r // most letters of most scripts: no map lookup
		}
		if l, ok := lookalike[r]; ok {
			return l
		}
		return r
	}, s)
}

// Skeleton is the key phrases are compared by: accents and other
// combining marks removed ("ignóre" reads as "ignore" to a model), Latin,
// lower-cased. s is Folded already. Skeleton changes lengths; its result
// is for matching only, never for rewriting.
func Skeleton(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return strings.ToLower(Latin(withoutMarks(s)))
		}
	}
	return strings.ToLower(s) // ASCII: no marks, no look-alikes
}

// Compact is Skeleton without spaces (nor NUL, which a guardrail puts
// between the texts of a JSON tree): the key contains phrases are
// compared by. With every space gone on both sides, a phrase matches
// whatever separates its words in the text (one space, none, a
// zero-width character read as nothing, the join between two content
// parts) and also a word split inside by a space ("ig nore"): contains is
// substring matching already, and text that spells the phrase with its
// spaces moved is still the phrase to a reader.
func Compact(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return strings.Map(func(r rune) rune {
				if r == ' ' || r == 0 {
					return -1
				}
				return r
			}, Skeleton(s))
		}
	}
	// ASCII: lower case and spaces dropped in one pass.
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == 0:
			continue
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		}
		out = append(out, c)
	}
	return string(out)
}

// withoutMarks decomposes s (NFD) and drops its combining marks
// (nonspacing and enclosing).
func withoutMarks(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.In(r, unicode.Mn, unicode.Me) {
			return -1
		}
		return r
	}, norm.NFD.String(s))
}

// The tag characters, and the base that maps them to ASCII.
const (
	tagBase  = 0xE0000
	tagFirst = tagBase + 0x20
	tagLast  = tagBase + 0x7E
)

// lookalike maps Cyrillic and Greek letters to the Latin letter they are
// drawn like in common fonts (after Unicode's confusables data,
// restricted to whole-letter look-alikes). Upper and lower case are
// listed apart because they differ: Cyrillic "Н" looks like "H", "н" does not.
var lookalike = map[rune]rune{
	// Cyrillic capitals
	'А': 'A', 'В': 'B', 'Е': 'E', 'З': '3', 'К': 'K', 'М': 'M', 'Н': 'H', 'О': 'O', 'Р': 'P', 'С': 'C',
	'Т': 'T', 'У': 'Y', 'Х': 'X', 'Ѕ': 'S', 'І': 'I', 'Ј': 'J', 'Ԛ': 'Q', 'Ԝ': 'W', 'Ү': 'Y', 'Ӏ': 'l',
	// Cyrillic small letters
	'а': 'a', 'е': 'e', 'о': 'o', 'р': 'p', 'с': 'c', 'у': 'y', 'х': 'x', 'ѕ': 's', 'і': 'i', 'ј': 'j',
	'ԁ': 'd', 'һ': 'h', 'ԛ': 'q', 'ԝ': 'w', 'ӏ': 'l', 'ү': 'y', 'ѵ': 'v',
	// Greek capitals
	'Α': 'A', 'Β': 'B', 'Ε': 'E', 'Ζ': 'Z', 'Η': 'H', 'Ι': 'I', 'Κ': 'K', 'Μ': 'M', 'Ν': 'N', 'Ο': 'O',
	'Ρ': 'P', 'Τ': 'T', 'Υ': 'Y', 'Χ': 'X',
	// Greek small letters
	'α': 'a', 'ι': 'i', 'κ': 'k', 'ν': 'v', 'ο': 'o', 'ρ': 'p', 'τ': 't', 'υ': 'u', 'χ': 'x',
	// Letters of other blocks and scripts that NFKC leaves alone
	'ı': 'i', 'ɑ': 'a', 'ɡ': 'g', 'ո': 'n', 'ս': 'u', 'օ': 'o',
}

// lookalikeMin and lookalikeMax bound the letters lookalike maps.
var lookalikeMin, lookalikeMax = func() (lo, hi rune) {
	lo, hi = utf8.MaxRune, 0
	for r := range lookalike {
		lo, hi = min(lo, r), max(hi, r)
	}
	return lo, hi
}()

// dashLike reports the characters outside Unicode's dash punctuation (Pd)
// that are drawn as a dash, and that a reader (and a model) takes for one
// between the digit groups of a number.
func dashLike(r rune) bool {
	switch r {
	case '\u2212', // minus sign (Sm)
		'\u02D7',           // modifier letter minus sign
		'\u2043',           // hyphen bullet
		'\u2796',           // heavy minus sign
		'\u23AF',           // horizontal line extension
		'\u2E3A', '\u2E3B': // two- and three-em dash (Pd already, listed for the reader)
		return true
	}
	// The box-drawing block's lines, horizontal, vertical and light or
	// heavy alike (U+2500–U+257F, and the corner and junction pieces):
	// drawn between digit groups they separate them as a dash does.
	return r >= 0x2500 && r <= 0x257F
}
