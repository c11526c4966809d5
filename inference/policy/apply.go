package policy

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/infergate/infergate/inference"
	"github.com/infergate/infergate/inference/pii"
	"github.com/infergate/infergate/inference/textnorm"
	"github.com/infergate/infergate/inference/wire"
)

// The reasons a rejection carries (in wire.DropReasonHeader).
const (
	ReasonTooLarge         = "request-too-large"
	ReasonInvalidJSON      = "invalid-json"
	ReasonMissingModel     = "missing-model"
	ReasonInvalidModel     = "invalid-model"
	ReasonDuplicateKey     = "duplicate-key"
	ReasonTemplateOverride = "template-override"
	ReasonUnreadText       = "unread-text"
	ReasonModelNotAllowed  = "model-not-allowed"
	ReasonModelNotFound    = "model-not-found"
	ReasonPromptTooLarge   = "prompt-too-large"
	ReasonPromptTooLong    = "prompt-too-many-tokens"
	ReasonMaxTokensTooHigh = "max-tokens-too-high"
	ReasonInvalidMaxTokens = "invalid-max-tokens"
	ReasonDenied           = "denied"
	ReasonPII              = "pii"
	ReasonTooManyFindings  = "too-many-findings"
)

// OwnHeaders are the request headers only the processor may set: a client
// copy is removed (or overwritten) so it cannot steer routing or claim
// masking.
func OwnHeaders() []string {
	return []string{wire.ModelNameHeader, wire.BaseModelNameHeader, wire.MaskedHeader}
}

// maxMaskPasses bounds re-masking: a pass can in theory join text into a
// new finding, and the result must hold none.
const maxMaskPasses = 4

// Policy is a compiled Config; safe for concurrent use.
type Policy struct {
	limits        Limits
	maxFindings   int
	clamp         bool
	base          map[string]string
	rejectUnknown bool
	allowTemplate bool
	strictText    bool
	allow         []string
	kinds         pii.Set
	ruleOfKind    [16]int
	pii           []piiRule
	deny          []denyRule
	lowerText     bool
	// maxPhrase is the length of the longest contains phrase (compact);
	// firstPhraseRule the first deny rule that has one.
	maxPhrase, firstPhraseRule int
	// perText: some rule's expression is anchored (see anchored) and
	// also runs on each text alone.
	perText bool
	// plainRoles are the common roles no rule matches (checkRole).
	plainRoles []string
}

type piiRule struct {
	name        string
	re          *regexp.Regexp
	reject      bool
	replacement string
	anchored    bool
}

type denyRule struct {
	name     string
	contains []string
	phrases  [][]byte // contains, as bytes
	re       *regexp.Regexp
	message  string
	anchored bool
}

// Result is the decision for one request body.
type Result struct {
	Model, BaseModel string
	// Stream is the request's "stream": true.
	Stream bool
	// Body is the rewritten body (masked text, clamped max_tokens); nil
	// when the body goes on unchanged.
	Body []byte
	// Masked names the rules that masked something, in rule order.
	Masked []string
	// Reject, when set, is the answer to send instead of forwarding.
	Reject *Rejection
}

// Rejection is an error answer.
type Rejection struct {
	Status int
	Reason string
	// Rule names the guardrail that refused, if one did.
	Rule    string
	Message string
}

// Headers returns the request headers to set for a forwarded request.
func (r *Result) Headers() [][2]string {
	h := [][2]string{{wire.ModelNameHeader, r.Model}, {wire.BaseModelNameHeader, r.BaseModel}}
	if len(r.Masked) > 0 {
		h = append(h, [2]string{wire.MaskedHeader, strings.Join(r.Masked, ",")})
	}
	return h
}

// Response renders a rejection as the HTTP answer both deliveries send:
// headers and an OpenAI-style JSON error body.
func (r *Rejection) Response() (headers [][2]string, body []byte) {
	headers = [][2]string{{"content-type", "application/json"}, {wire.DropReasonHeader, r.Reason}}
	if r.Rule != "" {
		headers = append(headers, [2]string{wire.GuardrailHeader, r.Rule})
	}
	return headers, inference.ErrorJSON(r.Status, r.Reason, r.Message)
}

func reject(status int, reason, rule, format string, args ...any) Result {
	return Result{Reject: &Rejection{Status: status, Reason: reason, Rule: rule, Message: fmt.Sprintf(format, args...)}}
}

