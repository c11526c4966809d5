package policy

import (
	"regexp/syntax"
	"slices"
	"strings"

	"github.com/infergate/infergate/inference"
	"github.com/infergate/infergate/inference/pii"
	"github.com/infergate/infergate/inference/textnorm"
)

// The guardrails read the prompt's texts joined in prompt order, one
// space between two non-empty texts, because a chat template prints them
// one after the other: content parts back to back (vLLM joins them with a
// newline), messages in order with at most a role header between. A
// phrase or a number split over two parts or messages ("ignore previous"
// | "instructions", "4111 1111" | "1111 1111") is whole to the model, so
// it must be whole to the rules. One space, rather than nothing: it reads
// as the newline or header a template puts there (white space to the
// detectors and to \b), it never glues two numbers into a third that
// neither text holds ("12" | "34" is not 1234), and it keeps each text's
// own findings whole; contains phrases ignore spaces altogether
// (textnorm.Compact), so for them the choice does not matter.
//
// Only the joined string is built, never a record per text: a body of
// millions of empty strings must cost what its bytes cost. A text's place
// in the join is found again by walking the texts in the same order, and
// its value read there (by its length and first byte) rather than decoded
// again.

// sepByte is what stands between two non-empty texts in the join;
// treeSep between two texts of a tree read whole (tool definitions and
// calls, template kwargs, documents). A template prints a tree with
// tojson, so the model sees ["128", "64", "1024"] or {"shape": [128,
// 64, 1024]}: its values stand apart by quotes and commas, never run on
// as the groups of one number ("128 64 1024" read as an SSN). The NUL
// byte is no separator of digit groups, no letter and no space to the
// detectors, a non-word to \b, and contains phrases drop it as they drop
// spaces (so a phrase split over two strings of a tree is still found).
const (
	sepByte = ' '
	treeSep = 0
)

// maxPresize bounds the room a join is given before its first text: the
// bound it starts from (inference.Body.TextBound) counts the bytes of
// the fields the texts come from, which a body of millions of empty
// strings makes large and the join leaves unused.
const maxPresize = 256 << 10

// joiner builds one join, text by text, and says where each text is in it.
type joiner struct {
	sb  *strings.Builder // nil: positions only
	pos int
	any bool
	// space: the join so far ends with white space; tree: its last
	// text is of a tree.
	space, tree bool
}

// sep is the separator that goes before a text (see treeSep).
func (j *joiner) sep(tree bool) byte {
	if tree && j.tree {
		return treeSep
	}
	return sepByte
}

// sepBefore says whether a separator goes before a text of n bytes that
// starts with first. None goes where white space already stands on
// either side: the texts are apart already, and a doubled space would
// make the common plain join one that folding must copy.
func (j *joiner) sepBefore(n int, first byte) bool {
	return n > 0 && j.any && !j.space && !asciiSpace(first)
}

// advance accounts for a non-empty text of n bytes from first to last
// (of a tree or not) and returns where it starts in the join and the
// separator that goes before it (-1: none).
func (j *joiner) advance(n int, first, last byte, tree bool) (off, sep int) {
	sep = -1
	if j.sepBefore(n, first) {
		sep = int(j.sep(tree))
		j.pos++
	}
	off = j.pos
	j.pos += n
	j.any, j.space, j.tree = true, asciiSpace(last), tree
	return off, sep
}

// place appends v, the value of a text of a tree or not, and returns
// where it starts in the join.
func (j *joiner) place(v string, tree bool) int {
	if v == "" {
		return j.pos
	}
	off, sep := j.advance(len(v), v[0], v[len(v)-1], tree)
	if j.sb != nil {
		if sep >= 0 {
			j.sb.WriteByte(byte(sep))
		}
		j.sb.WriteString(v)
	}
	return off
}

// placeBytes is place for a value in bytes; j.sb must be set.
func (j *joiner) placeBytes(v []byte, tree bool) int {
	if len(v) == 0 {
		return j.pos
	}
	off, sep := j.advance(len(v), v[0], v[len(v)-1], tree)
	if sep >= 0 {
		j.sb.WriteByte(byte(sep))
	}
	j.sb.Write(v)
	return off
}

// placeText appends the value of t, decoded straight into the join (no
// string per text).
func (j *joiner) placeText(t inference.Text) {
	n, first := t.Head()
	if n == 0 {
		return
	}
	if j.sepBefore(n, first) {
		j.pos++
		j.sb.WriteByte(j.sep(t.Tree()))
	}
	t.WriteValue(j.sb)
	j.pos += n
	s := j.sb.String() // no copy
	j.any, j.space, j.tree = true, asciiSpace(s[len(s)-1]), t.Tree()
}

