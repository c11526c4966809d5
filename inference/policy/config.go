// Package policy is the payload processor's decision for one request body:
// which model and base model it names, and what the guardrails (model
// allow-list, limits, deny rules, personal-data rules) make of it; and
// which request headers a client may not send on (the processor's own,
// and those that steer the endpoint pick). The ext_proc server and the
// Wasm plugin both run it, so they answer alike.
package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"

	"github.com/infergate/infergate/inference/pii"
	"github.com/infergate/infergate/inference/textnorm"
)

// Config is the payload processor's configuration: a YAML file for the
// ext_proc server, the same fields as JSON in the Wasm plugin configuration.
// The zero Config sets the model headers and checks nothing else.
type Config struct {
	Models Models     `json:"models,omitempty"`
	Limits Limits     `json:"limits,omitempty"`
	PII    []PIIRule  `json:"pii,omitempty"`
	Deny   []DenyRule `json:"deny,omitempty"`
	// AllowChatTemplate lets requests carry "chat_template", which replaces
	// the model server's prompt template (vLLM, SGLang): a client could
	// drop the system prompt or reframe every message around the
	// guardrails. Off by default: such requests get 400.
	AllowChatTemplate bool `json:"allowChatTemplate,omitempty"`
	// StrictText refuses a request holding a string under a field the
	// guardrails neither read nor know to carry no text (an API extension,
	// a newer field, a server-specific template variable), naming the
	// field: 400 unread-text. Off by default, since clients send many
	// harmless extensions; on when guardrails must see everything.
	StrictText bool `json:"strictText,omitempty"`
}

// Models maps requested models to base models and says which may be asked for.
type Models struct {
	// Bases lists base models with the LoRA adapters served on them; an
	// adapter resolves to its base, a base to itself.
	Bases []BaseModel `json:"bases,omitempty"`
	// Unknown says what to do with a model that is neither a base nor an
	// adapter: "passthrough" (default; the base-model header is the model
	// itself) or "reject" (404 model-not-found).
	Unknown string `json:"unknown,omitempty"`
	// Allow, when not empty, is the only models that may be requested:
	// exact names, or prefixes written with a trailing '*'. Others get 403.
	Allow []string `json:"allow,omitempty"`
}

// BaseModel is a base model and its adapters.
type BaseModel struct {
	Name     string   `json:"name"`
	Adapters []string `json:"adapters,omitempty"`
}

// Limits bound a request; 0 means no limit. Over a limit is 413.
type Limits struct {
	MaxBodyBytes    int64 `json:"maxBodyBytes,omitempty"`
	MaxPromptBytes  int64 `json:"maxPromptBytes,omitempty"`
	MaxPromptTokens int64 `json:"maxPromptTokens,omitempty"`
	// MaxTokens is the ceiling on the output tokens a request may ask for
	// (max_tokens, max_completion_tokens or max_output_tokens).
	MaxTokens int64 `json:"maxTokens,omitempty"`
	// MaxTokensAction is "reject" (default) or "clamp" (rewrite the field
	// down to the ceiling). A request that names no cap is left alone.
	MaxTokensAction string `json:"maxTokensAction,omitempty"`
	// MaxFindings bounds the personal-data findings one request may hold
	// (default DefaultMaxFindings): each costs memory and a rewrite, so a
	// body of a million e-mail addresses is refused (413
	// too-many-findings) rather than masked at the cost of every other
	// request's memory.
	MaxFindings int64 `json:"maxFindings,omitempty"`
}

// DefaultMaxFindings is Limits.MaxFindings unless set: far more than a
// prompt holds (a CSV of ten thousand customers' addresses passes), far
// less than a 16 MiB body can (about a million addresses).
const DefaultMaxFindings = 10000

// PIIRule finds personal data in the prompt text with a built-in detector
// or a regular expression, and masks it or rejects the request.
type PIIRule struct {
	Name string `json:"name"`
	// Detector is a built-in kind: email, credit-card, ssn, phone, ipv4,
	// ipv6, ip (both), iban. Exactly one of Detector and Pattern is set.
	Detector string `json:"detector,omitempty"`
	// Pattern is a Go (RE2) regular expression.
	Pattern string `json:"pattern,omitempty"`
	// Action is "mask" or "reject".
	Action string `json:"action"`
	// Replacement is the text a masked finding becomes; default
	// "[NAME]" from the rule name, upper-cased.
	Replacement string `json:"replacement,omitempty"`
}

