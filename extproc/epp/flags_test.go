package epp

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestFlags(t *testing.T) {
	const flowControl = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
	for _, tc := range []struct {
		name string
		args []string
		want string // "" for valid
	}{
		{"no pool", nil, "--pool-file (standalone) or --pool-name and --pool-namespace (Kubernetes) is required"},
		{"standalone", []string{"--pool-file", "pool.yaml"}, ""},
		{"kubernetes", []string{"--pool-name", "p", "--pool-namespace", "n", "--ha-enable-leader-election"}, ""},
		{"name without namespace", []string{"--pool-name", "p"}, "--pool-name and --pool-namespace are both required"},
		{"file and name", []string{"--pool-file", "pool.yaml", "--pool-name", "p", "--pool-namespace", "n"}, "mutually exclusive"},
		{"unknown group", []string{"--pool-name", "p", "--pool-namespace", "n", "--pool-group", "x.io"}, `--pool-group: "x.io"`},
		{"kubeconfig standalone", []string{"--pool-file", "pool.yaml", "--kubeconfig", "k"}, "--kubeconfig and --ha-enable-leader-election are for Kubernetes mode"},
		{"both configs", []string{"--pool-file", "pool.yaml", "--config-file", "c.yaml", "--config-text", "x"}, "mutually exclusive"},
		{"bad config text", []string{"--pool-file", "pool.yaml", "--config-text", "kind: x"}, "--config-text: apiVersion"},
		{"good config text", []string{"--pool-file", "pool.yaml", "--config-text", flowControl}, ""},
		{"negative staleness", []string{"--pool-file", "pool.yaml", "--metrics-staleness-threshold", "-1s"}, "--metrics-staleness-threshold: -1s is negative"},
		{"server flag", []string{"--pool-file", "pool.yaml", "--grpc-port", "70000"}, "--grpc-port: 70000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parseFlags(t, tc.args...).Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestFlagsConfig(t *testing.T) {
	c := parseFlags(t, "--pool-name", "p", "--pool-namespace", "n", "--kubeconfig", "k", "--emit-endpoint-scores").Config()
	if c.PoolFile != "" || c.Kube == nil || *c.Kube != (KubeConfig{Kubeconfig: "k", Namespace: "n", PoolName: "p"}) || !c.EmitScores ||
		c.Server.GRPCAddr != ":9002" || c.Server.HealthAddr != ":9003" {
		t.Errorf("config %+v (kube %+v)", c, c.Kube)
	}
	if c := parseFlags(t, "--pool-file", "pool.yaml").Config(); c.Kube != nil || c.PoolFile != "pool.yaml" {
		t.Errorf("standalone config %+v", c)
	}
}

func parseFlags(t *testing.T, args ...string) *Flags {
	t.Helper()
	f := NewFlags()
	fs := pflag.NewFlagSet("epp", pflag.ContinueOnError)
	f.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f
}