// locate walks a join s again: it places a text of n bytes that starts
// with first, as place did when s was built, and returns where the text
// is in s, so that its value is s[off:off+n] without decoding it again.
func (j *joiner) locate(s string, n int, first byte, tree bool) int {
	if n == 0 {
		return j.pos
	}
	off, _ := j.advance(n, first, 0, tree)
	j.space = asciiSpace(s[j.pos-1])
	return off
}

func asciiSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// pre is a text's value after the per-text pass (the k-th text Texts
// visits), kept only for texts that pass changed.
type pre struct {
	k int
	v string
}

// walker walks the texts in prompt order with their values as the
// per-text pass left them. One walker serves all the walks over a
// request's texts, and keeps a walk's state rather than closures: a
// closure given to inference.Body.Texts escapes, and with it every
// variable it captures, an allocation each per walk.
type walker struct {
	p    *Policy
	body *inference.Body
	pre  []pre
	// join0 is the join of those values (see join).
	join0 string
	// used: bit i, pii rule i masked something.
	used uint64

	// The walk in progress: the k-th text, the next entry of pre, and
	// what is done with each text (given its value and changed when
	// the per-text pass changed it).
	k, next int
	visit   func(w *walker, t inference.Text, v string, changed bool)

	// The join being built (join and remask).
	sb strings.Builder
	j  joiner

	// join: whether roles are checked, the roles masked, a rejection.
	checkRoles bool
	roles      []pre
	rej        *Result

	// remask: the levels, the edits, whether the last level covered a
	// text, and room for a text being masked.
	levels  []*level
	te      inference.TextEdits
	touched bool
	scratch []byte
}

// walk runs visit over the texts, until a rejection.
func (w *walker) walk(visit func(w *walker, t inference.Text, v string, changed bool)) {
	w.k, w.next, w.visit = 0, 0, visit
	w.body.Texts(w.step)
}

func (w *walker) step(t inference.Text) bool {
	if w.next < len(w.pre) && w.pre[w.next].k == w.k {
		w.visit(w, t, w.pre[w.next].v, true)
		w.next++
	} else {
		w.visit(w, t, "", false)
	}
	w.k++
	return w.rej == nil
}

// startJoin starts a join in w.sb with room for n bytes.
func (w *walker) startJoin(n int) {
	w.sb = strings.Builder{}
	w.sb.Grow(n)
	w.j = joiner{sb: &w.sb}
}

// join returns the texts joined, as the per-text pass left them, roles
// left out; with checkRoles each role is checked on its own (see
// checkRole), leaving a masked role in w.roles and a rejection in w.rej.
func (w *walker) join(checkRoles bool) string {
	w.startJoin(min(w.body.TextBound(), maxPresize))
	w.checkRoles = checkRoles
	w.walk((*walker).joinText)
	return w.sb.String()
}

func (w *walker) joinText(t inference.Text, v string, changed bool) {
	switch {
	case t.Role():
		if w.checkRoles {
			w.checkRole(t, v, changed)
		}
	case changed:
		w.j.place(v, t.Tree())
	default:
		w.j.placeText(t)
	}
}

// checkRole runs every rule on a role alone (see inference.Text.Role).
// The common roles are known at start-up to match no rule.
func (w *walker) checkRole(t inference.Text, v string, changed bool) {
	if !changed {
		if w.p.plainRole(t) {
			return
		}
		v = t.Value()
	}
	masked, rej := w.p.checkRole(v, &w.used)
	switch {
	case rej != nil:
		w.rej = rej
	case masked != v:
		w.roles = append(w.roles, pre{w.k, masked})
	}
}

// mergePre merges two lists of per-text values sorted by text; b's value
// wins for a text in both (it was computed from a's).
func mergePre(a, b []pre) []pre {
	if len(b) == 0 {
		return a
	}
	out := make([]pre, 0, len(a)+len(b))
	for len(a) > 0 || len(b) > 0 {
		switch {
		case len(b) == 0 || len(a) > 0 && a[0].k < b[0].k:
			out, a = append(out, a[0]), a[1:]
		case len(a) > 0 && a[0].k == b[0].k:
			out, a, b = append(out, b[0]), a[1:], b[1:]
		default:
			out, b = append(out, b[0]), b[1:]
		}
	}
	return out
}

// level is one masking pass's findings in the join of that pass: sorted,
// overlaps merged into the first.
type level struct {
	fs []finding
	// k: the first finding that does not end before the current text.
	k int
	j joiner
}

