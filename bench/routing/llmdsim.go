package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/sim"
)

// llmdSimName names the outside simulator in the output.
const llmdSimName = "llm-d-inference-sim"

// llmdSim runs workload h's servers on llm-d-inference-sim, a simulator
// infergate did not write, so that the routing is checked against a
// server whose cache, counters and metrics are someone else's reading of
// vLLM. Its module is not on the Go module proxy, so it is built outside
// the repository and named by --llmd-sim; nil when the flag is unset.
type llmdSim struct {
	binary string
	sum    string // the binary's sha256, printed so that a run names its build
	seed   uint64
}

// Facts about llm-d-inference-sim that the flags below depend on.
const (
	// llmdMaxModelLen is its context window, which it checks every
	// prompt against (its default, 1,024 tokens, is shorter than h's
	// 2,176-token prompts); large enough never to refuse one.
	llmdMaxModelLen = 32768
	// llmdWordBytes: infergate sim's words tokenizer cuts a word every 8
	// bytes (sim's wordBytes), while llm-d-inference-sim's simulated
	// tokenizer makes one token of a word of any length.
	llmdWordBytes = 8
)

// newLLMDSim checks the binary and the other flags: the outside sim runs
// workload h alone, in real time.
func newLLMDSim(binary string, o options, keys []string) (*llmdSim, error) {
	if err := checkLLMDOptions(o, keys); err != nil {
		return nil, err
	}
	f, err := os.Open(binary)
	if err != nil {
		return nil, fmt.Errorf("--llmd-sim: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, fmt.Errorf("--llmd-sim: read %s: %w", binary, err)
	}
	return &llmdSim{binary: binary, sum: hex.EncodeToString(h.Sum(nil)), seed: o.seed}, nil
}

// checkLLMDOptions refuses what --llmd-sim cannot run. llm-d-inference-sim
// has no time scale: its latencies are wall-clock time. The failover
// run's prompts are made for infergate sim's 4-byte tokenizer in
// failover.go, and workloads other than h have no mapping of their
// servers.
func checkLLMDOptions(o options, keys []string) error {
	var errs []error
	if o.scale != 1 {
		errs = append(errs, fmt.Errorf("--llmd-sim runs at --time-scale 1, not %g: %s has no time scale, its latencies are wall-clock time", o.scale, llmdSimName))
	}
	if o.failover {
		errs = append(errs, errors.New("--llmd-sim does not run --failover: the failover stream's prompts are made for infergate sim's tokenizer"))
	}
	if !slices.Equal(keys, []string{"h"}) {
		errs = append(errs, fmt.Errorf("--llmd-sim runs workload h only, not --workloads %s: add --workloads h", strings.Join(keys, ",")))
	}
	return errors.Join(errs...)
}

// args are one server's flags: h's KV cache in blocks of 16 tokens, its
// pace applied to infergate sim's prefill time per token and inter-token
// latency (base), as many running sequences as infergate sim's, the
// prefix cache on, and nothing that reaches the network: the dummy
// tokenizer (a model name Hugging Face knows would make it look the
// tokenizer up there) and no KV-event publisher.
func (l *llmdSim) args(port string, srv server, base simModel) []string {
	m := llmdModel(srv, base)
	return []string{
		"--model", sim.DefaultModel,
		"--port", port,
		"--enable-kvcache",
		"--kv-cache-size", strconv.Itoa(srv.kv() / sim.DefaultBlockSize),
		"--block-size", strconv.Itoa(sim.DefaultBlockSize),
		"--max-num-seqs", strconv.Itoa(m.maxNumSeqs),
		"--max-model-len", strconv.Itoa(llmdMaxModelLen),
		"--prefill-overhead", m.overhead.String(),
		"--prefill-time-per-token", m.perToken.String(),
		"--inter-token-latency", m.itl.String(),
		"--force-dummy-tokenizer",
		"--zmq-endpoint=",
		"--seed", strconv.FormatUint(l.seed, 10),
	}
}

// llmdEnv is a server's environment: llm-d-inference-sim enables its KV
// cache only with POD_IP set, and names itself in x-inference-pod (which
// the client counts requests per pod by) only with POD_NAME set.
func llmdEnv(name string) []string {
	return []string{"POD_NAME=" + name, "POD_IP=127.0.0.1"}
}

// llmdModel is the latency model a server of h runs on
// llm-d-inference-sim: the server's model (hetero.go) with the
// inter-token latency in whole milliseconds, because the sim truncates
// every latency it draws to whole milliseconds (×0.8 of 8 ms runs as
// 6 ms, not 6.4). The prefill time per token is passed as it is; the sim
// truncates the resulting TTFT, at most 1 ms.
func llmdModel(srv server, base simModel) simModel {
	m := srv.model(base)
	m.itl = m.itl.Truncate(time.Millisecond)
	return m
}

// heteroWorkload is workload h for the run's servers: on
// llm-d-inference-sim its prompts are made for that sim's tokenizer.
func (e *env) heteroWorkload(s heteroSpec, seed uint64) *workload {
	if e.llmd == nil {
		return heteroWorkload(s, seed)
	}
	return llmdHeteroWorkload(s, seed)
}

// llmdHeteroWorkload is h with prompts whose token counts are
// llm-d-inference-sim's: (a)'s generator for infergate sim's words
// tokenizer, every word then cut into pieces of at most 8 bytes
// (llmdText), so that each prompt is as many tokens under both
// tokenizers and h's figures (2,048-token prefixes, 76.8% of the pool's
// KV cache) hold on the outside sim. The pool, groups and yardstick are
// h's.
func llmdHeteroWorkload(s heteroSpec, seed uint64) *workload {
	w := heteroWorkload(s, seed)
	words := measuredWorkload(measuredSpec{Pods: len(s.Servers), Prefixes: s.Prefixes, Repeats: s.Repeats, PrefixTokens: s.PrefixTokens,
		SuffixTokens: s.SuffixTokens, MaxTokens: s.MaxTokens, Concurrency: s.Concurrency, Tokenizer: wordsTokenizer}, seed)
	prefixBytes, n := 0.0, 0
	for _, ss := range words.sessions {
		for i := range ss {
			ss[i].Prompt = llmdText(ss[i].Prompt)
		}
		// Prompts are word-aligned, so the prefix's tokens are the first
		// PrefixTokens words.
		prefixBytes += float64(len(firstWords(ss[0].Prompt, s.PrefixTokens)))
		n++
	}
	w.sessions, w.tok, w.prefixBytes = words.sessions, wordsTokenizer, prefixBytes/float64(max(n, 1))
	w.name = "heterogeneous on " + llmdSimName
	w.describe = strings.Replace(w.describe, fmt.Sprintf("%d sims that differ", len(s.Servers)),
		fmt.Sprintf("%d %s servers (not infergate sim) that differ", len(s.Servers), llmdSimName), 1) +
		fmt.Sprintf(". The servers are %s; prompts are words of 1 to %d lower-case letters, each one token of its simulated tokenizer and of infergate sim's words tokenizer, so the token counts above are its tokens (a %d-token prefix is %.0f bytes); *hit rate* is its own `vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`, the counters infergate sim's figures come from (it adds to them the same cached tokens its responses report in `usage.prompt_tokens_details.cached_tokens`)",
			llmdSimName, llmdWordBytes, s.PrefixTokens, w.prefixBytes)
	return w
}

// llmdText cuts every word of text longer than llmdWordBytes into pieces
// of at most that many bytes, each preceded by a space as a word is.
// llm-d-inference-sim's simulated tokenizer makes one token of each run
// of letters with the white space after it, infergate sim's words
// tokenizer one of each 8 bytes of a word: cut so, a text of lower-case
// words is as many tokens under both. Words keep their place, so a
// prompt's prefix is cut as the prefix alone is, and prompts that share a
// prefix still share it.
func llmdText(text string) string {
	var b strings.Builder
	b.Grow(len(text) + len(text)/16)
	for i := 0; i < len(text); {
		j := i
		for j < len(text) && text[j] != ' ' {
			j++
		}
		for k := i; k < j; k += llmdWordBytes {
			if k > i {
				b.WriteByte(' ')
			}
			b.WriteString(text[k:min(k+llmdWordBytes, j)])
		}
		if j < len(text) {
			b.WriteByte(' ')
		}
		i = j + 1
	}
	return b.String()
}

// firstWords is the start of text up to and including its n-th word
// (words separated by spaces; leading spaces included).
func firstWords(text string, n int) string {
	seen := 0
	for i := 0; i < len(text); i++ {
		if text[i] != ' ' && (i+1 == len(text) || text[i+1] == ' ') {
			seen++
			if seen == n {
				return text[:i+1]
			}
		}
	}
	return text
}

// wrap makes c ask llm-d-inference-sim for answers of max_tokens tokens,
// as infergate sim always gives: without ignore_eos it draws an answer's
// length at random below max_tokens (about 57 of h's 128 on average), and
// the load, the decode time and the throughput would not be h's. A nil
// l leaves c alone.
func (l *llmdSim) wrap(c *client) {
	if l == nil {
		return
	}
	c.http.Transport = ignoreEOS{next: c.http.Transport}
}

// ignoreEOS is a RoundTripper that adds "ignore_eos": true to every JSON
// object body it sends.
type ignoreEOS struct{ next http.RoundTripper }

var ignoreEOSField = []byte(`"ignore_eos":true,`)

func (t ignoreEOS) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Method != http.MethodPost {
		return t.next.RoundTrip(req)
	}
	raw, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("read request body: %w", err)
	}
	body := withIgnoreEOS(raw)
	// A RoundTripper must not change the request it is given.
	out := req.Clone(req.Context())
	out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return t.next.RoundTrip(out)
}

