package envoysim

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/infergate/infergate/test/flagtest"
)

// TestOptionsValidate: bad options fail before anything listens, with the
// flag named; an option of another mode is refused even at its default.
func TestOptionsValidate(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.pem")
	flagtest.Validate(t, func() *Options { return new(Options) }, []flagtest.Case{
		{Name: "defaults"},
		{Name: "flag mode", Args: []string{"--port", "0", "--ext-proc", "epp=127.0.0.1:9002,failure-mode=FailOpen", "--fallback-endpoints", "127.0.0.1:8000"}},
		{Name: "xds mode", Args: []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--resolve", "epp=127.0.0.1"}},
		{Name: "address not an IP", Args: []string{"--address", "localhost"}, Want: `--address "localhost": want an IP address`},
		{Name: "bad filter", Args: []string{"--ext-proc", "nonsense"}, Want: "--ext-proc"},
		{Name: "bad routing", Args: []string{"--routing", "magic"}, Want: "--routing"},
		{Name: "port out of range", Args: []string{"--port", "70000"}, Want: "--port 70000"},
		{Name: "bad subset hint", Args: []string{"--subset-hint", "x"}, Want: "--subset-hint"},
		{Name: "bad fallback", Args: []string{"--fallback-endpoints", "x"}, Want: "--fallback-endpoints"},
		{Name: "xds without node id", Args: []string{"--xds-server", "127.0.0.1:1"}, Want: "--node-id is required"},
		{Name: "xds with a flag-mode filter", Args: []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--ext-proc", "e=127.0.0.1:1"}, Want: "--ext-proc is a flag-mode option"},
		{Name: "xds with the default port given", Args: []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--port", "8080"}, Want: "--port is a flag-mode option"},
		{Name: "node id without xds", Args: []string{"--node-id", "n"}, Want: "--node-id needs --xds-server"},
		{Name: "bad resolve", Args: []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--resolve", "epp"}, Want: `--resolve "epp": want name=ip`},
		{Name: "xds ca without tls", Args: []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--xds-ca-file", "ca.pem"}, Want: "--xds-ca-file needs --xds-tls"},
		{Name: "cert without key", Args: []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--xds-tls", "--xds-cert-file", "c.pem"}, Want: "--xds-cert-file and --xds-key-file go together"},
		{Name: "resolve in flag mode", Args: []string{"--resolve", "a=127.0.0.1"}, Want: "--resolve needs --xds-server or --bootstrap"},
		{Name: "bootstrap with xds", Args: []string{"--bootstrap", "b.yaml", "--xds-server", "127.0.0.1:1"}, Want: "mutually exclusive"},
		{Name: "bootstrap with a flag-mode option", Args: []string{"--bootstrap", "b.yaml", "--routing", "override-host"}, Want: "--routing is a flag-mode option"},
		// Files are read when the node is built, not by Validate.
		{Name: "xds missing ca", Args: []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--xds-tls", "--xds-ca-file", missing}},
	})
}

// TestOptionsNodeConfigReadsFiles: files named by flags are read when the
// node's configuration is built, and a missing one is named.
func TestOptionsNodeConfigReadsFiles(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.pem")
	o := flagtest.Parse(t, new(Options), "--xds-server", "127.0.0.1:1", "--node-id", "n", "--xds-tls", "--xds-ca-file", missing)
	if _, err := o.NodeConfig(); err == nil || !strings.Contains(err.Error(), "--xds-ca-file") || !strings.Contains(err.Error(), "none.pem") {
		t.Fatalf("NodeConfig: %v, want the CA file named", err)
	}
	o = flagtest.Parse(t, new(Options), "--xds-server", "127.0.0.1:1", "--node-id", "n", "--resolve", "epp=10.0.0.1", "--free-ports")
	cfg, err := o.NodeConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.XDS.Server != "127.0.0.1:1" || cfg.XDS.NodeID != "n" || cfg.Resolve["epp"] != "10.0.0.1" || !cfg.FreePorts || cfg.XDS.TLS != nil {
		t.Fatalf("NodeConfig %+v", cfg)
	}
}

func TestOptionsValidateNeedsFlags(t *testing.T) {
	var o Options
	if err := o.Validate(); err == nil {
		t.Fatal("Validate on options never bound to flags passed")
	}
}
