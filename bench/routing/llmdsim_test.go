package main

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/sim"
)

// llmdTokens counts a text's tokens as llm-d-inference-sim's simulated
// tokenizer does for texts of lower-case words and spaces: one token per
// word, with the spaces after it.
func llmdTokens(text string) int { return len(strings.Fields(text)) }

func TestLLMDArgsMapHsServers(t *testing.T) {
	base := parseSimHelp(`      --inter-token-latency duration      x (default 8ms)
      --max-num-seqs int                  x (default 256)
      --prefill-overhead duration         x (default 5ms)
      --prefill-time-per-token duration   x (default 15µs)
`)
	l := &llmdSim{seed: 7}
	for i, want := range []struct {
		blocks, perToken, itl string
	}{
		{"4000", "22.5µs", "12ms"},
		{"8000", "18.75µs", "10ms"},
		{"12000", "15µs", "8ms"},
		{"16000", "12µs", "6ms"}, // 6.4 ms runs as 6: the sim truncates to whole ms
	} {
		srv := defaultHetero.Servers[i]
		got := flagValues(l.args("4242", srv, base))
		for flag, v := range map[string]string{"--kv-cache-size": want.blocks, "--block-size": "16", "--prefill-time-per-token": want.perToken,
			"--inter-token-latency": want.itl, "--prefill-overhead": "5ms", "--max-num-seqs": "256", "--port": "4242", "--seed": "7",
			"--model": sim.DefaultModel, "--enable-kvcache": "", "--force-dummy-tokenizer": "", "--zmq-endpoint": ""} {
			if g, ok := got[flag]; !ok || g != v {
				t.Errorf("server %d: %s = %q (set %v), want %q", i, flag, g, ok, v)
			}
		}
		if m := llmdModel(srv, base); m.itl.String() != want.itl || m.perToken.String() != want.perToken || !m.known {
			t.Errorf("server %d: model %+v, want ITL %s, %s per token", i, m, want.itl, want.perToken)
		}
	}
	if got := llmdEnv("pod-2"); !reflect.DeepEqual(got, []string{"POD_NAME=pod-2", "POD_IP=127.0.0.1"}) {
		t.Fatalf("env %q", got)
	}
}

// flagValues reads --flag value, --flag=value and --switch ("").
func flagValues(args []string) map[string]string {
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		name, v, eq := strings.Cut(args[i], "=")
		switch {
		case eq:
			out[name] = v
		case i+1 < len(args) && !strings.HasPrefix(args[i+1], "--"):
			out[name] = args[i+1]
			i++
		default:
			out[name] = ""
		}
	}
	return out
}

func TestLLMDOptionsAreRefusedWithAReason(t *testing.T) {
	ok := options{scale: 1}
	if err := checkLLMDOptions(ok, []string{"h"}); err != nil {
		t.Fatalf("h at time scale 1: %v", err)
	}
	for _, tc := range []struct {
		o    options
		keys []string
		want string
	}{
		{options{scale: 10}, []string{"h"}, "--time-scale 1, not 10"},
		{options{scale: 1, failover: true}, []string{"h"}, "--failover"},
		{options{scale: 1}, []string{"a", "h"}, "workload h only, not --workloads a,h"},
	} {
		err := checkLLMDOptions(tc.o, tc.keys)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v %v: error %v, want one containing %q", tc.o, tc.keys, err, tc.want)
		}
	}
}

func TestLLMDTextCutsLongWordsAndKeepsPrefixes(t *testing.T) {
	for in, want := range map[string]string{
		" ab cdefghijk":                     " ab cdefghij k",
		" abcdefghijklmnopqrst x":           " abcdefgh ijklmnop qrst x",
		" abcdefgh":                         " abcdefgh",
		"":                                  "",
		" a ":                               " a ",
		" abcdefghijklmnopqrstuvwxyzabcdef": " abcdefgh ijklmnop qrstuvwx yzabcdef",
	} {
		if got := llmdText(in); got != want {
			t.Errorf("llmdText(%q) = %q, want %q", in, got, want)
		}
	}
	g := newTextGen(3)
	g.tok = wordsTokenizer
	for range 20 {
		prefix, suffix := g.text(300), g.text(40)
		whole := llmdText(prefix + suffix)
		if !strings.HasPrefix(whole, llmdText(prefix)) {
			t.Fatal("a prompt's prefix is cut differently from the prefix alone")
		}
		if n, want := llmdTokens(whole), wordsTokenizer.count(whole); n != want || n != 340 {
			t.Fatalf("%d tokens for llm-d-inference-sim, %d for infergate sim's words tokenizer, want 340 both", n, want)
		}
	}
}

