package payload

import (
	"testing"
	"time"

	"github.com/infergate/infergate/test/flagtest"
)

func TestOptions(t *testing.T) {
	flagtest.Validate(t, NewOptions, []flagtest.Case{
		{Name: "defaults"},
		{Name: "server flag", Args: []string{"--grpc-health-port", "-2"}, Want: "--grpc-health-port: -2"},
		{Name: "poll of zero", Args: []string{"--config-poll-interval", "0s"}, Want: "--config-poll-interval: 0s is not positive"},
		{Name: "kubeconfig alone", Args: []string{"--kubeconfig", "k.yaml"}, Want: "--kubeconfig is read for --configmap-namespace only"},
		{Name: "configmaps", Args: []string{"--configmap-namespace", "*", "--kubeconfig", "k.yaml"}},
	})
	c := flagtest.Parse(t, NewOptions(), "--config-file", "p.yaml", "--keep-stream-options").Config()
	if c.ConfigFile != "p.yaml" || !c.KeepStreamOptions || c.ConfigPoll != time.Second || c.Server.GRPCAddr != ":9004" || c.Server.HealthAddr != ":9005" {
		t.Errorf("config %+v", c)
	}
}
