package envoygateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infergate/infergate/test/flagtest"
)

func TestFlags(t *testing.T) {
	flagtest.Validate(t, func() *Flags { return new(Flags) }, []flagtest.Case{
		{Name: "defaults"},
		{Name: "port zero", Args: []string{"--port", "0"}, Want: "--port 0: want 1-65535"},
		{Name: "cert without key", Args: []string{"--tls-cert-file", "c.pem"}, Want: "--tls-cert-file and --tls-key-file go together"},
		{Name: "client key without cert", Args: []string{"--processor-client-key-file", "k.pem"}, Want: "--processor-client-cert-file and --processor-client-key-file go together"},
		{Name: "payload without port", Args: []string{"--payload-address", "payload.default.svc"}, Want: `--payload-address "payload.default.svc"`},
		{Name: "eds without port", Args: []string{"--eds-address", "egext"}, Want: `--eds-address "egext"`},
		{Name: "leader election without a namespace", Args: []string{"--leader-elect", "--leader-election-namespace="}, Want: "--leader-elect needs --leader-election-namespace"},
		{Name: "all set", Args: []string{"--payload-address", "p:9004", "--eds-address", "e:5005", "--tls-cert-file", "c", "--tls-key-file", "k"}},
	})
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
	o, err := flagtest.Parse(t, new(Flags), "--kubeconfig", kube, "--bind-address", "127.0.0.1", "--payload-address", "p:9004", "--payload-fail-open").Options()
	if err != nil {
		t.Fatal(err)
	}
	if o.Addr != "127.0.0.1:5005" || o.Kube == nil || o.Kube.Host != "https://127.0.0.1:6443" || o.ControllerName != DefaultControllerName ||
		o.Payload == nil || *o.Payload != (Payload{Address: "p:9004", TLS: true, FailOpen: true}) {
		t.Errorf("options %+v (payload %+v)", o, o.Payload)
	}
	if _, err := flagtest.Parse(t, new(Flags), "--kubeconfig", filepath.Join(t.TempDir(), "none")).Options(); err == nil || !strings.Contains(err.Error(), "kubernetes credentials") {
		t.Errorf("a missing kubeconfig: %v", err)
	}
}