func TestLLMDHeteroWorkloadHasItsTokenCountsAndSharedPrefixes(t *testing.T) {
	s := quickHetero
	w := llmdHeteroWorkload(s, 1)
	plain := heteroWorkload(s, 1)
	if w.key != "h" || w.requests() != plain.requests() || w.groups != plain.groups || !reflect.DeepEqual(w.servers, plain.servers) || w.concurrency != plain.concurrency {
		t.Fatalf("llm-d workload %s: %d requests, %d groups, servers %v; h has %d, %d, %v", w.key, w.requests(), w.groups, w.servers, plain.requests(), plain.groups, plain.servers)
	}
	if !strings.Contains(w.name, llmdSimName) || !strings.Contains(w.describe, llmdSimName+" servers (not infergate sim)") {
		t.Fatalf("the table does not name the simulator: %q / %q", w.name, w.describe)
	}
	prefixOf := map[int]string{}
	firstBlocks := map[string]int{}
	for _, ss := range w.sessions {
		r := ss[0]
		if got := llmdTokens(r.Prompt); got != s.PrefixTokens+s.SuffixTokens || r.promptTokens() != got {
			t.Fatalf("prompt of %d llm-d tokens, %d of infergate sim's words tokenizer; want %d", got, r.promptTokens(), s.PrefixTokens+s.SuffixTokens)
		}
		for _, word := range strings.Fields(r.Prompt) {
			if len(word) > llmdWordBytes || strings.Trim(word, "abcdefghijklmnopqrstuvwxyz") != "" {
				t.Fatalf("word %q: want 1 to %d lower-case letters", word, llmdWordBytes)
			}
		}
		p := firstWords(r.Prompt, s.PrefixTokens)
		if q, ok := prefixOf[r.Group]; ok && q != p {
			t.Fatalf("group %d: two different prefixes", r.Group)
		}
		prefixOf[r.Group] = p
		first := firstWords(r.Prompt, 16) // one KV block
		if g, ok := firstBlocks[first]; ok && g != r.Group {
			t.Fatalf("groups %d and %d share their first block", g, r.Group)
		}
		firstBlocks[first] = r.Group
	}
	if len(prefixOf) != s.Prefixes {
		t.Fatalf("%d prefixes, want %d", len(prefixOf), s.Prefixes)
	}
}

func TestIgnoreEOSAddsTheFieldAndKeepsTheRequest(t *testing.T) {
	var sent []byte
	var length int64
	tr := ignoreEOS{next: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent, _ = io.ReadAll(r.Body)
		length = r.ContentLength
		return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
	})}
	c := newClient("m", 1, time.Second)
	c.http.Transport = tr
	raw, path, err := c.encode(request{Prompt: "hello", MaxTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://x"+path, strings.NewReader(string(raw)))
	if _, err := c.http.Do(req); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(sent, &got); err != nil {
		t.Fatalf("sent %q: %v", sent, err)
	}
	if got["ignore_eos"] != true || got["prompt"] != "hello" || got["max_tokens"] != 3.0 || got["stream"] != true || length != int64(len(sent)) {
		t.Fatalf("sent %s (Content-Length %d)", sent, length)
	}
	for _, in := range []string{"", "{}", " { } ", "[1]", "null"} {
		if out := string(withIgnoreEOS([]byte(in))); out != in {
			t.Errorf("withIgnoreEOS(%q) = %q, want it unchanged", in, out)
		}
	}
	var nilSim *llmdSim
	c2 := newClient("m", 1, time.Second)
	before := c2.http.Transport
	nilSim.wrap(c2)
	if c2.http.Transport != before {
		t.Fatal("a nil llmdSim changed the client")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestLLMDNotesNameTheSimAndSkipRowsWithoutCalibration(t *testing.T) {
	nan := math.NaN()
	learned := &runStats{label: "infergate-default", pods: []string{"pod-0"}, promptBytes: []float64{600}, promptTokens: []float64{100},
		endpoints: []endpointFigures{{bytesPerToken: 6.5, calibrated: true, indexBlocks: nan, hitIndex: nan, hitServer: nan}}}
	oracle := &runStats{label: "oracle-capacity", pods: []string{"pod-0"}, promptBytes: []float64{600}, promptTokens: []float64{100},
		endpoints: []endpointFigures{{bytesPerToken: nan, indexBlocks: nan, hitIndex: nan, hitServer: nan}}}
	out := captureStdout(t, func() { (&llmdSim{}).notes([]*runStats{learned, oracle, {label: "round-robin"}}) })
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "infergate-default on "+llmdSimName) || !strings.Contains(out, "learned them 6.50, as the sims counted them 6.00") {
		t.Fatalf("notes:\n%s", out)
	}
	if out := captureStdout(t, func() { (*llmdSim)(nil).notes([]*runStats{learned}) }); out != "" {
		t.Fatalf("a nil llmdSim printed %q", out)
	}
}

// captureStdout returns what f prints.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	was := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = was }()
	f()
	w.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