// withIgnoreEOS puts "ignore_eos":true first in a JSON object that has
// other members; anything else is returned as it is.
func withIgnoreEOS(raw []byte) []byte {
	t := bytes.TrimSpace(raw)
	if len(t) < 2 || t[0] != '{' || t[len(t)-1] != '}' || len(bytes.TrimSpace(t[1:len(t)-1])) == 0 {
		return raw
	}
	out := make([]byte, 0, len(t)+len(ignoreEOSField))
	out = append(out, '{')
	out = append(out, ignoreEOSField...)
	return append(out, t[1:]...)
}

// notes prints, per picker row, the tokenizer ratio the picker learned of
// each server beside the server's own: llm-d-inference-sim adds a
// prompt's tokens to vllm:prompt_tokens_total when its answer ends, where
// infergate sim adds them at the first token, and the picker pairs them
// with the bytes it routed between two scrapes. A nil l prints nothing.
func (l *llmdSim) notes(rows []*runStats) {
	if l == nil {
		return
	}
	for _, r := range rows {
		// The oracles' picker runs no prefix producer and learns nothing.
		if !slices.ContainsFunc(r.endpoints, func(f endpointFigures) bool { return !math.IsNaN(f.bytesPerToken) }) {
			continue
		}
		fmt.Printf("- %s on %s: bytes per token per sim as the picker learned them %s, as the sims counted them %s (prompt bytes answered over `vllm:prompt_tokens_total`); %s counts a prompt's tokens when its answer ends.\n",
			r.label, llmdSimName, learnedString(r), trueString(r), llmdSimName)
	}
}

