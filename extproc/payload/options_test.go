package payload

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // "" for valid
	}{
		{"defaults", nil, ""},
		{"server flag", []string{"--grpc-health-port", "-2"}, "--grpc-health-port: -2"},
		{"poll of zero", []string{"--config-poll-interval", "0s"}, "--config-poll-interval: 0s is not positive"},
		{"kubeconfig alone", []string{"--kubeconfig", "k.yaml"}, "--kubeconfig is read for --configmap-namespace only"},
		{"configmaps", []string{"--configmap-namespace", "*", "--kubeconfig", "k.yaml"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			fs := pflag.NewFlagSet("payload", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want it to contain %q", err, tc.want)
			}
		})
	}
	o := NewOptions()
	fs := pflag.NewFlagSet("payload", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--config-file", "p.yaml", "--keep-stream-options"}); err != nil {
		t.Fatal(err)
	}
	c := o.Config()
	if c.ConfigFile != "p.yaml" || !c.KeepStreamOptions || c.ConfigPoll != time.Second || c.Server.GRPCAddr != ":9004" || c.Server.HealthAddr != ":9005" {
		t.Errorf("config %+v", c)
	}
}
