package policy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/infergate/infergate/inference"
	"github.com/infergate/infergate/inference/pii"
	"github.com/infergate/infergate/inference/policy"
	"github.com/infergate/infergate/inference/textnorm"
)

// benignCeilings is the highest false-positive rate (flagged items over
// items) each detector may have on the benign corpus in
// testdata/benign: ordinary LLM traffic (code, numpy and torch prints,
// logs, CSV, invoices, dates, versions, matrices, tool calls) that holds
// no personal data. The detectors of the documented example
// configuration's reject rules (ssn, iban and the prompt-injection deny
// rule, see docs/payload.md) must flag nothing: a false positive there
// refuses an ordinary request with a 403. The masking detectors alter
// the text they flag; their ceilings are the measured rates once fixed.
var benignCeilings = []struct {
	detector string
	ceiling  float64
	// reject: a reject rule of the documented configuration; any hit
	// fails the test whatever the ceiling.
	reject bool
}{
	{"email", 0, false},
	{"credit-card", 0, false},
	{"phone", 0, false},
	{"ipv4", 0.0064, false}, // 2 of 313: lists of bare four-part versions and an OID table, read as addresses
	{"ipv6", 0, false},
	{"ssn", 0, true},
	{"iban", 0, true},
	{"deny", 0, true},
}

// benignDeny is the deny rule of docs/payload.md's example configuration.
const benignDeny = `{"deny":[{"name":"prompt-injection",` +
	`"contains":["ignore previous instructions","ignore all previous instructions"],` +
	`"regex":"(?i)\\byou are now DAN\\b"}]}`

var benignDenyRegex = regexp.MustCompile(`(?i)\byou are now DAN\b`)

// benignMaxItem is the most text one item of a split file holds: the
// rate is per request of ordinary size, not per file.
const benignMaxItem = 8 << 10

// benignItem is one request body of the corpus.
type benignItem struct {
	file  string // path under testdata/benign, slash-separated
	index int    // the item's index among the file's items
	// shape: "request" (a request body file used as is), "content" (text
	// as a user message's content) or "arguments" (a JSON document as an
	// assistant tool call's arguments string).
	shape string
	body  []byte
}

func (it benignItem) String() string { return fmt.Sprintf("%s#%d (%s)", it.file, it.index, it.shape) }

// category is the corpus folder the item's file is in.
func (it benignItem) category() string {
	if dir, _, ok := strings.Cut(it.file, "/"); ok {
		return dir
	}
	return "."
}

// loadBenign reads every file of testdata/benign but SOURCES.md into
// items. A .json file that is a request body (an object with "model") is
// one item as it is. Any other file is text: split at line boundaries
// into pieces of at most benignMaxItem bytes, each the content of a user
// message of a chat request; a .json document that is not a request is
// also, whole, the arguments string of an assistant tool call.
func loadBenign(tb testing.TB) []benignItem {
	tb.Helper()
	root := filepath.Join("testdata", "benign")
	var items []benignItem
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "SOURCES.md" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !utf8.Valid(data) {
			return fmt.Errorf("%s: not UTF-8", rel)
		}
		isJSON := path.Ext(rel) == ".json"
		if isJSON {
			if !json.Valid(data) {
				return fmt.Errorf("%s: not valid JSON", rel)
			}
			var obj map[string]json.RawMessage
			if json.Unmarshal(data, &obj) == nil && obj["model"] != nil {
				items = append(items, benignItem{file: rel, shape: "request", body: data})
				return nil
			}
		}
		n := 0
		for _, piece := range splitLines(string(data), benignMaxItem) {
			items = append(items, benignItem{file: rel, index: n, shape: "content", body: userMessage(piece)})
			n++
		}
		if isJSON {
			items = append(items, benignItem{file: rel, index: n, shape: "arguments", body: toolCall(string(data))})
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	if len(items) == 0 {
		tb.Fatal("the benign corpus is empty")
	}
	return items
}

// splitLines cuts text into pieces of at most max bytes at line ends; a
// longer line is a piece of its own.
func splitLines(text string, max int) []string {
	var pieces []string
	for len(text) > max {
		cut := strings.LastIndexByte(text[:max], '\n') + 1
		if cut == 0 {
			if cut = strings.IndexByte(text, '\n') + 1; cut == 0 {
				break
			}
		}
		pieces = append(pieces, text[:cut])
		text = text[cut:]
	}
	if strings.TrimSpace(text) != "" {
		pieces = append(pieces, text)
	}
	return pieces
}

func jsonString(s string) []byte {
	q, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return q
}

func userMessage(text string) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":` + string(jsonString(text)) + `}]}`)
}

func toolCall(doc string) []byte {
	return []byte(`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",` +
		`"function":{"name":"f","arguments":` + string(jsonString(doc)) + `}}]}]}`)
}

// benignDetector is one rule compiled on its own.
type benignDetector struct {
	name   string
	set    pii.Set // the kinds, for excerpts; 0 for the deny rule
	policy *policy.Policy
}

