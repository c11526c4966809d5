package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func execute(args ...string) (string, error) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// TestStartupErrorsNameTheFlagOrFile checks that bad input fails before
// anything listens, with the culprit named.
func TestStartupErrorsNameTheFlagOrFile(t *testing.T) {
	dir := t.TempDir()
	pool := filepath.Join(dir, "pool.yaml")
	if err := os.WriteFile(pool, []byte("endpoints:\n- address: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badPool := filepath.Join(dir, "bad-pool.yaml")
	if err := os.WriteFile(badPool, []byte("endpoints:\n- address: localhost:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badConfig := filepath.Join(dir, "epp.yaml")
	if err := os.WriteFile(badConfig, []byte("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n    weight: -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badPayload := filepath.Join(dir, "payload.yaml")
	if err := os.WriteFile(badPayload, []byte("pii:\n- name: email\n  detector: email\n  action: block\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badYAML := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(badYAML, []byte("limits:\n  maxBodyBytes: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	local := []string{"--grpc-bind-address", "127.0.0.1", "--grpc-health-port", "0", "--metrics-port", "0"}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no pool", []string{"epp"}, "--pool-file (standalone) or --pool-name and --pool-namespace (Kubernetes) is required"},
		{"pool name without namespace", append([]string{"epp", "--pool-name", "p"}, local...), "--pool-name and --pool-namespace are both required"},
		{"pool file and pool name", append([]string{"epp", "--pool-file", pool, "--pool-name", "p", "--pool-namespace", "n"}, local...), "mutually exclusive"},
		{"bad kubeconfig", append([]string{"epp", "--pool-name", "p", "--pool-namespace", "n", "--kubeconfig", filepath.Join(dir, "none")}, local...), "kubernetes credentials"},
		{"unknown pool group", append([]string{"epp", "--pool-name", "p", "--pool-namespace", "n", "--pool-group", "x.io"}, local...), `--pool-group: "x.io"`},
		{"missing pool file", append([]string{"epp", "--pool-file", filepath.Join(dir, "nope.yaml")}, local...), "nope.yaml"},
		{"bad pool file", append([]string{"epp", "--pool-file", badPool}, local...), badPool + ": endpoints[0]: address \"localhost:1\": host must be an IP address"},
		{"bad config file", append([]string{"epp", "--pool-file", pool, "--config-file", badConfig}, local...), badConfig + ": schedulingProfiles[0]: plugins[0].weight: must be a positive number"},
		{"bad config text", append([]string{"epp", "--pool-file", pool, "--config-text", "kind: x"}, local...), "--config-text: apiVersion"},
		{"both configs", append([]string{"epp", "--pool-file", pool, "--config-file", badConfig, "--config-text", "x"}, local...), "mutually exclusive"},
		{"port out of range", append([]string{"epp", "--pool-file", pool, "--grpc-port", "70000"}, local...), "--grpc-port: 70000"},
		{"scrape interval under the floor", append([]string{"epp", "--pool-file", pool, "--refresh-metrics-interval", "1ms"}, local...), "data layer"},
		{"payload bad rule", append([]string{"payload", "--config-file", badPayload}, local...), badPayload + `: pii[0].action: "block" is not mask or reject`},
		{"payload broken YAML", append([]string{"payload", "--config-file", badYAML}, local...), badYAML + ": YAML"},
		{"payload missing config", append([]string{"payload", "--config-file", filepath.Join(dir, "none.yaml")}, local...), "none.yaml"},
		{"payload port out of range", append(append([]string{"payload"}, local...), "--grpc-health-port", "-2"), "--grpc-health-port: -2"},
		{"client CA without TLS", append([]string{"payload", "--secure-serving=false", "--client-ca-file", badYAML}, local...), "--client-ca-file needs --secure-serving"},
		{"payload client CA not PEM", append([]string{"payload", "--client-ca-file", badYAML}, local...), badYAML + ": no PEM certificate"},
		{"epp missing client CA", append([]string{"epp", "--pool-file", pool, "--client-ca-file", filepath.Join(dir, "ca.pem")}, local...), "ca.pem"},
		{"negative buffer budget", append([]string{"payload", "--request-buffer-budget", "-1"}, local...), `invalid argument "-1" for "--request-buffer-budget" flag: -1 is negative`},
		{"memory limit in MiB", append([]string{"payload", "--memory-limit", "512MiB"}, local...), `invalid argument "512MiB" for "--memory-limit" flag: not a byte count or a Kubernetes quantity: write 512Mi, without the B`},
		{"fractional body limit", append([]string{"epp", "--pool-file", pool, "--max-request-body-bytes", "1.5"}, local...), `invalid argument "1.5" for "--max-request-body-bytes" flag: 1.5 is not a whole number of bytes`},
		{"negative idle timeout", append([]string{"payload", "--request-idle-timeout", "-1s"}, local...), "--request-idle-timeout: -1s is negative"},
		{"unknown transport", append([]string{"payload", "--extproc-transport", "quic"}, local...), `--extproc-transport: "quic" is not auto, grpc or h2`},
		{"flow control on h2", append([]string{"epp", "--pool-file", pool, "--extproc-transport", "h2", "--config-text",
			"apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nfeatureGates: [flowControl]\nplugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"}, local...), "may hold requests (flow control)"},
		{"negative stream cap", append([]string{"epp", "--pool-file", pool, "--max-streams", "-1"}, local...), "--max-streams: -1 is negative"},
		{"sim bad seqs", []string{"sim", "--max-num-seqs", "0"}, "--max-num-seqs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := execute(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	out, err := execute("version")
	if err != nil || !strings.HasPrefix(out, "infergate ") {
		t.Fatalf("%q %v", out, err)
	}
}
