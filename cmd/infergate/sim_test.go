package main

import (
	"regexp"
	"strings"
	"testing"
)

func TestSimTokenizerFlags(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string // substring of the error
	}{
		{"unknown tokenizer", []string{"--tokenizer", "bpe"}, `--tokenizer must be bytes or words, got "bpe"`},
		{"bytes per token too small", []string{"--bytes-per-token", "1"}, "--bytes-per-token must be within 2..8, got 1"},
		{"bytes per token too large", []string{"--tokenizer", "bytes", "--bytes-per-token", "9"}, "--bytes-per-token must be within 2..8, got 9"},
		{"bytes per token with words", []string{"--tokenizer", "words", "--bytes-per-token", "3"}, "--bytes-per-token applies to --tokenizer bytes only, got 3 with --tokenizer words"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := execute(append([]string{"sim", "--port", "0"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}

}

// TestSimHelp checks that the help documents the tokenizer flags and still
// gives the defaults that bench/routing reads from it (parseSimHelp there).
func TestSimHelp(t *testing.T) {
	out, err := execute("sim", "--help")
	if err != nil {
		t.Fatal(err)
	}
	defaultRE := regexp.MustCompile(`--([a-z-]+) \S+ .*\(default ([^)]+)\)`)
	defs := map[string]string{}
	for line := range strings.SplitSeq(out, "\n") {
		if m := defaultRE.FindStringSubmatch(line); m != nil {
			defs[m[1]] = m[2]
		}
	}
	for flag, want := range map[string]string{
		"tokenizer":              `"bytes"`,
		"bytes-per-token":        "4",
		"prefill-overhead":       "5ms",
		"prefill-time-per-token": "15µs",
		"inter-token-latency":    "8ms",
		"max-num-seqs":           "256",
	} {
		if defs[flag] != want {
			t.Errorf("--%s default in help = %q, want %q\n%s", flag, defs[flag], want, out)
		}
	}
	for _, doc := range []string{"words", "--bytes-per-token bytes", "2 to 8"} {
		if !strings.Contains(out, doc) {
			t.Errorf("help lacks %q", doc)
		}
	}
}