// CheckSize rejects a body of n bytes over the body limit; a streaming
// delivery calls it as chunks arrive so it can answer before the whole
// body is in.
func (p *Policy) CheckSize(n int) *Rejection {
	if l := p.limits.MaxBodyBytes; l > 0 && int64(n) > l {
		return reject(413, ReasonTooLarge, "", "request body exceeds the limit of %d bytes", l).Reject
	}
	return nil
}

// Apply decides what happens to one request body.
func (p *Policy) Apply(raw []byte) Result {
	if r := p.CheckSize(len(raw)); r != nil {
		return Result{Reject: r}
	}
	body, err := inference.Parse(raw)
	if err != nil {
		return reject(400, ReasonInvalidJSON, "", "%v", err)
	}
	if k := body.RepeatedKey(); k != "" {
		return reject(400, ReasonDuplicateKey, "", "%q appears more than once in the request; send it once", k)
	}
	if !p.allowTemplate && body.HasChatTemplate() {
		return reject(400, ReasonTemplateOverride, "allowChatTemplate", `"chat_template" would replace the server's prompt template; this gateway does not allow it`)
	}
	if p.strictText {
		if path := body.UnreadText(); path != "" {
			return reject(400, ReasonUnreadText, "strictText", "%s holds text the guardrails do not read; this gateway refuses such fields", cut(path, 200))
		}
	}
	model, err := body.Model()
	if err != nil {
		return reject(400, ReasonMissingModel, "", `the request body has no "model" string`)
	}
	if why := headerUnsafe(model); why != "" {
		return reject(400, ReasonInvalidModel, "", "the model name %s", why)
	}
	if len(p.allow) > 0 && !p.allowed(model) {
		return reject(403, ReasonModelNotAllowed, "models.allow", "model %q is not allowed here", model)
	}
	base, known := p.base[model]
	if !known {
		if p.rejectUnknown {
			return reject(404, ReasonModelNotFound, "", "model %q is not served here", model)
		}
		base = model
	}
	res := Result{Model: model, BaseModel: base, Stream: body.Stream()}
	if !p.readsText() {
		return p.finish(body, res, nil)
	}

	if r := p.checkPromptSize(body, int64(len(raw))); r != nil {
		return *r
	}
	if len(p.deny) == 0 && len(p.pii) == 0 {
		return p.finish(body, res, nil)
	}

	edits, used, rej := p.guardText(body)
	if rej != nil {
		return *rej
	}
	for i, r := range p.pii {
		if used&(1<<i) != 0 {
			res.Masked = append(res.Masked, r.name)
		}
	}

	return p.finish(body, res, edits)
}

// checkPromptSize refuses a prompt over the limits. The texts are
// counted in a pass of their own that holds nothing per text: a body of
// millions of tiny strings must cost what its bytes cost, not a record per
// string (an 8 MiB body of empty strings took 528 MB when the texts were
// gathered first). A body no larger than the limits allow needs no count:
// its decoded text is never longer than it.
func (p *Policy) checkPromptSize(body *inference.Body, bodyBytes int64) *Result {
	maxBytes, maxTokens := p.limits.MaxPromptBytes, p.limits.MaxPromptTokens
	if (maxBytes <= 0 || bodyBytes <= maxBytes) && (maxTokens <= 0 || tokensOf(bodyBytes) <= maxTokens) {
		return nil
	}
	promptBytes := int64(0)
	body.Texts(func(t inference.Text) bool {
		promptBytes += int64(t.Len())
		return true
	})
	if maxBytes > 0 && promptBytes > maxBytes {
		r := reject(413, ReasonPromptTooLarge, "", "prompt of %d bytes exceeds the limit of %d bytes", promptBytes, maxBytes)
		return &r
	}
	if est := tokensOf(promptBytes); maxTokens > 0 && est > maxTokens {
		r := reject(413, ReasonPromptTooLong, "", "prompt of about %d tokens exceeds the limit of %d tokens", est, maxTokens)
		return &r
	}
	return nil
}

// tokensOf estimates the tokens of n bytes of text. No tokenizer here:
// by the same ratio as everywhere else.
func tokensOf(n int64) int64 {
	return (n + wire.DefaultBytesPerToken - 1) / wire.DefaultBytesPerToken
}

// readsText says whether any rule looks at the prompt text; routing alone
// does not, and skips decoding it.
func (p *Policy) readsText() bool {
	return p.limits.MaxPromptBytes > 0 || p.limits.MaxPromptTokens > 0 || len(p.deny) > 0 || len(p.pii) > 0
}

