// Package policytest holds the payload processor's shared test vectors: one
// table of configurations, client request headers and bodies with the
// answer every delivery (the core, the ext_proc server, the Wasm plugin)
// must give.
package policytest

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/infergate/infergate/inference/policy"
)

//go:embed vectors.json
var vectorsJSON []byte

// Vector is one case.
type Vector struct {
	Name       string
	ConfigName string
	// Config is the configuration as JSON (the Wasm plugin configuration;
	// the ext_proc server reads the same as YAML).
	Config []byte
	// RequestHeaders are sent by the client with the body (lower-case
	// names, as Envoy presents them).
	RequestHeaders map[string]string
	Body           []byte
	// Status is 200 when the request must be forwarded, else the status of
	// the immediate answer.
	Status int
	// Headers must be on the forwarded request (Status 200); NoHeaders must not.
	Headers   map[string]string
	NoHeaders []string
	// ForwardedBody is the body the upstream must see (Status 200).
	ForwardedBody []byte
	// Reason and Rule are the drop-reason and guardrail headers of a rejection.
	Reason, Rule string
}

type file struct {
	Configs map[string]json.RawMessage `json:"configs"`
	Cases   []struct {
		Name           string            `json:"name"`
		Config         string            `json:"config"`
		RequestHeaders map[string]string `json:"requestHeaders"`
		Body           string            `json:"body"`
		Status         int               `json:"status"`
		Headers        map[string]string `json:"headers"`
		NoHeaders      []string          `json:"noHeaders"`
		ForwardedBody  *string           `json:"forwardedBody"`
		Reason         string            `json:"reason"`
		Rule           string            `json:"rule"`
	} `json:"cases"`
}

// repeat lets a vector name a long run of one character: "@repeat:a:4100".
var repeat = regexp.MustCompile(`@repeat:(.):(\d+)`)

func expand(s string) []byte {
	return []byte(repeat.ReplaceAllStringFunc(s, func(m string) string {
		sub := repeat.FindStringSubmatch(m)
		n, _ := strconv.Atoi(sub[2])
		return strings.Repeat(sub[1], n)
	}))
}

// Load returns the vectors.
func Load() ([]Vector, error) {
	var f file
	dec := json.NewDecoder(bytes.NewReader(vectorsJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("vectors.json: %w", err)
	}
	out := make([]Vector, 0, len(f.Cases))
	for _, c := range f.Cases {
		cfg, ok := f.Configs[c.Config]
		if !ok {
			return nil, fmt.Errorf("vectors.json: case %q names unknown config %q", c.Name, c.Config)
		}
		v := Vector{Name: c.Name, ConfigName: c.Config, Config: cfg, RequestHeaders: c.RequestHeaders, Body: expand(c.Body),
			Status: c.Status, Headers: c.Headers, NoHeaders: c.NoHeaders, Reason: c.Reason, Rule: c.Rule}
		v.ForwardedBody = v.Body
		if c.ForwardedBody != nil {
			v.ForwardedBody = expand(*c.ForwardedBody)
		}
		out = append(out, v)
	}
	return out, nil
}

// Outcome is what a delivery did with a request: forwarded it (Status 200,
// the request headers and body the upstream saw) or answered it (the
// status, response headers and body of the immediate answer).
type Outcome struct {
	Status  int
	Headers map[string]string // lower-case names
	Body    []byte
}

// Check compares an outcome with the vector. wantErrorBody, when not nil,
// is the exact error body expected (the core's rendering), so every
// delivery answers byte for byte alike.
func (v *Vector) Check(o Outcome, wantErrorBody []byte) error {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if o.Status != v.Status {
		add("status %d, want %d (body %.200s)", o.Status, v.Status, o.Body)
	}
	if v.Status == 200 {
		for k, want := range v.Headers {
			if got, ok := o.Headers[k]; !ok || got != want {
				add("header %s = %q (present %v), want %q", k, got, ok, want)
			}
		}
		for _, k := range v.NoHeaders {
			if got, ok := o.Headers[k]; ok {
				add("header %s = %q, want none", k, got)
			}
		}
		if !bytes.Equal(o.Body, v.ForwardedBody) {
			add("forwarded body\n  %.300s\nwant\n  %.300s", o.Body, v.ForwardedBody)
		}
	} else {
		if got := o.Headers["x-llm-d-request-dropped-reason"]; got != v.Reason {
			add("drop reason %q, want %q", got, v.Reason)
		}
		if got := o.Headers["x-infergate-guardrail"]; got != v.Rule {
			add("guardrail header %q, want %q", got, v.Rule)
		}
		var eb struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(o.Body, &eb); err != nil {
			add("error body %q: %v", o.Body, err)
		} else if eb.Error.Type != v.Reason || eb.Error.Code != v.Status || eb.Error.Message == "" {
			add("error body %s: want type %q code %d and a message", o.Body, v.Reason, v.Status)
		}
		if wantErrorBody != nil && !bytes.Equal(o.Body, wantErrorBody) {
			add("error body\n  %s\nwant the core's\n  %s", o.Body, wantErrorBody)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "\n"))
	}
	return nil
}

