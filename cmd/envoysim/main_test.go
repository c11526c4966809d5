package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/envoysim/fakeproc"
)

// syncBuffer is an io.Writer the command writes to while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// standInBootstrap is a bootstrap with one listener routing everything to
// a STATIC cluster.
const standInBootstrap = `
node: {id: standin}
static_resources:
  listeners:
  - name: main
    address:
      socket_address: {address: 0.0.0.0, port_value: %d}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: main
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: /}
                route: {cluster: up}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: up
    type: STRICT_DNS
    load_assignment:
      cluster_name: up
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: up.test, port_value: %d}
`

// TestBootstrap: --bootstrap serves the file's listener on its own
// port (--resolve applies to its STRICT_DNS cluster) until the command's
// context ends.
func TestBootstrap(t *testing.T) {
	up := fakeproc.StartUpstream(t, nil)
	_, upPort, _ := net.SplitHostPort(up.Addr)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	var upN int
	if _, err := fmt.Sscan(upPort, &upN); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, standInBootstrap, port, upN), 0o600); err != nil {
		t.Fatal(err)
	}

	root := newRootCommand()
	var out syncBuffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"--bootstrap", path, "--resolve", "up.test=127.0.0.1"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("envoysim: %v", err)
		}
	}()

	want := fmt.Sprintf("envoysim listener main (bootstrap 0.0.0.0:%d) on http://127.0.0.1:%d\n", port, port)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the output:\n%s", want, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	req, err := http.NewRequestWithContext(fakeproc.Ctx(t), http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "hello from "+up.Addr {
		t.Fatalf("%d %q, want the answer of %s", resp.StatusCode, body, up.Addr)
	}
}

// TestBootstrapErrors: --bootstrap does not mix with xDS or flag
// mode, and a bootstrap it cannot serve fails with the file named.
func TestBootstrapErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	dynamic := write("dynamic.yaml", "dynamic_resources:\n  ads_config: {api_type: GRPC}\n")
	eds := write("eds.yaml", "static_resources:\n  clusters:\n  - name: pool\n    type: EDS\n    eds_cluster_config:\n      eds_config: {ads: {}}\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"with xds-server", []string{"--bootstrap", dynamic, "--xds-server", "127.0.0.1:1"}, "--bootstrap and --xds-server are mutually exclusive"},
		{"with a flag-mode option", []string{"--bootstrap", dynamic, "--ext-proc", "e=127.0.0.1:1"}, "--ext-proc is a flag-mode option"},
		{"with node id", []string{"--bootstrap", dynamic, "--node-id", "n"}, "--node-id needs --xds-server"},
		{"with free ports", []string{"--bootstrap", dynamic, "--free-ports"}, "--free-ports needs --xds-server"},
		{"resolve alone", []string{"--resolve", "a=127.0.0.1"}, "--resolve needs --xds-server or --bootstrap"},
		{"missing file", []string{"--bootstrap", filepath.Join(dir, "none.yaml")}, "none.yaml"},
		{"dynamic_resources", []string{"--bootstrap", dynamic}, dynamic + ": envoysim node: bootstrap: dynamic_resources: use --xds-server"},
		{"EDS cluster", []string{"--bootstrap", eds}, eds + `: envoysim node: bootstrap static_resources: cluster "pool": type EDS`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := execute(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func execute(args ...string) (string, error) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}
