// Package docs_test checks the project's documents: README.md, every
// docs/*.md and the charts' READMEs. Relative links must resolve to a file or folder of the
// repository, fragments must name a heading of their target, the README
// stays a short page, and no document cites a commit (history belongs in
// commit messages).
package docs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// maxReadmeLines is the README's hard limit: a user's page, with the rest
// in docs/.
const maxReadmeLines = 250

// doc is one Markdown document, read once.
type doc struct {
	path  string   // as the test opens it, relative to docs/
	name  string   // as errors name it, relative to the repository root
	lines []string // the raw lines
	prose []bool   // prose[i]: line i is outside fenced code blocks
}

// documents reads ../README.md, every *.md in this folder and the charts'
// READMEs.
func documents(t *testing.T) []*doc {
	t.Helper()
	paths := []string{filepath.Join("..", "README.md")}
	for _, pattern := range []string{"*.md", filepath.Join("..", "charts", "*", "README.md")} {
		mds, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(mds)
		paths = append(paths, mds...)
	}
	var docs []*doc
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		d := &doc{path: p, name: repoName(p), lines: strings.Split(string(b), "\n")}
		d.prose = proseLines(d.lines)
		docs = append(docs, d)
	}
	return docs
}

// repoName is a path relative to docs/ written relative to the repository
// root, for messages.
func repoName(p string) string {
	if rel, ok := strings.CutPrefix(filepath.ToSlash(p), "../"); ok {
		return rel
	}
	return "docs/" + filepath.ToSlash(p)
}

var fence = regexp.MustCompile("^\\s*(```|~~~)")

// proseLines marks the lines outside fenced code blocks (the fence lines
// themselves count as code).
func proseLines(lines []string) []bool {
	prose := make([]bool, len(lines))
	in := false
	for i, l := range lines {
		if fence.MatchString(l) {
			in = !in
			continue
		}
		prose[i] = !in
	}
	return prose
}

var (
	// inlineCode is a code span; links inside one are text.
	inlineCode = regexp.MustCompile("`+[^`]*`+")
	// mdLink is a Markdown link or image: [text](target) or
	// [text](target "title"), the text possibly holding an image.
	mdLink = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	// htmlLink is an HTML anchor or image target.
	htmlLink = regexp.MustCompile(`(?i)<(?:a|img)\s[^>]*(?:href|src)\s*=\s*"([^"]*)"`)
)

// link is one link target found in a document.
type link struct {
	line   int // 1-based
	target string
}

// links returns every link target of the document's prose, code spans
// and fenced blocks left out.
func (d *doc) links() []link {
	var out []link
	for i, l := range d.lines {
		if !d.prose[i] {
			continue
		}
		l = inlineCode.ReplaceAllString(l, "")
		for _, target := range mdTargets(l) {
			out = append(out, link{i + 1, target})
		}
		for _, m := range htmlLink.FindAllStringSubmatch(l, -1) {
			out = append(out, link{i + 1, m[1]})
		}
	}
	return out
}

// mdTargets returns the Markdown link and image targets of s, those of
// images inside a link's text included ([![badge](b.svg)](url)).
func mdTargets(s string) []string {
	var out []string
	for _, m := range mdLink.FindAllStringSubmatch(s, -1) {
		out = append(out, mdTargets(m[1])...)
		out = append(out, m[2])
	}
	return out
}