// apply masks the text v at off in the level's join, appending the
// result to dst: a finding's replacement goes into the first text it
// covers, and the rest of the text it covers is removed. touched reports
// that a finding covered a byte of v; dst is unchanged otherwise (v stays
// as it is). A text no finding covers is passed over by its place alone.
func (l *level) apply(dst []byte, v string, off int, rules []piiRule, used *uint64) (_ []byte, touched bool) {
	end := off + len(v)
	for l.k < len(l.fs) && l.fs[l.k].end <= off {
		l.k++
	}
	if v == "" || l.k == len(l.fs) || l.fs[l.k].start >= end {
		return dst, false
	}
	at := 0
	for n := l.k; n < len(l.fs) && l.fs[n].start < end; n++ {
		f := &l.fs[n]
		s, e := max(f.start, off)-off, min(f.end, end)-off
		dst = append(dst, v[at:s]...)
		if !f.placed {
			dst = append(dst, rules[f.rule].replacement...)
			f.placed = true
			*used |= 1 << f.rule
		}
		at = e
	}
	return append(dst, v[at:]...), true
}

// newLevel sorts fs and merges overlapping findings into the first.
func newLevel(fs []finding) *level {
	slices.SortFunc(fs, func(a, b finding) int { return a.start - b.start })
	out := fs[:0]
	for _, f := range fs {
		if n := len(out); n > 0 && f.start < out[n-1].end {
			out[n-1].end = max(out[n-1].end, f.end)
			continue
		}
		out = append(out, f)
	}
	return &level{fs: out}
}

// remask applies every level so far to the texts, from the per-text
// values: it returns the join of the result (the next pass's text), the
// edits that turn the body into it, and whether the last level covered
// any text at all (a finding may lie wholly in the spaces between texts,
// which no edit can change). j is the join the last level was found in.
//
// A text's value is read from the first level's join (w.join0), where
// its length and first byte place it, rather than decoded again; the
// last level writes its result into the next join, and the edit is made
// from there.
func (w *walker) remask(levels []*level, j string) (string, []inference.Edit, bool) {
	w.te = inference.TextEdits{}
	if len(levels) == 0 {
		w.walk((*walker).editPre)
		return j, w.te.Edits(), false
	}
	grow := len(j)
	for _, l := range levels {
		l.k, l.j = 0, joiner{}
		for i := range l.fs {
			l.fs[i].placed = false
		}
	}
	for _, f := range levels[len(levels)-1].fs {
		grow += len(w.p.pii[f.rule].replacement) + 1 // and a separator where a text's edge changed
	}
	w.startJoin(grow)
	w.levels, w.touched = levels, false
	w.walk((*walker).remaskText)
	return w.sb.String(), w.te.Edits(), w.touched
}

// editPre gives the texts the per-text pass changed their new values.
func (w *walker) editPre(t inference.Text, v string, changed bool) {
	if changed {
		w.te.Set(t, v)
	}
}

// head is the length and first byte of a text's value as the walk has
// it: the body's (read in place, no copy) unless an earlier pass changed
// it to v. They are what joiner.locate finds the text in the join by.
func head(t inference.Text, v string, changed bool) (n int, first byte) {
	switch {
	case !changed:
		return t.Head()
	case v != "":
		return len(v), v[0]
	}
	return 0, 0
}

func (w *walker) remaskText(t inference.Text, v string, changed bool) {
	if t.Role() {
		w.editPre(t, v, changed)
		return
	}
	n, first := head(t, v, changed)
	tree := t.Tree()
	off := w.levels[0].j.locate(w.join0, n, first, tree)
	v = w.join0[off : off+n]
	last := len(w.levels) - 1
	for i, l := range w.levels[:last] {
		if i > 0 {
			off = l.j.place(v, tree)
		}
		var hit bool
		if w.scratch, hit = l.apply(w.scratch[:0], v, off, w.p.pii, &w.used); hit {
			v, changed = string(w.scratch), true
		}
	}
	l := w.levels[last]
	if last > 0 {
		off = l.j.place(v, tree)
	}
	var hit bool
	if w.scratch, hit = l.apply(w.scratch[:0], v, off, w.p.pii, &w.used); hit {
		at := w.j.placeBytes(w.scratch, tree)
		v, changed, w.touched = w.sb.String()[at:at+len(w.scratch)], true, true
	} else {
		w.j.place(v, tree)
	}
	if changed {
		w.te.Set(t, v)
	}
}

// anchored reports whether a regular expression asserts the start or end
// of its text or of a line: on the join of all texts it would mean the
// start or end of the join, so such a rule also runs on each text alone.
func anchored(expr string) bool {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return false
	}
	return hasAnchor(re)
}

