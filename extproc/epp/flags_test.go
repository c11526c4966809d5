package epp

import (
	"testing"

	"github.com/infergate/infergate/test/flagtest"
)

func TestFlags(t *testing.T) {
	const flowControl = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
	flagtest.Validate(t, NewFlags, []flagtest.Case{
		{Name: "no pool", Want: "--pool-file (standalone) or --pool-name and --pool-namespace (Kubernetes) is required"},
		{Name: "standalone", Args: []string{"--pool-file", "pool.yaml"}},
		{Name: "kubernetes", Args: []string{"--pool-name", "p", "--pool-namespace", "n", "--ha-enable-leader-election"}},
		{Name: "name without namespace", Args: []string{"--pool-name", "p"}, Want: "--pool-name and --pool-namespace are both required"},
		{Name: "file and name", Args: []string{"--pool-file", "pool.yaml", "--pool-name", "p", "--pool-namespace", "n"}, Want: "mutually exclusive"},
		{Name: "unknown group", Args: []string{"--pool-name", "p", "--pool-namespace", "n", "--pool-group", "x.io"}, Want: `--pool-group: "x.io"`},
		{Name: "kubeconfig standalone", Args: []string{"--pool-file", "pool.yaml", "--kubeconfig", "k"}, Want: "--kubeconfig and --ha-enable-leader-election are for Kubernetes mode"},
		{Name: "both configs", Args: []string{"--pool-file", "pool.yaml", "--config-file", "c.yaml", "--config-text", "x"}, Want: "mutually exclusive"},
		{Name: "bad config text", Args: []string{"--pool-file", "pool.yaml", "--config-text", "kind: x"}, Want: "--config-text: apiVersion"},
		{Name: "good config text", Args: []string{"--pool-file", "pool.yaml", "--config-text", flowControl}},
		{Name: "negative staleness", Args: []string{"--pool-file", "pool.yaml", "--metrics-staleness-threshold", "-1s"}, Want: "--metrics-staleness-threshold: -1s is negative"},
		{Name: "server flag", Args: []string{"--pool-file", "pool.yaml", "--grpc-port", "70000"}, Want: "--grpc-port: 70000"},
	})
}

func TestFlagsConfig(t *testing.T) {
	c := flagtest.Parse(t, NewFlags(), "--pool-name", "p", "--pool-namespace", "n", "--kubeconfig", "k", "--emit-endpoint-scores").Config()
	if c.PoolFile != "" || c.Kube == nil || *c.Kube != (KubeConfig{Kubeconfig: "k", Namespace: "n", PoolName: "p"}) || !c.EmitScores ||
		c.Server.GRPCAddr != ":9002" || c.Server.HealthAddr != ":9003" {
		t.Errorf("config %+v (kube %+v)", c, c.Kube)
	}
	if c := flagtest.Parse(t, NewFlags(), "--pool-file", "pool.yaml").Config(); c.Kube != nil || c.PoolFile != "pool.yaml" {
		t.Errorf("standalone config %+v", c)
	}
}