func benignDetectors(tb testing.TB) []benignDetector {
	tb.Helper()
	var ds []benignDetector
	for _, c := range benignCeilings {
		config := benignDeny
		var set pii.Set
		if c.detector != "deny" {
			config = fmt.Sprintf(`{"pii":[{"name":%q,"detector":%q,"action":"reject"}]}`, c.detector, c.detector)
			var err error
			if set, err = pii.ParseKind(c.detector); err != nil {
				tb.Fatal(err)
			}
		}
		cfg, err := policy.DecodeJSON([]byte(config))
		if err != nil {
			tb.Fatalf("%s: %v", c.detector, err)
		}
		p, err := policy.Compile(cfg)
		if err != nil {
			tb.Fatalf("%s: %v", c.detector, err)
		}
		ds = append(ds, benignDetector{name: c.detector, set: set, policy: p})
	}
	return ds
}

// flags runs the detector's policy on the item: true when it refuses it
// for the rule (403). Any other refusal is an error of the corpus.
func (d benignDetector) flags(it benignItem) (bool, error) {
	res := d.policy.Apply(it.body)
	switch r := res.Reject; {
	case r == nil:
		return false, nil
	case r.Status == 403 && (r.Reason == policy.ReasonPII || r.Reason == policy.ReasonDenied):
		return true, nil
	default:
		return false, fmt.Errorf("%s: refused %d %s: %s", it, r.Status, r.Reason, r.Message)
	}
}

// TestBenignCorpus measures each detector's false positives on the
// benign corpus: it logs the rate and, for every flagged item, where and
// what was found, and fails for any hit of a reject rule and for a rate
// over the detector's ceiling.
//
//	go test ./inference/policy -run TestBenignCorpus -v
func TestBenignCorpus(t *testing.T) {
	items := loadBenign(t)
	logBenignCounts(t, items)

	// Every item is a valid request: a refusal then means a detector.
	plain, err := policy.Compile(&policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if r := plain.Apply(it.body).Reject; r != nil {
			t.Fatalf("%s is not a valid request: %d %s: %s", it, r.Status, r.Reason, r.Message)
		}
	}

	type summary struct {
		name    string
		flagged int
	}
	var sums []summary
	for i, d := range benignDetectors(t) {
		c := benignCeilings[i]
		var flagged []benignItem
		for _, it := range items {
			hit, err := d.flags(it)
			if err != nil {
				t.Fatal(err)
			}
			if hit {
				flagged = append(flagged, it)
			}
		}
		sums = append(sums, summary{d.name, len(flagged)})
		t.Run(d.name, func(t *testing.T) {
			rate := float64(len(flagged)) / float64(len(items))
			t.Logf("%s: %d of %d items flagged, rate %.4f (ceiling %.4f)", d.name, len(flagged), len(items), rate, c.ceiling)
			for _, it := range flagged {
				for _, line := range benignExcerpts(d, it) {
					t.Logf("  %s: %s", it, line)
				}
			}
			switch {
			case c.reject && len(flagged) > 0:
				t.Errorf("%s is a reject rule of the documented configuration: %d ordinary requests would be refused with 403", d.name, len(flagged))
			case rate > c.ceiling:
				t.Errorf("%s: false-positive rate %.4f (%d of %d items) is over its ceiling %.4f", d.name, rate, len(flagged), len(items), c.ceiling)
			}
		})
	}
	for _, s := range sums {
		t.Logf("%-12s %4d / %d  %.4f", s.name, s.flagged, len(items), float64(s.flagged)/float64(len(items)))
	}
}

// logBenignCounts logs how many items and bytes each corpus folder and
// shape holds.
func logBenignCounts(t *testing.T, items []benignItem) {
	type count struct{ items, bytes int }
	counts := map[string]*count{}
	var keys []string
	for _, it := range items {
		k := it.category() + "/" + it.shape
		if counts[k] == nil {
			counts[k] = &count{}
			keys = append(keys, k)
		}
		counts[k].items++
		counts[k].bytes += len(it.body)
	}
	sort.Strings(keys)
	total := 0
	for _, k := range keys {
		t.Logf("corpus %-20s %4d items %8d bytes", k, counts[k].items, counts[k].bytes)
		total += counts[k].bytes
	}
	t.Logf("corpus total %d items, %d bytes of request bodies", len(items), total)
}