func hasAnchor(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText:
		return true
	}
	for _, sub := range re.Sub {
		if hasAnchor(sub) {
			return true
		}
	}
	return false
}

// crossFind completes the findings of the readings (the folds of one
// text) and of the regular expressions: where one finding ends, a number
// may start that another reading (or the built-in scan) took for the
// middle of a longer one: "1136\u200b6295 0807 …" is one number folded
// and two in the spaced fold. Masking the first finding puts a non-digit
// there, and the next pass would find what starts after it, and so on
// one finding a pass. Trying a match at each end now finds in one pass
// what masking would uncover.
func (p *Policy) crossFind(fs []finding, readings ...*textnorm.Folded) []finding {
	var small [32]int
	tried := posSet{small: small[:0]}
	for n := 0; n < len(fs); n++ {
		e := fs[n].end
		if !tried.add(e) {
			continue
		}
		for _, r := range readings {
			if r.S != "" {
				fs = p.matchAfter(fs, r.S, r.Pos(e), r.Span)
			}
		}
	}
	return fs
}

// posSet is a set of positions: a short list searched in place while
// it is short (a prompt holds a few findings), a map beyond.
type posSet struct {
	small []int
	big   map[int]bool
}

// add adds i and reports whether it is new.
func (s *posSet) add(i int) bool {
	if s.big != nil {
		if s.big[i] {
			return false
		}
		s.big[i] = true
		return true
	}
	if slices.Contains(s.small, i) {
		return false
	}
	if len(s.small) < cap(s.small) {
		s.small = append(s.small, i)
		return true
	}
	s.big = make(map[int]bool, 2*len(s.small))
	for _, j := range s.small {
		s.big[j] = true
	}
	s.big[i] = true
	return true
}

