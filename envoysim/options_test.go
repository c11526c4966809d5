package envoysim

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func parseOptions(t *testing.T, args ...string) *Options {
	t.Helper()
	var o Options
	fs := pflag.NewFlagSet("envoysim", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &o
}

// TestOptionsValidate: bad options fail before anything listens, with the
// flag named; an option of another mode is refused even at its default.
func TestOptionsValidate(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.pem")
	for _, tc := range []struct {
		name string
		args []string
		want string // "" for valid
	}{
		{"defaults", nil, ""},
		{"flag mode", []string{"--port", "0", "--ext-proc", "epp=127.0.0.1:9002,failure-mode=FailOpen", "--fallback-endpoints", "127.0.0.1:8000"}, ""},
		{"xds mode", []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--resolve", "epp=127.0.0.1"}, ""},
		{"address not an IP", []string{"--address", "localhost"}, `--address "localhost": want an IP address`},
		{"bad filter", []string{"--ext-proc", "nonsense"}, "--ext-proc"},
		{"bad routing", []string{"--routing", "magic"}, "--routing"},
		{"port out of range", []string{"--port", "70000"}, "--port 70000"},
		{"bad subset hint", []string{"--subset-hint", "x"}, "--subset-hint"},
		{"bad fallback", []string{"--fallback-endpoints", "x"}, "--fallback-endpoints"},
		{"xds without node id", []string{"--xds-server", "127.0.0.1:1"}, "--node-id is required"},
		{"xds with a flag-mode filter", []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--ext-proc", "e=127.0.0.1:1"}, "--ext-proc is a flag-mode option"},
		{"xds with the default port given", []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--port", "8080"}, "--port is a flag-mode option"},
		{"node id without xds", []string{"--node-id", "n"}, "--node-id needs --xds-server"},
		{"bad resolve", []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--resolve", "epp"}, `--resolve "epp": want name=ip`},
		{"xds ca without tls", []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--xds-ca-file", "ca.pem"}, "--xds-ca-file needs --xds-tls"},
		{"cert without key", []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--xds-tls", "--xds-cert-file", "c.pem"}, "--xds-cert-file and --xds-key-file go together"},
		{"resolve in flag mode", []string{"--resolve", "a=127.0.0.1"}, "--resolve needs --xds-server or --bootstrap"},
		{"bootstrap with xds", []string{"--bootstrap", "b.yaml", "--xds-server", "127.0.0.1:1"}, "mutually exclusive"},
		{"bootstrap with a flag-mode option", []string{"--bootstrap", "b.yaml", "--routing", "override-host"}, "--routing is a flag-mode option"},
		// Files are read when the node is built, not by Validate.
		{"xds missing ca", []string{"--xds-server", "127.0.0.1:1", "--node-id", "n", "--xds-tls", "--xds-ca-file", missing}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parseOptions(t, tc.args...).Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestOptionsNodeConfigReadsFiles: files named by flags are read when the
// node's configuration is built, and a missing one is named.
func TestOptionsNodeConfigReadsFiles(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.pem")
	o := parseOptions(t, "--xds-server", "127.0.0.1:1", "--node-id", "n", "--xds-tls", "--xds-ca-file", missing)
	if _, err := o.NodeConfig(); err == nil || !strings.Contains(err.Error(), "--xds-ca-file") || !strings.Contains(err.Error(), "none.pem") {
		t.Fatalf("NodeConfig: %v, want the CA file named", err)
	}
	o = parseOptions(t, "--xds-server", "127.0.0.1:1", "--node-id", "n", "--resolve", "epp=10.0.0.1", "--free-ports")
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