// finish applies the max-tokens ceiling and the edits.
func (p *Policy) finish(body *inference.Body, res Result, edits []inference.Edit) Result {
	if ceiling := p.limits.MaxTokens; ceiling > 0 {
		var rej *Result
		if edits, rej = p.capMaxTokens(body.MaxTokensFields(), ceiling, edits); rej != nil {
			return *rej
		}
	}
	if len(edits) > 0 {
		res.Body = body.Rewrite(edits)
	}
	return res
}

// maxTokensRule names the guardrail in the answers about output caps.
const maxTokensRule = "limits.maxTokens"

// capMaxTokens holds every output-token cap field to the ceiling: a field
// the policy cannot read as a token count is refused first (whatever the
// action, since the server would read it some way of its own), then one
// over the ceiling is refused or clamped.
func (p *Policy) capMaxTokens(fields []inference.MaxTokensField, ceiling int64, edits []inference.Edit) ([]inference.Edit, *Result) {
	for _, f := range fields {
		if rej := invalidMaxTokens(f); rej != nil {
			return edits, rej
		}
	}
	for _, f := range fields {
		if n, _ := f.Count(); n <= ceiling {
			continue
		}
		if !p.clamp {
			res := reject(413, ReasonMaxTokensTooHigh, maxTokensRule, "%s of %s exceeds the limit of %d", f.Name, excerpt(f.JSON), ceiling)
			return edits, &res
		}
		edits = append(edits, inference.Edit{Span: f.Span, JSON: strconv.AppendInt(nil, ceiling, 10)})
	}
	return edits, nil
}

// invalidMaxTokens refuses a cap field that is repeated or is not a
// non-negative integer.
func invalidMaxTokens(f inference.MaxTokensField) *Result {
	var res Result
	switch _, ok := f.Count(); {
	case f.Repeated:
		res = reject(400, ReasonInvalidMaxTokens, maxTokensRule, "%s appears more than once; send it once", f.Name)
	case !ok:
		res = reject(400, ReasonInvalidMaxTokens, maxTokensRule, "%s must be a non-negative integer, not %s", f.Name, describeJSON(f.JSON))
	default:
		return nil
	}
	return &res
}