// matchAfter appends the built-in finding that starts at i in s, or just
// after a dot there, when the scan could not start one there because a
// digit (or a digit and a dot) comes before it; span maps s to the
// original.
func (p *Policy) matchAfter(fs []finding, s string, i int, span func(int, int) (int, int)) []finding {
	if i < len(s) && s[i] == '.' {
		i++
	}
	if i <= 0 || i >= len(s) || !(isDigit(s[i-1]) || s[i-1] == '.' && i > 1 && isDigit(s[i-2])) {
		return fs
	}
	m, ok := pii.MatchAt(s, i, p.kinds)
	if !ok {
		return fs
	}
	start, end := span(m.Start, m.End)
	return append(fs, finding{start: start, end: end, rule: p.ruleOfKind[m.Kind]})
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// guardText runs the deny and personal-data rules over the texts: rules
// whose expressions are anchored first on each text alone, then every
// rule on the join. It returns the edits that mask the body and the
// rules that masked something (bit i: pii rule i).
func (p *Policy) guardText(body *inference.Body) ([]inference.Edit, uint64, *Result) {
	w := &walker{p: p, body: body}
	if p.perText {
		if rej := p.perTextPass(w, &w.used); rej != nil {
			return nil, 0, rej
		}
	}
	joined := w.join(true)
	if w.rej != nil {
		return nil, 0, w.rej
	}
	preMasked := len(w.pre) > 0
	w.pre, w.join0 = mergePre(w.pre, w.roles), joined
	folded := textnorm.Fold(joined)
	if len(p.deny) > 0 {
		// Deny rules read the texts as sent, before any masking.
		orig, origFolded := joined, folded
		if preMasked {
			orig = (&walker{p: p, body: body}).join(false)
			origFolded = textnorm.Fold(orig)
		}
		if r := p.denied(orig, origFolded, false); r != nil {
			res := reject(403, ReasonDenied, r.name, "%s", r.message)
			return nil, 0, &res
		}
	}
	if len(p.pii) == 0 {
		return nil, 0, nil
	}
	edits, rej := p.maskJoined(w, folded)
	return edits, w.used, rej
}

// plainRole reports a role that is one of the common roles no rule
// matches (found at start-up), read without a copy.
func (p *Policy) plainRole(t inference.Text) bool {
	for _, r := range p.plainRoles {
		if t.Is(r) {
			return true
		}
	}
	return false
}

// checkRole runs every rule on a role alone (see inference.Text.Role):
// it returns the role masked, or the rejection.
func (p *Policy) checkRole(v string, used *uint64) (string, *Result) {
	if slices.Contains(p.plainRoles, v) {
		return v, nil
	}
	folded := textnorm.Fold(v)
	if r := p.denied(v, folded, false); r != nil {
		res := reject(403, ReasonDenied, r.name, "%s", r.message)
		return "", &res
	}
	masked, _, rej := p.mask(v, folded, used, false)
	return masked, rej
}

// commonRoles are the roles of the chat APIs.
var commonRoles = [...]string{"system", "developer", "user", "assistant", "tool", "function", "model"}

// findPlainRoles returns the common roles no rule matches.
func (p *Policy) findPlainRoles() []string {
	var out []string
	for _, r := range commonRoles {
		var used uint64
		if masked, rej := p.checkRole(r, &used); rej == nil && masked == r {
			out = append(out, r)
		}
	}
	return out
}

// perTextPass runs the anchored rules on each text alone, as they were
// written for: a deny rule that matches rejects, a reject rule that finds
// anything rejects, and mask rules leave their values in w.pre.
func (p *Policy) perTextPass(w *walker, used *uint64) *Result {
	var rej *Result
	k := 0
	w.body.Texts(func(t inference.Text) bool {
		value := t.Value()
		folded := textnorm.Fold(value)
		if r := p.denied(value, folded, true); r != nil {
			res := reject(403, ReasonDenied, r.name, "%s", r.message)
			rej = &res
			return false
		}
		masked, changed, mrej := p.mask(value, folded, used, true)
		if mrej != nil {
			rej = mrej
			return false
		}
		if changed {
			w.pre = append(w.pre, pre{k, masked})
		}
		k++
		return true
	})
	return rej
}

// maskJoined applies the personal-data rules to the join j of the texts:
// a reject rule that finds anything rejects; mask rules replace their
// findings in the texts they cover. It repeats until no rule finds
// anything in the join of the masked texts, so no detected personal data
// survives, and returns the edits.
func (p *Policy) maskJoined(w *walker, folded textnorm.Folded) ([]inference.Edit, *Result) {
	var levels []*level
	var edits []inference.Edit
	var fs []finding
	var ms []pii.Match
	j := w.join0
	for pass := 0; ; pass++ {
		if pass > 0 {
			folded = textnorm.Fold(j)
		}
		fs, ms = p.findJoined(fs[:0], ms, j, &folded)
		if len(fs) == 0 {
			break
		}
		if rej := p.checkFindings(fs); rej != nil {
			return nil, rej
		}
		if pass == maxMaskPasses {
			res := reject(403, ReasonPII, p.pii[fs[0].rule].name, "personal data could not be masked: %v", errUnmaskable)
			return nil, &res
		}
		levels = append(levels, newLevel(slices.Clone(fs)))
		var touched bool
		j, edits, touched = w.remask(levels, j)
		if !touched {
			// What is left lies in the spaces between texts.
			return edits, nil
		}
	}
	if len(levels) == 0 && len(w.pre) > 0 {
		_, edits, _ = w.remask(nil, j)
	}
	return edits, nil
}

// findJoined appends the findings of every rule in j, completed by
// crossFind. The detectors read j folded and, when folding dropped an
// invisible character, folded with such characters as spaces (one of
// them may be all that separates a number from the next); expressions
// read j folded and as sent.
//
// The second reading of the detectors is the spaced fold rather than the
// text as sent because it splits numbers only where the first reading
// glues them: every break of the first is one of the second, so neither
// reading's finding can cut short a number the other reads (as a run of
// digit groups) and leave the rest to be found only once masking has cut
// it. The text as sent splits numbers at every non-ASCII byte (a no-break
// space, an en dash), and masking what it found uncovered one more
// number a pass: the cause of ten test cards failing to converge.
func (p *Policy) findJoined(fs []finding, ms []pii.Match, j string, folded *textnorm.Folded) ([]finding, []pii.Match) {
	fs, ms = p.find(fs, ms, folded.S, folded.Span, findAll)
	var spaced textnorm.Folded
	if folded.Dropped && p.kinds != 0 {
		// The same as the folded reading when every dropped character
		// stood next to a space: its findings are found already.
		if spaced = textnorm.FoldSpaced(j); spaced.S != folded.S {
			fs, ms = p.find(fs, ms, spaced.S, spaced.Span, findBuiltin)
		}
	}
	if folded.S != j {
		// As sent too: folding can also join what the text keeps apart
		// ("+44…  000": a doubled space ends a phone number, one does not).
		fs, ms = p.find(fs, ms, j, nil, findAll)
	}
	if p.kinds == 0 || len(fs) == 0 {
		return fs, ms
	}
	// One reading of built-in findings alone needs no completion: the
	// scan starts afresh after each of its findings.
	cross := folded.S != j
	for _, f := range fs {
		cross = cross || p.pii[f.rule].re != nil
	}
	if cross {
		asSent := textnorm.Folded{S: j}
		fs = p.crossFind(fs, folded, &spaced, &asSent)
	}
	return fs, ms
}
