package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/infergate/infergate/sim"
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

	valid := []struct {
		args          []string
		tokenizer     string
		bytesPerToken int
	}{
		{nil, sim.TokenizerBytes, 4},
		{[]string{"--bytes-per-token", "2"}, sim.TokenizerBytes, 2},
		{[]string{"--bytes-per-token", "8"}, sim.TokenizerBytes, 8},
		{[]string{"--tokenizer", "words"}, sim.TokenizerWords, 4},
		{[]string{"--tokenizer", "words", "--bytes-per-token", "4"}, sim.TokenizerWords, 4},
	}
	for _, v := range valid {
		var o simOptions
		f := pflag.NewFlagSet("sim", pflag.ContinueOnError)
		o.register(f)
		if err := f.Parse(v.args); err != nil {
			t.Fatalf("%v: %v", v.args, err)
		}
		if err := o.check(); err != nil {
			t.Fatalf("%v: check: %v", v.args, err)
		}
		s, err := sim.New(o.config(0))
		if err != nil {
			t.Fatalf("%v: sim.New: %v", v.args, err)
		}
		if c := s.Config(); c.Tokenizer != v.tokenizer || c.BytesPerToken != v.bytesPerToken {
			t.Errorf("%v: config has tokenizer %q, %d bytes a token; want %q, %d", v.args, c.Tokenizer, c.BytesPerToken, v.tokenizer, v.bytesPerToken)
		}
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

// TestSimEchoFlags: --echo makes the server the conformance suite's echo
// model server, named by --name or, as echo-basic reads it, $POD_NAME.
func TestSimEchoFlags(t *testing.T) {
	t.Setenv("POD_NAME", "primary-inference-model-server-7")
	t.Setenv("NAMESPACE", "inference-conformance-app-backend")
	for _, tc := range []struct {
		args     []string
		want     *sim.Echo
		wantNone bool
	}{
		{args: nil, wantNone: true},
		{args: []string{"--echo"}, want: &sim.Echo{Namespace: "inference-conformance-app-backend", Pod: "primary-inference-model-server-7"}},
		{args: []string{"--echo", "--name", "pod-a", "--echo-namespace", "ns"}, want: &sim.Echo{Namespace: "ns", Pod: "pod-a"}},
	} {
		var o simOptions
		f := pflag.NewFlagSet("sim", pflag.ContinueOnError)
		o.register(f)
		if err := f.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		got := o.config(0).Echo
		if tc.wantNone != (got == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("%v: echo %+v, want %+v", tc.args, got, tc.want)
		}
	}
}

// TestSimH2CPort: --h2c-port serves the first server over HTTP/2 without
// TLS (prior knowledge), as a pool with appProtocol kubernetes.io/h2c
// reaches it; the echo reports the port and the protocol.
func TestSimH2CPort(t *testing.T) {
	// Both ports chosen up front: the main server on port 0 could be
	// given the port just chosen for h2c and let go of.
	ports := freePorts(t, 2)
	httpPort, port := ports[0], ports[1]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runSim(ctx, simOptions{address: "127.0.0.1", port: httpPort, dataParallelSize: 1, name: "pod-a", model: sim.DefaultModel,
			maxLoRAs: sim.DefaultMaxLoRAs, maxNumSeqs: sim.DefaultMaxNumSeqs, maxWaitingQueue: sim.DefaultMaxWaitingQueue,
			timeScale: 1, kvCacheTokens: sim.DefaultKVCacheTokens, blockSize: sim.DefaultBlockSize, tokenizer: sim.DefaultTokenizer,
			bytesPerToken: sim.DefaultBytesPerToken, echo: true, h2cPort: port})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: &http.Transport{Protocols: &protocols}, Timeout: 5 * time.Second}
	url := fmt.Sprintf("http://127.0.0.1:%d/echo", port)
	var resp *http.Response
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if resp, err = c.Get(url); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer resp.Body.Close()
	var echo struct {
		Proto    string `json:"proto"`
		HTTPPort string `json:"httpPort"`
		Pod      string `json:"pod"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&echo); err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 || echo.Proto != "HTTP/2.0" || echo.HTTPPort != strconv.Itoa(port) || echo.Pod != "pod-a" {
		t.Fatalf("h2c: %s, echo %+v", resp.Proto, echo)
	}
}

// freePorts returns n distinct ports free on 127.0.0.1 a moment ago: each
// listener stays open until all are chosen, so none is chosen twice.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}