// describeJSON names a JSON value for an error message: numbers as
// written (cut short), other values by kind, so the message stays short
// and valid UTF-8 whatever the client sent.
func describeJSON(v []byte) string {
	switch v[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return excerpt(v)
}

// excerpt is a number as written, cut to a readable length.
func excerpt(num []byte) string { return cut(string(num), 24) }

// cut shortens a client-chosen string (a number, a field path) to at
// most maxLen bytes for a message, on a character boundary.
func cut(s string, maxLen int) string {
	if len(s) <= maxLen {
		return s
	}
	i := maxLen
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// maxModelBytes bounds a model name: it goes on in a request header, and
// proxies refuse a request whose headers outgrow their limit (Envoy's
// default is 60 KiB) with an error the client cannot read as its own.
const maxModelBytes = 1024

// headerUnsafe says why a model name cannot be sent on as a header value,
// or "" when it can: a control character (CR, LF, NUL among them) makes
// the proxy refuse the header mutation, which the client would see as a
// 500 rather than as its own error.
func headerUnsafe(model string) string {
	if len(model) > maxModelBytes {
		return fmt.Sprintf("is %d bytes long; the limit is %d", len(model), maxModelBytes)
	}
	for i := 0; i < len(model); i++ {
		if c := model[i]; c < 0x20 || c == 0x7f {
			return fmt.Sprintf("contains the control character %#02x at byte %d", c, i)
		}
	}
	// Servers may resolve a model name as a path (a Hugging Face id, a
	// local directory): "meta-llama/../x" would pass an allow-list entry
	// "meta-llama/*" and name another model.
	for seg := range strings.SplitSeq(model, "/") {
		if seg == "." || seg == ".." {
			return fmt.Sprintf("has a %q path segment", seg)
		}
	}
	return ""
}

func (p *Policy) allowed(model string) bool {
	for _, a := range p.allow {
		if prefix, ok := strings.CutSuffix(a, "*"); ok {
			if strings.HasPrefix(model, prefix) {
				return true
			}
		} else if a == model {
			return true
		}
	}
	return false
}

// denied returns the first deny rule text matches; folded is its
// textnorm.Fold form. anchoredOnly: only the anchored expressions (the
// per-text pass).
//
// Phrases are compared in the Compact form of both sides, so a
// zero-width character that is the only separator between two words
// ("ignore\u200bprevious", dropped by folding) hides no phrase, nor does
// one inside a word. An expression reads spaces, so it is tried on the
// text as sent, on its folded form, and, when folding dropped an
// invisible character, on the reading where such characters are spaces:
// folding alone would glue the words that one separates.
func (p *Policy) denied(text string, folded textnorm.Folded, anchoredOnly bool) *denyRule {
	phrase := len(p.deny) // the first rule with a phrase in text
	if p.lowerText && !anchoredOnly {
		phrase = p.phraseRule(folded.S)
	}
	latin, spaced := "", ""
	for i := range p.deny {
		r := &p.deny[i]
		if i == phrase {
			return r
		}
		if r.re == nil || anchoredOnly && !r.anchored {
			continue
		}
		if r.re.MatchString(text) {
			return r
		}
		if latin == "" {
			latin = textnorm.Latin(folded.S)
		}
		if latin != text && r.re.MatchString(latin) {
			return r
		}
		if folded.Dropped {
			if spaced == "" {
				// The same as the folded reading when every dropped
				// character stood next to a space: tried already.
				if sp := textnorm.FoldSpacedString(text); sp != folded.S {
					spaced = textnorm.Latin(sp)
				} else {
					spaced = latin
				}
			}
			if spaced != latin && r.re.MatchString(spaced) {
				return r
			}
		}
	}
	return nil
}

// phraseWindow is how much of a text phraseRule compacts at a time.
const phraseWindow = 4 << 10

// phraseRule returns the index of the first deny rule one of whose
// contains phrases is in textnorm.Compact(folded), or len(p.deny). ASCII
// text, the common case, is compacted a window at a time into a buffer
// that overlaps the last by the longest phrase, so no compact copy of a
// long prompt is made.
func (p *Policy) phraseRule(folded string) int {
	var stack [2 * phraseWindow]byte
	buf := stack[:0]
	if n := phraseWindow + p.maxPhrase; n > len(stack) {
		buf = make([]byte, 0, n)
	}
	best := len(p.deny)
	for at := 0; at < len(folded); at += phraseWindow {
		chunk := folded[at:min(at+phraseWindow, len(folded))]
		var ascii bool
		if buf, ascii = appendCompactASCII(buf, chunk); !ascii {
			return p.phraseRuleIn(textnorm.Compact(folded))
		}
		best = p.firstPhrase(buf, best)
		if best == p.firstPhraseRule {
			return best
		}
		keep := min(len(buf), p.maxPhrase-1)
		buf = buf[:copy(buf, buf[len(buf)-keep:])]
	}
	return best
}

// phraseRuleIn is phraseRule over compact text.
func (p *Policy) phraseRuleIn(compact string) int {
	for i, r := range p.deny {
		for _, s := range r.contains {
			if strings.Contains(compact, s) {
				return i
			}
		}
	}
	return len(p.deny)
}

// firstPhrase returns the first rule before best one of whose phrases is
// in the compact buf, or best.
func (p *Policy) firstPhrase(buf []byte, best int) int {
	for i := range best {
		for _, s := range p.deny[i].phrases {
			if bytes.Contains(buf, s) {
				return i
			}
		}
	}
	return best
}

// compactByte is the Compact form of an ASCII byte: lower case, and 0
// for a space and for NUL (the separator of a tree's texts), which
// Compact drops.
var compactByte = func() (t [128]byte) {
	for c := range t {
		t[c] = byte(c)
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = byte(c) + 'a' - 'A'
	}
	t[' '] = 0
	return t
}()

// appendCompactASCII appends the textnorm.Compact form of s to dst when
// s is ASCII (ascii false otherwise, and dst holds part of it).
func appendCompactASCII(dst []byte, s string) (_ []byte, ascii bool) {
	n := len(dst)
	dst = slices.Grow(dst, len(s))[:n+len(s)]
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf {
			return dst[:n], false
		}
		if dst[n] = compactByte[c]; dst[n] != 0 {
			n++
		}
	}
	return dst[:n], true
}

// finding is a span of text one PII rule claims; placed: its
// replacement is written (see level.apply).
type finding struct {
	start, end, rule int
	placed           bool
}

// errUnmaskable is returned when masking keeps producing findings; it
// cannot happen with the built-in replacements, but a custom replacement
// may itself match a rule.
var errUnmaskable = errors.New("masking did not converge")

// mask applies the anchored PII rules to one text (folded is its
// textnorm.Fold form): a reject rule that finds anything rejects; mask
// rules replace their findings. It repeats until no rule finds anything,
// so no detected personal data survives. (Every rule also runs on the
// join of the texts: see maskJoined.)
//
// Rules run on the folded text, and their findings are mapped back to the
// original bytes; when folding changed the text they also run on the
// original, where an invisible character that folding drops may be all
// that separates a number from the next.
func (p *Policy) mask(text string, folded textnorm.Folded, used *uint64, anchoredOnly bool) (string, bool, *Result) {
	if len(p.pii) == 0 {
		return text, false, nil
	}
	sel := findAll
	if anchoredOnly {
		sel = findAnchored
	}
	changed := false
	var ms []pii.Match
	var fs []finding
	for pass := 0; ; pass++ {
		if pass > 0 {
			folded = textnorm.Fold(text)
		}
		fs, ms = p.find(fs[:0], ms, folded.S, folded.Span, sel)
		if folded.S != text {
			fs, ms = p.find(fs, ms, text, nil, sel)
		}
		if len(fs) == 0 {
			return text, changed, nil
		}
		if rej := p.checkFindings(fs); rej != nil {
			return "", false, rej
		}
		if pass == maxMaskPasses {
			res := reject(403, ReasonPII, p.pii[fs[0].rule].name, "personal data could not be masked: %v", errUnmaskable)
			return "", false, &res
		}
		text = replace(text, fs, p.pii, used)
		changed = true
	}
}

// checkFindings refuses a request whose findings include one of a
// reject rule, or more than the bound.
func (p *Policy) checkFindings(fs []finding) *Result {
	for _, f := range fs {
		if r := p.pii[f.rule]; r.reject {
			res := reject(403, ReasonPII, r.name, "the request contains personal data (%s) and was refused", r.name)
			return &res
		}
	}
	if len(fs) > p.maxFindings {
		res := reject(413, ReasonTooManyFindings, "limits.maxFindings", "the request holds more than %d findings of personal data to mask; send less at once", p.maxFindings)
		return &res
	}
	return nil
}

// Which rules find runs.
const (
	findBuiltin  = 1 << iota // the built-in detectors
	findRegex                // every expression
	findAnchored             // the anchored expressions
	findAll      = findBuiltin | findRegex
)

// find appends the findings of the rules sel selects in s, their spans
// mapped to the original text by span (nil: s is the original).
func (p *Policy) find(fs []finding, ms []pii.Match, s string, span func(int, int) (int, int), sel int) ([]finding, []pii.Match) {
	add := func(start, end, rule int) {
		if span != nil {
			start, end = span(start, end)
		}
		fs = append(fs, finding{start: start, end: end, rule: rule})
	}
	// One more than the bound is enough to know it is passed.
	room := func() int { return p.maxFindings + 1 - len(fs) }
	if p.kinds != 0 && sel&findBuiltin != 0 && room() > 0 {
		ms = pii.Find(ms[:0], s, p.kinds, room())
		for _, m := range ms {
			add(m.Start, m.End, p.ruleOfKind[m.Kind])
		}
	}
	for i, r := range p.pii {
		if r.re == nil || sel&findRegex == 0 && !(sel&findAnchored != 0 && r.anchored) || room() <= 0 {
			continue
		}
		for _, loc := range r.re.FindAllStringIndex(s, room()) {
			if loc[1] > loc[0] {
				add(loc[0], loc[1], i)
			}
		}
	}
	return fs, ms
}

// replace rewrites the findings (sorted, overlaps merged into the first)
// with their rules' replacements.
func replace(text string, fs []finding, rules []piiRule, used *uint64) string {
	for i := 1; i < len(fs); i++ {
		for j := i; j > 0 && fs[j].start < fs[j-1].start; j-- {
			fs[j], fs[j-1] = fs[j-1], fs[j]
		}
	}
	var sb strings.Builder
	sb.Grow(len(text))
	at := 0
	for k := 0; k < len(fs); k++ {
		f := fs[k]
		end := f.end
		for k+1 < len(fs) && fs[k+1].start < end {
			end = max(end, fs[k+1].end)
			k++
		}
		sb.WriteString(text[at:f.start])
		sb.WriteString(rules[f.rule].replacement)
		*used |= 1 << f.rule
		at = end
	}
	sb.WriteString(text[at:])
	return sb.String()
}
