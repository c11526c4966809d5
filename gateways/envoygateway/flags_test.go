package envoygateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // "" for valid
	}{
		{"defaults", nil, ""},
		{"port zero", []string{"--port", "0"}, "--port 0: want 1-65535"},
		{"cert without key", []string{"--tls-cert-file", "c.pem"}, "--tls-cert-file and --tls-key-file go together"},
		{"client key without cert", []string{"--processor-client-key-file", "k.pem"}, "--processor-client-cert-file and --processor-client-key-file go together"},
		{"payload without port", []string{"--payload-address", "payload.default.svc"}, `--payload-address "payload.default.svc"`},
		{"eds without port", []string{"--eds-address", "egext"}, `--eds-address "egext"`},
		{"all set", []string{"--payload-address", "p:9004", "--eds-address", "e:5005", "--tls-cert-file", "c", "--tls-key-file", "k"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parse(t, tc.args...).Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestFlagsOptions(t *testing.T) {
	kube := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kube, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users: [{name: u, user: {token: t}}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parse(t, "--kubeconfig", kube, "--bind-address", "127.0.0.1", "--payload-address", "p:9004", "--payload-fail-open").Options()
	if err != nil {
		t.Fatal(err)
	}
	if o.Addr != "127.0.0.1:5005" || o.Kube == nil || o.Kube.Host != "https://127.0.0.1:6443" || o.ControllerName != DefaultControllerName ||
		o.Payload == nil || *o.Payload != (Payload{Address: "p:9004", TLS: true, FailOpen: true}) {
		t.Errorf("options %+v (payload %+v)", o, o.Payload)
	}
	if _, err := parse(t, "--kubeconfig", filepath.Join(t.TempDir(), "none")).Options(); err == nil || !strings.Contains(err.Error(), "kubernetes credentials") {
		t.Errorf("a missing kubeconfig: %v", err)
	}
}

func parse(t *testing.T, args ...string) *Flags {
	t.Helper()
	var f Flags
	fs := pflag.NewFlagSet("egext", pflag.ContinueOnError)
	f.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &f
}