// benignExcerpts says what the detector found in the item, ±30 characters
// around each finding, found by running the detector directly on the
// texts the guardrails read, joined in prompt order as the policy joins
// them.
func benignExcerpts(d benignDetector, it benignItem) []string {
	body, err := inference.Parse(it.body)
	if err != nil {
		return []string{err.Error()}
	}
	var join strings.Builder
	var roles []string
	space := true // the join so far ends with white space (or is empty)
	tree := false // the last text was of a tree (texts of one are apart by NUL)
	body.Texts(func(t inference.Text) bool {
		v := t.Value()
		switch {
		case t.Role():
			roles = append(roles, v)
		case v != "":
			if !space && !asciiSpaceByte(v[0]) {
				sep := byte(' ')
				if tree && t.Tree() {
					sep = 0
				}
				join.WriteByte(sep)
			}
			join.WriteString(v)
			space, tree = asciiSpaceByte(v[len(v)-1]), t.Tree()
		}
		return true
	})
	var out []string
	for _, text := range append([]string{join.String()}, roles...) {
		if d.set == 0 {
			out = append(out, denyExcerpts(text)...)
		} else {
			out = append(out, piiExcerpts(text, d.set)...)
		}
	}
	if len(out) == 0 {
		return []string{"(not reproduced outside the policy: the finding is in a reading this harness does not rebuild)"}
	}
	const most = 12
	if len(out) > most {
		out = append(out[:most], fmt.Sprintf("... and %d more", len(out)-most))
	}
	return out
}

func asciiSpaceByte(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// piiExcerpts runs pii.Find on the folded text (and on the reading where
// invisible characters are spaces) and maps each finding back to text.
func piiExcerpts(text string, set pii.Set) []string {
	var out []string
	seen := map[[2]int]bool{}
	for _, f := range []textnorm.Folded{textnorm.Fold(text), textnorm.FoldSpaced(text)} {
		for _, m := range pii.Find(nil, f.S, set, -1) {
			start, end := f.Span(m.Start, m.End)
			if seen[[2]int{start, end}] {
				continue
			}
			seen[[2]int{start, end}] = true
			out = append(out, fmt.Sprintf("%s %q in %s", m.Kind, text[start:end], excerpt(text, start, end)))
		}
	}
	return out
}

// denyExcerpts finds the deny rule's expression or phrases in text.
func denyExcerpts(text string) []string {
	var out []string
	folded := textnorm.Fold(text)
	for _, s := range []string{text, textnorm.Latin(folded.S)} {
		if loc := benignDenyRegex.FindStringIndex(s); loc != nil {
			out = append(out, fmt.Sprintf("regex in %s", excerpt(s, loc[0], loc[1])))
			break
		}
	}
	compact := textnorm.Compact(folded.S)
	for _, phrase := range []string{"ignore previous instructions", "ignore all previous instructions"} {
		if i := strings.Index(compact, textnorm.Compact(phrase)); i >= 0 {
			out = append(out, fmt.Sprintf("phrase %q in the compact text %s", phrase, excerpt(compact, i, i+len(textnorm.Compact(phrase)))))
		}
	}
	return out
}

// excerpt quotes s[start:end] with up to 30 characters either side.
func excerpt(s string, start, end int) string {
	from, to := start, end
	for n := 0; n < 30 && from > 0; n++ {
		_, size := utf8.DecodeLastRuneInString(s[:from])
		from -= size
	}
	for n := 0; n < 30 && to < len(s); n++ {
		_, size := utf8.DecodeRuneInString(s[to:])
		to += size
	}
	return fmt.Sprintf("%q", s[from:start]+"«"+s[start:end]+"»"+s[end:to])
}

// TestBenignCorpusSources checks that SOURCES.md has a row for every file
// of the corpus, and no row for a file that is not there.
func TestBenignCorpusSources(t *testing.T) {
	root := filepath.Join("testdata", "benign")
	sources, err := os.ReadFile(filepath.Join(root, "SOURCES.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(string(sources), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
		rows[name] = true
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if rel == "SOURCES.md" {
			return nil
		}
		if info, err := d.Info(); err == nil && info.Size() > 200<<10 {
			t.Errorf("%s: %d bytes; keep corpus files under 200 KB", rel, info.Size())
		}
		if !rows[rel] {
			t.Errorf("%s has no row in SOURCES.md", rel)
		}
		delete(rows, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range rows {
		t.Errorf("SOURCES.md lists %s, which is not in the corpus", name)
	}
}

// BenchmarkBenignCorpus runs every detector over the whole corpus per
// op and reports each one's false-positive rate as fp-<detector>
// (flagged items over items) and the corpus items each pass reads as
// items/op. Nonzero rates are reported, not failed: the test judges them.
func BenchmarkBenignCorpus(b *testing.B) {
	items := loadBenign(b)
	ds := benignDetectors(b)
	size := 0
	for _, it := range items {
		size += len(it.body)
	}
	b.SetBytes(int64(size * len(ds)))
	flagged := make([]int, len(ds))
	for b.Loop() {
		for i, d := range ds {
			flagged[i] = 0
			for _, it := range items {
				hit, err := d.flags(it)
				if err != nil {
					b.Fatal(err)
				}
				if hit {
					flagged[i]++
				}
			}
		}
	}
	var report bytes.Buffer
	for i, d := range ds {
		rate := float64(flagged[i]) / float64(len(items))
		b.ReportMetric(rate, "fp-"+d.name)
		fmt.Fprintf(&report, " %s=%d/%d", d.name, flagged[i], len(items))
	}
	b.ReportMetric(float64(len(items)), "items/op")
	b.Logf("flagged:%s", report.String())
}
