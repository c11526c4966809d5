package server

import (
	"fmt"
	"runtime/debug"
	"testing"
	"time"

	"github.com/infergate/infergate/test/flagtest"
)

func TestFlagsValidate(t *testing.T) {
	flagtest.Validate(t, func() *Flags { return NewFlags(9002, 9003) }, []flagtest.Case{
		{Name: "defaults"},
		{Name: "port out of range", Args: []string{"--grpc-port", "70000"}, Want: "--grpc-port: 70000 is not a port"},
		{Name: "negative health port", Args: []string{"--grpc-health-port", "-2"}, Want: "--grpc-health-port: -2"},
		{Name: "negative body limit", Args: []string{"--max-request-body-bytes", "-1"}, Want: "--max-request-body-bytes: -1 is negative"},
		{Name: "negative budget", Args: []string{"--request-buffer-budget", "-1"}, Want: "--request-buffer-budget: -1 is negative"},
		{Name: "negative memory limit", Args: []string{"--memory-limit", "-1"}, Want: "--memory-limit: -1 is negative"},
		{Name: "negative stream cap", Args: []string{"--max-streams", "-1"}, Want: "--max-streams: -1 is negative"},
		{Name: "negative per-connection cap", Args: []string{"--max-streams-per-connection", "-1"}, Want: "--max-streams-per-connection: -1 is negative"},
		{Name: "per-connection cap past HTTP/2", Args: []string{"--max-streams-per-connection", "4294967296"}, Want: "--max-streams-per-connection: 4294967296 is over HTTP/2's 4294967295"},
		{Name: "negative idle timeout", Args: []string{"--request-idle-timeout", "-1s"}, Want: "--request-idle-timeout: -1s is negative"},
		{Name: "negative stream idle timeout", Args: []string{"--stream-idle-timeout", "-1s"}, Want: "--stream-idle-timeout: -1s is negative"},
		{Name: "negative drain", Args: []string{"--drain-timeout", "-1s"}, Want: "--drain-timeout: -1s is negative"},
		{Name: "unknown transport", Args: []string{"--extproc-transport", "quic"}, Want: `--extproc-transport: "quic" is not auto, grpc or h2`},
		{Name: "client CA without TLS", Args: []string{"--secure-serving=false", "--client-ca-file", "ca.pem"}, Want: "--client-ca-file needs --secure-serving"},
	})
}

func TestFlagsOptions(t *testing.T) {
	o := flagtest.Parse(t, NewFlags(9002, 9003), "--grpc-bind-address", "127.0.0.1", "--grpc-health-port", "0", "--metrics-port", "9191",
		"--cert-path", "/certs", "--request-buffer-budget", "1024", "--extproc-transport", "h2", "--shutdown-delay", "5s").Options()
	if o.GRPCAddr != "127.0.0.1:9002" || o.HealthAddr != "" || o.MetricsAddr != ":9191" {
		t.Errorf("addresses %q %q %q", o.GRPCAddr, o.HealthAddr, o.MetricsAddr)
	}
	if o.TLS != (TLSOptions{Enabled: true, CertFile: "/certs/tls.crt", KeyFile: "/certs/tls.key"}) {
		t.Errorf("TLS %+v", o.TLS)
	}
	want := Limits{MaxRequestBodyBytes: 16 << 20, MaxStreams: 10000, MaxStreamsPerConnection: 1000, BufferBudgetBytes: 1024,
		RequestIdleTimeout: 30 * time.Second, StreamIdleTimeout: 15 * time.Minute}
	if o.Limits != want || o.Transport != TransportH2 || o.ShutdownDelay != 5*time.Second || o.DrainTimeout != 30*time.Second {
		t.Errorf("options %+v", o)
	}
	if got := flagtest.Parse(t, NewFlags(9002, 9003)).Options().Limits.BufferBudgetBytes; got != defaultBufferBudget(cgroupMemoryLimit()) || got <= 0 {
		t.Errorf("default budget %d, want %d", got, defaultBufferBudget(cgroupMemoryLimit()))
	}
}

// TestMemoryLimitDefaults: --memory-limit sets what the budget and the
// runtime's soft limit derive from, and GOMEMLIMIT still wins for the
// latter.
func TestMemoryLimitDefaults(t *testing.T) {
	f := flagtest.Parse(t, NewFlags(9002, 9003), "--memory-limit", fmt.Sprint(512<<20))
	if got := f.Options().Limits.BufferBudgetBytes; got != 161061273 {
		t.Errorf("budget %d, want 30%% of 512 MiB", got)
	}
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	t.Setenv("GOMEMLIMIT", "")
	if got := f.LimitGoMemory(); got != 375809638 || debug.SetMemoryLimit(-1) != got {
		t.Errorf("soft limit %d (runtime %d), want 70%% of 512 MiB", got, debug.SetMemoryLimit(-1))
	}
	debug.SetMemoryLimit(prev)
	t.Setenv("GOMEMLIMIT", "100MiB")
	if got := f.LimitGoMemory(); got != 0 || debug.SetMemoryLimit(-1) != prev {
		t.Errorf("with GOMEMLIMIT set: soft limit %d, runtime's changed to %d", got, debug.SetMemoryLimit(-1))
	}
}

func TestDefaultBufferBudget(t *testing.T) {
	for _, c := range []struct{ limit, want int64 }{
		{0, 1 << 30},           // no container limit
		{512 << 20, 161061273}, // the charts' 512Mi: 30%
	} {
		if got := defaultBufferBudget(c.limit); got != c.want {
			t.Errorf("limit %d: budget %d, want %d", c.limit, got, c.want)
		}
	}
}