// DenyRule rejects a request whose prompt text contains any of the
// phrases or matches the regular expression. Phrases are compared after
// folding both sides (inference/textnorm): case, Unicode compatibility
// forms, invisible characters, runs of white space, dashes and look-alike
// letters of other scripts do not matter. The expression is tried on the
// text as sent and on its folded form (case kept, look-alikes made Latin).
type DenyRule struct {
	Name     string   `json:"name"`
	Contains []string `json:"contains,omitempty"`
	Regex    string   `json:"regex,omitempty"`
	// Message is shown to the client; default names the rule.
	Message string `json:"message,omitempty"`
}

// Actions and modes.
const (
	ActionMask         = "mask"
	ActionReject       = "reject"
	ActionClamp        = "clamp"
	UnknownPassthrough = "passthrough"
)

// maxPIIRules keeps the per-request record of which rules fired in one word.
const maxPIIRules = 64

// ErrNoConfig is a configuration document that holds no value: JSON null,
// or YAML that is empty, only comments, "---", "null" or "~". It would
// compile to a policy without guardrails, and is far more often a file
// caught half-written or a template that rendered nothing than a wish.
var ErrNoConfig = errors.New("the configuration is empty or null; write {} for a policy that only sets the model headers")

// ErrNullField is a top-level field written with no value ("pii:" and
// nothing after it): what a file cut short looks like, and loaded it would
// drop every rule of the section without a word.
var ErrNullField = errors.New("has no value (is the file cut short?); write [] or {} for none")

// DecodeJSON reads a Config from JSON, refusing unknown fields so that a
// misspelt key fails at start-up instead of silently doing nothing. No
// data at all (the Wasm plugin given no configuration) is the zero Config;
// null is ErrNoConfig.
func DecodeJSON(data []byte) (*Config, error) {
	var c Config
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return &c, nil
	}
	if string(trimmed) == "null" {
		return nil, ErrNoConfig
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode: data after the configuration object")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &fields); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		if string(bytes.TrimSpace(fields[name])) == "null" {
			return nil, fmt.Errorf("%s: %w", name, ErrNullField)
		}
	}
	return &c, nil
}

// Compile validates c and builds the Policy. Errors name the field, e.g.
// "pii[2].action: ...".
func Compile(c *Config) (*Policy, error) {
	cc := &compiler{
		p:     &Policy{limits: c.Limits, base: map[string]string{}, allowTemplate: c.AllowChatTemplate, strictText: c.StrictText},
		names: map[string]string{},
	}
	cc.models(c.Models)
	cc.limits(c.Limits)
	cc.piiRules(c.PII)
	cc.denyRules(c.Deny)
	if err := errors.Join(cc.errs...); err != nil {
		return nil, err
	}
	cc.p.plainRoles = cc.p.findPlainRoles()
	return cc.p, nil
}

// compiler builds a Policy, collecting every error of the config so that
// one run names them all.
type compiler struct {
	p    *Policy
	errs []error
	// names maps each rule name to the field that gave it first: names
	// are unique across PII and deny rules.
	names map[string]string
}

func (cc *compiler) fail(format string, args ...any) {
	cc.errs = append(cc.errs, fmt.Errorf(format, args...))
}

// ruleName checks the name of the rule at field.
func (cc *compiler) ruleName(field, name string) {
	if name == "" {
		cc.fail("%s.name: empty", field)
		return
	}
	if prev, ok := cc.names[name]; ok {
		cc.fail("%s.name: %q is also %s", field, name, prev)
	}
	cc.names[name] = field
}

func (cc *compiler) models(m Models) {
	p := cc.p
	switch m.Unknown {
	case "", UnknownPassthrough:
	case ActionReject:
		p.rejectUnknown = true
	default:
		cc.fail("models.unknown: %q is not passthrough or reject", m.Unknown)
	}
	for i, b := range m.Bases {
		if b.Name == "" {
			cc.fail("models.bases[%d].name: empty", i)
			continue
		}
		if prev, ok := p.base[b.Name]; ok && prev != b.Name {
			cc.fail("models.bases[%d].name: %q is already an adapter of %q", i, b.Name, prev)
		}
		p.base[b.Name] = b.Name
		for j, a := range b.Adapters {
			if prev, ok := p.base[a]; ok {
				// The multi-pool routing guide requires unique names: one
				// adapter on two bases could not pick a pool.
				cc.fail("models.bases[%d].adapters[%d]: %q already maps to %q", i, j, a, prev)
				continue
			}
			if a == "" {
				cc.fail("models.bases[%d].adapters[%d]: empty", i, j)
				continue
			}
			p.base[a] = b.Name
		}
	}
	for i, a := range m.Allow {
		if a == "" || a == "*" {
			cc.fail("models.allow[%d]: %q allows nothing or everything; leave the list out instead", i, a)
		}
	}
	p.allow = m.Allow
}

