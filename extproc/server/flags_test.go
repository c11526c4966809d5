package server

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func parseFlags(t *testing.T, args ...string) *Flags {
	t.Helper()
	f := NewFlags(9002, 9003)
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	f.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFlagsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // "" for valid
	}{
		{"defaults", nil, ""},
		{"port out of range", []string{"--grpc-port", "70000"}, "--grpc-port: 70000 is not a port"},
		{"negative health port", []string{"--grpc-health-port", "-2"}, "--grpc-health-port: -2"},
		{"negative body limit", []string{"--max-request-body-bytes", "-1"}, "--max-request-body-bytes: -1 is negative"},
		{"negative budget", []string{"--request-buffer-budget", "-1"}, "--request-buffer-budget: -1 is negative"},
		{"negative stream cap", []string{"--max-streams", "-1"}, "--max-streams: -1 is negative"},
		{"negative idle timeout", []string{"--request-idle-timeout", "-1s"}, "--request-idle-timeout: -1s is negative"},
		{"negative drain", []string{"--drain-timeout", "-1s"}, "--drain-timeout: -1s is negative"},
		{"unknown transport", []string{"--extproc-transport", "quic"}, `--extproc-transport: "quic" is not auto, grpc or h2`},
		{"client CA without TLS", []string{"--secure-serving=false", "--client-ca-file", "ca.pem"}, "--client-ca-file needs --secure-serving"},
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

func TestFlagsOptions(t *testing.T) {
	o := parseFlags(t, "--grpc-bind-address", "127.0.0.1", "--grpc-health-port", "0", "--metrics-port", "9191",
		"--cert-path", "/certs", "--request-buffer-budget", "1024", "--extproc-transport", "h2", "--shutdown-delay", "5s").Options()
	if o.GRPCAddr != "127.0.0.1:9002" || o.HealthAddr != "" || o.MetricsAddr != ":9191" {
		t.Errorf("addresses %q %q %q", o.GRPCAddr, o.HealthAddr, o.MetricsAddr)
	}
	if o.TLS != (TLSOptions{Enabled: true, CertFile: "/certs/tls.crt", KeyFile: "/certs/tls.key"}) {
		t.Errorf("TLS %+v", o.TLS)
	}
	want := Limits{MaxRequestBodyBytes: 16 << 20, MaxStreams: 10000, BufferBudgetBytes: 1024, RequestIdleTimeout: 30 * time.Second}
	if o.Limits != want || o.Transport != TransportH2 || o.ShutdownDelay != 5*time.Second || o.DrainTimeout != 30*time.Second {
		t.Errorf("options %+v", o)
	}
	if got := parseFlags(t).Options().Limits.BufferBudgetBytes; got != defaultBufferBudget(cgroupMemoryLimit()) || got <= 0 {
		t.Errorf("default budget %d, want %d", got, defaultBufferBudget(cgroupMemoryLimit()))
	}
}

func TestDefaultBufferBudget(t *testing.T) {
	for _, c := range []struct{ limit, want int64 }{
		{0, 1 << 30},                   // no container limit
		{512 << 20, 512 << 20 / 5 * 2}, // the charts' 512Mi
	} {
		if got := defaultBufferBudget(c.limit); got != c.want {
			t.Errorf("limit %d: budget %d, want %d", c.limit, got, c.want)
		}
	}
}