// CoreOutcome runs the core on a request: what every delivery is compared
// with. A forwarded request carries the client's headers minus those the
// core strips, then the headers it sets.
func CoreOutcome(p *policy.Policy, headers map[string]string, body []byte) (Outcome, []byte) {
	res := p.Apply(body)
	if res.Reject != nil {
		hs, eb := res.Reject.Response()
		return Outcome{Status: res.Reject.Status, Headers: lower(hs), Body: eb}, eb
	}
	fwd := body
	if res.Body != nil {
		fwd = res.Body
	}
	out := make(map[string]string, len(headers)+3)
	for k, v := range headers {
		out[strings.ToLower(k)] = v
	}
	for _, k := range policy.RequestHeadersToRemove(maps.Keys(headers)) {
		delete(out, k)
	}
	for k, v := range lower(res.Headers()) {
		out[k] = v
	}
	return Outcome{Status: 200, Headers: out, Body: fwd}, nil
}

// HeaderPairs returns the vector's request headers sorted by name, the
// form the deliveries' test clients take.
func (v *Vector) HeaderPairs() [][2]string {
	out := make([][2]string, 0, len(v.RequestHeaders))
	for _, k := range slices.Sorted(maps.Keys(v.RequestHeaders)) {
		out = append(out, [2]string{k, v.RequestHeaders[k]})
	}
	return out
}

// Compile builds the vector's policy.
func (v *Vector) Compile() (*policy.Policy, error) {
	cfg, err := policy.DecodeJSON(v.Config)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", v.ConfigName, err)
	}
	return policy.Compile(cfg)
}

func lower(hs [][2]string) map[string]string {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		m[strings.ToLower(h[0])] = h[1]
	}
	return m
}

// Delivery runs one vector's request (RequestHeaders, as HeaderPairs, and
// the body) through a delivery set up for the vector's configuration,
// delivered whole (chunk 0) or in chunks of that many bytes, and returns
// what came out. It may assert more of its own.
type Delivery func(t *testing.T, v *Vector, chunk int) Outcome

// Run checks a delivery against every vector, whole and in 100-byte
// chunks, with error bodies compared byte for byte with the core's.
func Run(t *testing.T, deliver Delivery) {
	vs, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	for i := range vs {
		v := &vs[i]
		p, err := v.Compile()
		if err != nil {
			t.Fatal(err)
		}
		_, wantErr := CoreOutcome(p, v.RequestHeaders, v.Body)
		for _, chunk := range []int{0, 100} {
			t.Run(fmt.Sprintf("%s/chunks=%d", v.Name, chunk), func(t *testing.T) {
				if err := v.Check(deliver(t, v, chunk), wantErr); err != nil {
					t.Error(err)
				}
			})
		}
	}
}

// ChatBody is a chat request of about n bytes for benchmarks and soak
// tests: a system prompt, then user turns of prose with numbers, dates and
// a little personal data (an e-mail address, a phone number, an IP address).
func ChatBody(n int) []byte {
	const turn = "Please summarise the Q3 report: revenue grew 12.5% to 4,210 units across 17 regions (see table 3.2). " +
		"Contact jane.doe@example.com or call (555) 123-4567 about invoice 2024-118; the server at 10.20.30.40 " +
		"logged 3 errors at 12:30:45. Version 1.2.3 shipped. "
	var b bytes.Buffer
	b.WriteString(`{"model":"llama-3-8b","messages":[{"role":"system","content":"You are a careful assistant."}`)
	for b.Len() < n-len(turn)-64 {
		b.WriteString(`,{"role":"user","content":"` + turn + `"}`)
	}
	b.WriteString(`],"max_tokens":256}`)
	return b.Bytes()
}