// header describes the servers for the report's preamble: which
// simulator, which build, and how h's servers map to its flags.
func (l *llmdSim) header(base simModel) string {
	m := llmdModel(server{}, base)
	return fmt.Sprintf("**model servers: %s** (`%s`, sha256 %s; the build and its commit are in the README next to it), not infergate sim. Each of h's servers runs as `%s --model %s --port P --enable-kvcache --kv-cache-size <its KV tokens / %d> --block-size %d --max-num-seqs %d --max-model-len %d --prefill-overhead %s --prefill-time-per-token <%s × pace> --inter-token-latency <%s × pace, whole ms> --force-dummy-tokenizer --zmq-endpoint= --seed %d` with POD_NAME=pod-i and POD_IP=127.0.0.1 in its environment, on 127.0.0.1 (it listens on every IPv4 interface of its port). The latency model is infergate sim's above; %s truncates each drawn latency to whole milliseconds. Every request carries `ignore_eos: true` so that answers are max_tokens long, as infergate sim's are. Its TTFT histogram holds the drawn prefill time only, not time queued.\n\n",
		llmdSimName, l.binary, l.sum[:16], llmdSimName, sim.DefaultModel, sim.DefaultBlockSize, sim.DefaultBlockSize, m.maxNumSeqs, llmdMaxModelLen,
		m.overhead, base.perToken, base.itl, l.seed, llmdSimName)
}
