package server

import (
	"fmt"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/infergate/infergate/test/flagtest"
)

func TestFlagsValidate(t *testing.T) {
	flagtest.Validate(t, func() *Flags { return NewFlags(9002, 9003) }, []flagtest.Case{
		{Name: "defaults"},
		{Name: "port out of range", Args: []string{"--grpc-port", "70000"}, Want: "--grpc-port: 70000 is not a port"},
		{Name: "negative health port", Args: []string{"--grpc-health-port", "-2"}, Want: "--grpc-health-port: -2"},
		{Name: "byte flags as quantities", Args: []string{"--max-request-body-bytes", "16Mi", "--request-buffer-budget", "150Mi", "--memory-limit", "512Mi"}},
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

// TestByteFlags: --memory-limit, --request-buffer-budget and
// --max-request-body-bytes take a byte count or a Kubernetes quantity, and
// refuse anything else at parse time with the flag named and the value
// quoted.
func TestByteFlags(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  int64
		err   string // "" when the value is taken
	}{
		{"16777216", 16 << 20, ""},
		{"0", 0, ""},
		{"512Mi", 512 << 20, ""},
		{"1Gi", 1 << 30, ""},
		{"500M", 500_000_000, ""},
		{"1.5Ki", 1536, ""},
		{"1e3", 1000, ""},
		{"+5", 5, ""},
		{"4Ei", 1 << 62, ""},
		{"-1", 0, "-1 is negative"},
		{"-1Gi", 0, "-1Gi is negative"},
		{"0.5", 0, "0.5 is not a whole number of bytes"},
		{"1.5", 0, "1.5 is not a whole number of bytes"},
		{"100m", 0, "100m is not a whole number of bytes"},
		{"0.1Ki", 0, "0.1Ki is not a whole number of bytes"},
		{"5Ei", 0, "5Ei is over 4Ei"},
		{"9223372036854775808", 0, "is over 4Ei"},
		{"512MiB", 0, "write 512Mi, without the B"},
		{"500MB", 0, "write 500M, without the B"},
		{"1K", 0, "not a byte count or a Kubernetes quantity"},
		{"lots", 0, "not a byte count or a Kubernetes quantity"},
		{"", 0, "not a byte count or a Kubernetes quantity"},
		{" 1Gi", 0, "not a byte count or a Kubernetes quantity"},
	} {
		for _, name := range []string{"memory-limit", "request-buffer-budget", "max-request-body-bytes"} {
			t.Run(name+"="+tc.value, func(t *testing.T) {
				f := NewFlags(9002, 9003)
				fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
				fs.SetOutput(&strings.Builder{})
				f.AddFlags(fs)
				err := fs.Parse([]string{"--" + name + "=" + tc.value})
				if tc.err != "" {
					if err == nil || !strings.Contains(err.Error(), tc.err) ||
						!strings.Contains(err.Error(), fmt.Sprintf("%q", "--"+name)) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.value)) {
						t.Fatalf("error %v, want it to name --%s, quote %q and say %q", err, name, tc.value, tc.err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				got := map[string]int64{"memory-limit": f.MemoryLimit, "request-buffer-budget": f.BufferBudgetBytes, "max-request-body-bytes": f.MaxRequestBodyBytes}[name]
				if got != tc.want {
					t.Fatalf("%s = %d, want %d", name, got, tc.want)
				}
				if err := f.Validate(); err != nil {
					t.Fatalf("Validate: %v", err)
				}
			})
		}
	}
}

// TestByteFlagsValidate: the Flags fields stay int64, which a caller may
// set without the command line; Validate still refuses a negative one.
func TestByteFlagsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Flags)
		want string
	}{
		{"body limit", func(f *Flags) { f.MaxRequestBodyBytes = -1 }, "--max-request-body-bytes: -1 is negative"},
		{"budget", func(f *Flags) { f.BufferBudgetBytes = -1 }, "--request-buffer-budget: -1 is negative"},
		{"memory limit", func(f *Flags) { f.MemoryLimit = -1 }, "--memory-limit: -1 is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := flagtest.Parse(t, NewFlags(9002, 9003))
			tc.set(f)
			if err := f.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want it to contain %q", err, tc.want)
			}
		})
	}
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
	if got := flagtest.Parse(t, NewFlags(9002, 9003), "--memory-limit", "512Mi").Options().Limits.BufferBudgetBytes; got != 161061273 {
		t.Errorf("--memory-limit 512Mi: budget %d, want 30%% of 512 MiB", got)
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