var heading = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$`)

// anchors returns the GitHub anchors of the document's headings, with the
// -1, -2 suffixes GitHub gives repeated ones.
func (d *doc) anchors() map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for i, l := range d.lines {
		if !d.prose[i] {
			continue
		}
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

var inlineLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)

// slug is GitHub's anchor for a heading: links reduced to their text,
// lower case, every character but letters, digits, marks, '_', '-' and
// spaces dropped, spaces turned into '-'.
func slug(h string) string {
	h = inlineLink.ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.M, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"The endpoint picker", "the-endpoint-picker"},
		{"FailOpen on Envoy", "failopen-on-envoy"},
		{"Why the default is grpc-go", "why-the-default-is-grpc-go"},
		{"h2spec (`test/h2spec`)", "h2spec-testh2spec"},
		{"Kubernetes mode: pool, pods & objectives", "kubernetes-mode-pool-pods--objectives"},
		{"The [Wasm](wasm.md) plugin", "the-wasm-plugin"},
		{"snake_case stays", "snake_case-stays"},
	} {
		if got := slug(tc.heading); got != tc.want {
			t.Errorf("slug(%q) = %q, want %q", tc.heading, got, tc.want)
		}
	}
}

// external reports whether a target leaves the repository.
func external(target string) bool {
	for _, p := range []string{"http://", "https://", "mailto:"} {
		if strings.HasPrefix(strings.ToLower(target), p) {
			return true
		}
	}
	return false
}

func TestRelativeLinksResolve(t *testing.T) {
	docs := documents(t)
	byPath := map[string]*doc{}
	for _, d := range docs {
		byPath[filepath.Clean(d.path)] = d
	}
	anchorsOf := func(p string) (map[string]bool, error) {
		if d, ok := byPath[filepath.Clean(p)]; ok {
			return d.anchors(), nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		lines := strings.Split(string(b), "\n")
		return (&doc{path: p, lines: lines, prose: proseLines(lines)}).anchors(), nil
	}
	checked := 0
	for _, d := range docs {
		for _, l := range d.links() {
			if l.target == "" {
				t.Errorf("%s:%d: empty link target", d.name, l.line)
				continue
			}
			if external(l.target) {
				continue
			}
			checked++
			file, frag, _ := strings.Cut(l.target, "#")
			p := d.path
			if file != "" {
				if filepath.IsAbs(file) {
					t.Errorf("%s:%d: %s: an absolute path; link relative to the document", d.name, l.line, l.target)
					continue
				}
				p = filepath.Join(filepath.Dir(d.path), filepath.FromSlash(file))
				st, err := os.Stat(p)
				if err != nil {
					t.Errorf("%s:%d: %s: no such file or folder", d.name, l.line, l.target)
					continue
				}
				if st.IsDir() || !strings.HasSuffix(strings.ToLower(p), ".md") {
					if frag != "" && !st.IsDir() {
						// A fragment into a non-Markdown file (a line
						// number, say) is not checked.
						continue
					}
					if frag != "" {
						t.Errorf("%s:%d: %s: a fragment on a folder", d.name, l.line, l.target)
					}
					continue
				}
			}
			if frag == "" {
				continue
			}
			anchors, err := anchorsOf(p)
			if err != nil {
				t.Errorf("%s:%d: %s: %v", d.name, l.line, l.target, err)
				continue
			}
			if !anchors[frag] {
				t.Errorf("%s:%d: %s: no heading with anchor #%s in %s", d.name, l.line, l.target, frag, repoName(p))
			}
		}
	}
	if checked == 0 {
		t.Error("no relative links found: is the link pattern broken?")
	}
}

func TestLinkPattern(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
	}{
		{"see [the picker](picker.md) and [Istio](istio.md#install)", []string{"picker.md", "istio.md#install"}},
		{"![diagram](img/a.png \"title\")", []string{"img/a.png"}},
		{"[![badge](b.svg)](https://example.com)", []string{"b.svg", "https://example.com"}},
		{"a `[not](a-link.md)` code span", nil},
		{"`inferencePool.targetPorts[0].number=8000` (a flag)", nil},
		{`<a href="picker.md#metrics">metrics</a>`, []string{"picker.md#metrics"}},
		{"[anchor](#layout)", []string{"#layout"}},
	} {
		d := &doc{lines: []string{tc.line}, prose: []bool{true}}
		var got []string
		for _, l := range d.links() {
			got = append(got, l.target)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("links of %q = %q, want %q", tc.line, got, tc.want)
		}
	}
}

func TestReadmeIsShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > maxReadmeLines {
		t.Errorf("README.md has %d lines, at most %d: move detail into docs/", n, maxReadmeLines)
	}
}

// hexWord is a word of 7 to 40 hexadecimal digits that is not part of a
// longer name: not after '-', '_', '.', '/', ':' (a Go pseudo-version's
// hash, a UUID, a path, a digest) nor before '-', '_', '/', ':' or a
// '.' that goes on (a file name).
var hexWord = regexp.MustCompile(`(^|[^-_./:0-9A-Za-z])([0-9a-fA-F]{7,40})($|[^-_/:0-9A-Za-z.]|\.($|[^0-9A-Za-z]))`)

// commitHash returns the words of s that look like abbreviated or full
// commit hashes: hexWord with at least one decimal digit and at least one
// letter a-f, so that numbers (1000000) and words (deadbeef, facade) pass.
func commitHash(s string) []string {
	var out []string
	// Matches share their boundary characters; scan from each match's word.
	for rest := s; ; {
		loc := hexWord.FindStringSubmatchIndex(rest)
		if loc == nil {
			return out
		}
		w := rest[loc[4]:loc[5]]
		if strings.ContainsAny(w, "0123456789") && strings.ContainsAny(strings.ToLower(w), "abcdef") {
			out = append(out, w)
		}
		rest = rest[loc[5]:]
	}
}

func TestCommitHashPattern(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []string
	}{
		{"measured at 69d423a (5 rounds)", []string{"69d423a"}},
		{"the binary of commit `49195a6`", []string{"49195a6"}},
		{"(49195a6 and 50af915)", []string{"49195a6", "50af915"}},
		{"a full hash 4265d95f0b3c2a1e9d8c7b6a5f4e3d2c1b0a9f8e here", []string{"4265d95f0b3c2a1e9d8c7b6a5f4e3d2c1b0a9f8e"}},
		{"ends a sentence at ec52e65.", []string{"ec52e65"}},
		{"istio.io/istio v0.0.0-20260827124520-eed52ebb66ad", nil},
		{"the report v0.0.0-20260827124520-eed52ebb66ad-default-gateway-report.yaml", nil},
		{"1000000 requests, 1048576 bytes, 20260827 dated", nil},
		{"deadbeef and facade are words", nil},
		{"a UUID 550e8400-e29b-41d4-a716-446655440000", nil},
		{"sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", nil},
		{"the file 1a2b3c4d.yaml", nil},
		{"gpu a100 and 2e3 tokens", nil},
	} {
		if got := commitHash(tc.text); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("commitHash(%q) = %q, want %q", tc.text, got, tc.want)
		}
	}
}

func TestNoCommitHashes(t *testing.T) {
	for _, d := range documents(t) {
		for i, l := range d.lines {
			for _, h := range commitHash(l) {
				t.Errorf("%s:%d: %q looks like a commit hash: documents give current facts; history goes in commit messages", d.name, i+1, h)
			}
		}
	}
}
