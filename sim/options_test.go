package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestOptionsTokenizer: the tokenizer flags reach the server's configuration.
func TestOptionsTokenizer(t *testing.T) {
	valid := []struct {
		args          []string
		tokenizer     string
		bytesPerToken int
	}{
		{nil, TokenizerBytes, 4},
		{[]string{"--bytes-per-token", "2"}, TokenizerBytes, 2},
		{[]string{"--bytes-per-token", "8"}, TokenizerBytes, 8},
		{[]string{"--tokenizer", "words"}, TokenizerWords, 4},
		{[]string{"--tokenizer", "words", "--bytes-per-token", "4"}, TokenizerWords, 4},
	}
	for _, v := range valid {
		var o Options
		f := pflag.NewFlagSet("sim", pflag.ContinueOnError)
		o.AddFlags(f)
		if err := f.Parse(v.args); err != nil {
			t.Fatalf("%v: %v", v.args, err)
		}
		if err := o.Validate(); err != nil {
			t.Fatalf("%v: check: %v", v.args, err)
		}
		s, err := New(o.Config(0))
		if err != nil {
			t.Fatalf("%v: New: %v", v.args, err)
		}
		if c := s.Config(); c.Tokenizer != v.tokenizer || c.BytesPerToken != v.bytesPerToken {
			t.Errorf("%v: config has tokenizer %q, %d bytes a token; want %q, %d", v.args, c.Tokenizer, c.BytesPerToken, v.tokenizer, v.bytesPerToken)
		}
	}
}

// TestOptionsEcho: --echo makes the server the conformance suite's echo
// model server, named by --name or, as echo-basic reads it, $POD_NAME.
func TestOptionsEcho(t *testing.T) {
	t.Setenv("POD_NAME", "primary-inference-model-server-7")
	t.Setenv("NAMESPACE", "inference-conformance-app-backend")
	for _, tc := range []struct {
		args     []string
		want     *Echo
		wantNone bool
	}{
		{args: nil, wantNone: true},
		{args: []string{"--echo"}, want: &Echo{Namespace: "inference-conformance-app-backend", Pod: "primary-inference-model-server-7"}},
		{args: []string{"--echo", "--name", "pod-a", "--echo-namespace", "ns"}, want: &Echo{Namespace: "ns", Pod: "pod-a"}},
	} {
		var o Options
		f := pflag.NewFlagSet("sim", pflag.ContinueOnError)
		o.AddFlags(f)
		if err := f.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		got := o.Config(0).Echo
		if tc.wantNone != (got == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("%v: echo %+v, want %+v", tc.args, got, tc.want)
		}
	}
}

// TestRunH2CPort: --h2c-port serves the first server over HTTP/2 without
// TLS (prior knowledge), as a pool with appProtocol kubernetes.io/h2c
// reaches it; the echo reports the port and the protocol.
func TestRunH2CPort(t *testing.T) {
	// Both ports chosen up front: the main server on port 0 could be
	// given the port just chosen for h2c and let go of.
	ports := freePorts(t, 2)
	httpPort, port := ports[0], ports[1]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Address: "127.0.0.1", Port: httpPort, DataParallelSize: 1, Name: "pod-a", Model: DefaultModel,
			MaxLoRAs: DefaultMaxLoRAs, MaxNumSeqs: DefaultMaxNumSeqs, MaxWaitingQueue: DefaultMaxWaitingQueue,
			TimeScale: 1, KVCacheTokens: DefaultKVCacheTokens, BlockSize: DefaultBlockSize, Tokenizer: DefaultTokenizer,
			BytesPerToken: DefaultBytesPerToken, Echo: true, H2CPort: port}, slog.New(slog.DiscardHandler))
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
