package policy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/infergate/infergate/inference"
	"github.com/infergate/infergate/inference/pii"
	"github.com/infergate/infergate/inference/policy"
	"github.com/infergate/infergate/inference/policy/policytest"
)

func TestVectors(t *testing.T) {
	vs, err := policytest.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			p, err := v.Compile()
			if err != nil {
				t.Fatal(err)
			}
			got, _ := policytest.CoreOutcome(p, v.RequestHeaders, v.Body)
			if err := v.Check(got, nil); err != nil {
				t.Error(err)
			}
			if got.Status == 200 && !json.Valid(got.Body) {
				t.Errorf("forwarded body is not valid JSON: %s", got.Body)
			}
		})
	}
}

func TestCompileErrors(t *testing.T) {
	cases := []struct {
		name, config, want string
	}{
		{"unknown field", `{"limits":{"maxBodyByte":1}}`, `unknown field "maxBodyByte"`},
		{"unknown mode", `{"models":{"unknown":"drop"}}`, `models.unknown: "drop" is not passthrough or reject`},
		{"adapter twice", `{"models":{"bases":[{"name":"a","adapters":["x"]},{"name":"b","adapters":["x"]}]}}`, `models.bases[1].adapters[0]: "x" already maps to "a"`},
		{"base is an adapter", `{"models":{"bases":[{"name":"a","adapters":["b"]},{"name":"b"}]}}`, `models.bases[1].name: "b" is already an adapter of "a"`},
		{"allow everything", `{"models":{"allow":["*"]}}`, `models.allow[0]`},
		{"negative limit", `{"limits":{"maxPromptBytes":-1}}`, `limits.maxPromptBytes: -1 is negative`},
		{"bad clamp", `{"limits":{"maxTokensAction":"trim"}}`, `limits.maxTokensAction: "trim"`},
		{"bad action", `{"pii":[{"name":"e","detector":"email","action":"block"}]}`, `pii[0].action: "block" is not mask or reject`},
		{"both detector and pattern", `{"pii":[{"name":"e","detector":"email","pattern":"x","action":"mask"}]}`, `pii[0]: set exactly one of detector and pattern`},
		{"unknown detector", `{"pii":[{"name":"e","detector":"passport","action":"mask"}]}`, `pii[0].detector: unknown detector "passport"`},
		{"bad regex", `{"pii":[{"name":"e","pattern":"(","action":"mask"}]}`, `pii[0].pattern: error parsing regexp`},
		{"empty-matching regex", `{"pii":[{"name":"e","pattern":"a*","action":"mask"}]}`, `matches the empty string`},
		{"kind twice", `{"pii":[{"name":"a","detector":"ip","action":"mask"},{"name":"b","detector":"ipv6","action":"reject"}]}`, `pii[1].detector: ipv6 is already detected by pii[0]`},
		{"duplicate names", `{"pii":[{"name":"a","detector":"email","action":"mask"}],"deny":[{"name":"a","contains":["x"]}]}`, `deny[0].name: "a" is also pii[0]`},
		{"empty deny", `{"deny":[{"name":"d"}]}`, `deny[0]: set contains or regex`},
		{"bad deny regex", `{"deny":[{"name":"d","regex":"[" }]}`, `deny[0].regex`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := policy.DecodeJSON([]byte(tc.config))
			if err == nil {
				_, err = policy.Compile(cfg)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// maskAll masks every built-in kind.
func maskAll(t testing.TB) *policy.Policy {
	var rules []string
	for _, k := range pii.Kinds() {
		rules = append(rules, fmt.Sprintf(`{"name":%q,"detector":%q,"action":"mask"}`, k, k))
	}
	cfg, err := policy.DecodeJSON([]byte(`{"pii":[` + strings.Join(rules, ",") + `]}`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FuzzMask checks the masker on arbitrary text placed in every text field
// kind: it never panics, its output is valid JSON, and no personal data it
// can detect survives.
func FuzzMask(f *testing.F) {
	for _, s := range []string{"mail jane@example.com", "4111 1111 1111 1111", "a@b.co@x.com", "+44 20 7946 0958 (555) 123-4567",
		"2001:db8::1 10.0.0.1", "GB82 WEST 1234 5698 7654 32", "\"quoted\" \\ \u2028 \x01", "078-05-1120"} {
		f.Add(s)
	}
	p := maskAll(f)
	f.Fuzz(func(t *testing.T, text string) {
		q, _ := json.Marshal(text)
		for _, body := range []string{
			`{"model":"m","prompt":` + string(q) + `}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":` + string(q) + `}]}]}`,
			`{"model":"m","system":` + string(q) + `,"input":[` + string(q) + `]}`,
		} {
			res := p.Apply([]byte(body))
			if res.Reject != nil {
				// Invalid UTF-8 is replaced by json.Marshal, so bodies are valid.
				t.Fatalf("rejected %s: %+v", body, res.Reject)
			}
			out := []byte(body)
			if res.Body != nil {
				out = res.Body
			}
			if !json.Valid(out) {
				t.Fatalf("masked body is not valid JSON: %s", out)
			}
			parsed, err := inference.Parse(out)
			if err != nil {
				t.Fatalf("masked body does not parse: %v", err)
			}
			parsed.Texts(func(tx inference.Text) bool {
				if ms := pii.Find(nil, tx.Value(), pii.All, -1); len(ms) > 0 {
					t.Fatalf("%s survived masking in %q", ms[0].Kind, tx.Value())
				}
				return true
			})
		}
	})
}

// FuzzApply runs a full guardrail configuration on arbitrary bodies: no
// panic, and a rewritten body is valid JSON.
func FuzzApply(f *testing.F) {
	vs, err := policytest.Load()
	if err != nil {
		f.Fatal(err)
	}
	var guard *policy.Policy
	for _, v := range vs {
		f.Add(string(v.Body))
		if v.ConfigName == "guard" && guard == nil {
			if guard, err = v.Compile(); err != nil {
				f.Fatal(err)
			}
		}
	}
	f.Fuzz(func(t *testing.T, body string) {
		res := guard.Apply([]byte(body))
		if res.Body != nil && !json.Valid(res.Body) {
			t.Fatalf("rewritten body is not valid JSON: %s", res.Body)
		}
		if res.Reject == nil && !json.Valid([]byte(body)) {
			t.Fatalf("forwarded invalid JSON: %q", body)
		}
	})
}

// BenchmarkApply is the full guardrail pass over a chat body of prose with
// a little personal data in it: "builtin" masks with every built-in
// detector and checks two deny phrases, with limits and the model mapping;
// "regex" adds a case-insensitive deny regex and a custom PII pattern, the
// user-written rules whose cost is Go's regexp engine.
func BenchmarkApply(b *testing.B) {
	var rules []policy.PIIRule
	for _, k := range pii.Kinds() {
		rules = append(rules, policy.PIIRule{Name: k, Detector: k, Action: policy.ActionMask})
	}
	builtin := policy.Config{
		Models: policy.Models{Bases: []policy.BaseModel{{Name: "llama-3-8b", Adapters: []string{"sql-lora"}}}},
		Limits: policy.Limits{MaxBodyBytes: 1 << 20, MaxPromptTokens: 1 << 20, MaxTokens: 4096},
		PII:    rules,
		Deny:   []policy.DenyRule{{Name: "injection", Contains: []string{"ignore previous instructions", "ignore all previous instructions"}}},
	}
	withRegex := builtin
	withRegex.PII = append(append([]policy.PIIRule(nil), rules...), policy.PIIRule{Name: "employee-id", Pattern: `EMP-[0-9]{6}`, Action: policy.ActionMask})
	withRegex.Deny = append(append([]policy.DenyRule(nil), builtin.Deny...), policy.DenyRule{Name: "dan", Regex: `(?i)\byou are now DAN\b`})
	for _, c := range []struct {
		name string
		cfg  policy.Config
	}{{"builtin", builtin}, {"regex", withRegex}} {
		p, err := policy.Compile(&c.cfg)
		if err != nil {
			b.Fatal(err)
		}
		for _, size := range []int{1 << 10, 64 << 10} {
			body := policytest.ChatBody(size)
			b.Run(fmt.Sprintf("%s/%dKiB", c.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				for b.Loop() {
					if res := p.Apply(body); res.Reject != nil || res.Body == nil {
						b.Fatalf("unexpected result %+v", res.Reject)
					}
				}
			})
		}
	}
}

// TestRequestHeadersToRemove: the processor's own headers and every
// header that steers the endpoint pick are removed, whatever their case;
// other headers, even with similar names, are not.
func TestRequestHeadersToRemove(t *testing.T) {
	always := []string{"test-epp-endpoint-selection", "x-gateway-base-model-name", "x-gateway-destination-endpoint",
		"x-gateway-destination-endpoint-served", "x-gateway-destination-endpoint-subset", "x-gateway-model-name", "x-infergate-masked"}
	cases := []struct {
		name  string
		sent  []string
		extra []string // removed besides always
	}{
		{"nothing sent", nil, nil},
		{"ordinary headers kept", []string{"content-type", "x-request-id", "x-gateway-destination", "x-gateway-destinationendpoint", "epp-endpoint-selection"}, nil},
		{"any destination-endpoint name", []string{"x-gateway-destination-endpoint-scores", "x-gateway-destination-endpoint-fallback"},
			[]string{"x-gateway-destination-endpoint-fallback", "x-gateway-destination-endpoint-scores"}},
		{"case-insensitive", []string{"X-Gateway-Destination-Endpoint-Extra", "Test-EPP-Endpoint-Selection"}, []string{"x-gateway-destination-endpoint-extra"}},
		{"sent twice", []string{"x-gateway-destination-endpoint-x", "x-gateway-destination-endpoint-x"}, []string{"x-gateway-destination-endpoint-x"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := policy.RequestHeadersToRemove(slices.Values(tc.sent))
			want := slices.Sorted(slices.Values(append(slices.Clone(always), tc.extra...)))
			if !slices.Equal(got, want) {
				t.Errorf("got  %q\nwant %q", got, want)
			}
			for _, name := range tc.sent {
				if policy.StripsRequestHeader(name) != slices.Contains(got, strings.ToLower(name)) {
					t.Errorf("StripsRequestHeader(%q) disagrees with the list", name)
				}
			}
		})
	}
}

// TestDecodeJSONRefusesNull: a configuration that is JSON null would
// compile to a policy with no guardrails; it is refused, while an absent
// configuration (empty) and {} are a deliberate empty policy.
func TestDecodeJSONRefusesNull(t *testing.T) {
	cases := []struct {
		name, config string
		wantErr      bool
	}{
		{"null", `null`, true},
		{"null with spaces", " null\n", true},
		{"empty object", `{}`, false},
		{"absent", ``, false},
		{"whitespace", " \n", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := policy.DecodeJSON([]byte(tc.config))
			switch {
			case tc.wantErr && !errors.Is(err, policy.ErrNoConfig):
				t.Fatalf("err = %v, want ErrNoConfig", err)
			case !tc.wantErr && (err != nil || cfg == nil):
				t.Fatalf("err = %v, cfg %v", err, cfg)
			}
		})
	}
}

// TestManyStringsDoNotAmplify: a body of a million empty strings (about
// 3 MiB) costs the guardrails what its bytes cost, with the prompt limits
// counted or not: no record per string. Gathering the texts first
// allocated about 60 bytes a string, 200 MB for an 8 MiB body.
func TestManyStringsDoNotAmplify(t *testing.T) {
	const n = 1 << 20
	body := []byte(`{"model":"m","prompt":[` + strings.Repeat(`"",`, n-1) + `""]}`)
	for _, tc := range []struct {
		name   string
		limits policy.Limits
	}{
		{"no prompt limits", policy.Limits{}},
		{"limits counted", policy.Limits{MaxPromptBytes: 1 << 20, MaxPromptTokens: 1 << 18}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Compile(&policy.Config{Limits: tc.limits,
				PII: []policy.PIIRule{{Name: "email", Detector: "email", Action: "mask"}}})
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			r := p.Apply(body)
			runtime.ReadMemStats(&after)
			if r.Reject != nil {
				t.Fatalf("refused: %+v", r.Reject)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > uint64(len(body))/4 {
				t.Fatalf("Apply allocated %d bytes for a %d-byte body of %d strings", got, len(body), n)
			}
		})
	}
}