func (cc *compiler) limits(l Limits) {
	for name, v := range map[string]int64{"maxBodyBytes": l.MaxBodyBytes, "maxPromptBytes": l.MaxPromptBytes,
		"maxPromptTokens": l.MaxPromptTokens, "maxTokens": l.MaxTokens, "maxFindings": l.MaxFindings} {
		if v < 0 {
			cc.fail("limits.%s: %d is negative", name, v)
		}
	}
	cc.p.maxFindings = DefaultMaxFindings
	if l.MaxFindings > 0 {
		cc.p.maxFindings = int(min(l.MaxFindings, math.MaxInt32))
	}
	switch l.MaxTokensAction {
	case "", ActionReject:
	case ActionClamp:
		cc.p.clamp = true
	default:
		cc.fail("limits.maxTokensAction: %q is not reject or clamp", l.MaxTokensAction)
	}
}

func (cc *compiler) piiRules(rules []PIIRule) {
	p := cc.p
	if len(rules) > maxPIIRules {
		cc.fail("pii: %d rules; at most %d", len(rules), maxPIIRules)
	}
	byKind := map[pii.Kind]int{}
	for i, r := range rules {
		p.pii = append(p.pii, cc.piiRule(i, r, byKind))
	}
	for k := range p.ruleOfKind {
		p.ruleOfKind[k] = -1
	}
	for k, i := range byKind {
		p.ruleOfKind[k] = i
	}
}

// piiRule compiles rule i, r; byKind records which rule detects each
// built-in kind, which only one may.
func (cc *compiler) piiRule(i int, r PIIRule, byKind map[pii.Kind]int) piiRule {
	field := fmt.Sprintf("pii[%d]", i)
	cc.ruleName(field, r.Name)
	cr := piiRule{name: r.Name, replacement: r.Replacement}
	switch r.Action {
	case ActionMask:
	case ActionReject:
		cr.reject = true
	default:
		cc.fail("%s.action: %q is not mask or reject", field, r.Action)
	}
	if cr.replacement == "" {
		cr.replacement = "[" + strings.ToUpper(strings.ReplaceAll(r.Name, "-", "_")) + "]"
	}
	switch {
	case (r.Detector == "") == (r.Pattern == ""):
		cc.fail("%s: set exactly one of detector and pattern", field)
	case r.Detector != "":
		set, err := pii.ParseKind(r.Detector)
		if err != nil {
			cc.fail("%s.detector: %w", field, err)
			break
		}
		for k := pii.Email; set != 0 && int(k) < 16; k++ {
			if !set.Has(k) {
				continue
			}
			if prev, ok := byKind[k]; ok {
				cc.fail("%s.detector: %s is already detected by pii[%d]", field, k, prev)
			}
			byKind[k] = i
		}
		cc.p.kinds |= set
	default:
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			cc.fail("%s.pattern: %w", field, err)
			break
		}
		if re.MatchString("") {
			cc.fail("%s.pattern: %q matches the empty string", field, r.Pattern)
			break
		}
		cr.re = re
		cr.anchored = anchored(r.Pattern)
		cc.p.perText = cc.p.perText || cr.anchored
	}
	return cr
}

func (cc *compiler) denyRules(rules []DenyRule) {
	for i, r := range rules {
		field := fmt.Sprintf("deny[%d]", i)
		cc.ruleName(field, r.Name)
		dr := denyRule{name: r.Name, message: r.Message}
		if len(r.Contains) == 0 && r.Regex == "" {
			cc.fail("%s: set contains or regex", field)
		}
		for j, s := range r.Contains {
			if strings.TrimSpace(s) == "" {
				cc.fail("%s.contains[%d]: empty", field, j)
				continue
			}
			// Phrases are compared in the texts' folded, compact form, so
			// they are folded alike: "ignore  previous" matches
			// "ignore previous" (see denied).
			c := textnorm.Compact(textnorm.Fold(s).S)
			if c == "" {
				cc.fail("%s.contains[%d]: %q holds nothing visible", field, j, s)
				continue
			}
			dr.contains = append(dr.contains, c)
			dr.phrases = append(dr.phrases, []byte(c))
			cc.p.maxPhrase = max(cc.p.maxPhrase, len(c))
		}
		if r.Regex != "" {
			re, err := regexp.Compile(r.Regex)
			if err != nil {
				cc.fail("%s.regex: %w", field, err)
			} else {
				dr.re = re
				dr.anchored = anchored(r.Regex)
				cc.p.perText = cc.p.perText || dr.anchored
			}
		}
		if dr.message == "" {
			dr.message = fmt.Sprintf("the request was refused by the %q rule", r.Name)
		}
		if len(dr.contains) > 0 && !cc.p.lowerText {
			cc.p.lowerText, cc.p.firstPhraseRule = true, len(cc.p.deny)
		}
		cc.p.deny = append(cc.p.deny, dr)
	}
}
