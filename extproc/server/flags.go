package server

import (
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Flags are Options as a processor's command line gives them (listeners,
// TLS, limits, drain, pprof), named as the reference endpoint picker names
// them so that deployments carry over. Their zero ports are the defaults
// NewFlags sets.
type Flags struct {
	GRPCPort, HealthPort, MetricsPort int
	GRPCBind, HealthBind, MetricsBind string
	Secure                            bool
	CertPath, ClientCAFile            string
	MaxRequestBodyBytes               int64
	BufferBudgetBytes                 int64
	MemoryLimit                       int64
	MaxStreams                        int
	MaxStreamsPerConnection           int
	DrainTimeout, RequestIdleTimeout  time.Duration
	StreamIdleTimeout                 time.Duration
	ShutdownDelay                     time.Duration
	Pprof                             bool
	Transport                         string
}

// NewFlags are the flags' defaults for a processor whose ext_proc and
// health listeners default to these ports.
func NewFlags(grpcPort, healthPort int) *Flags {
	return &Flags{GRPCPort: grpcPort, HealthPort: healthPort}
}

// AddFlags binds the flags to fs, with the defaults NewFlags set for the
// ports.
func (f *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&f.GRPCPort, "grpc-port", f.GRPCPort, "ext_proc gRPC port")
	fs.StringVar(&f.GRPCBind, "grpc-bind-address", "", "address the ext_proc listener binds (empty: all interfaces)")
	fs.IntVar(&f.HealthPort, "grpc-health-port", f.HealthPort, "gRPC health port (services liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor); 0 disables")
	fs.StringVar(&f.HealthBind, "grpc-health-bind-address", "", "address the health listener binds (empty: all interfaces)")
	fs.IntVar(&f.MetricsPort, "metrics-port", 9090, "Prometheus metrics port; 0 disables")
	fs.StringVar(&f.MetricsBind, "metrics-bind-address", "", "address the metrics listener binds (empty: all interfaces)")
	fs.BoolVar(&f.Secure, "secure-serving", true, "serve ext_proc over TLS (a self-signed certificate unless --cert-path is set)")
	fs.StringVar(&f.CertPath, "cert-path", "", "directory holding tls.crt and tls.key for secure serving")
	fs.StringVar(&f.ClientCAFile, "client-ca-file", "", "PEM CA bundle: when set, ext_proc clients must present a certificate it signed (mutual TLS; needs --secure-serving)")
	bytesVar(fs, &f.MaxRequestBodyBytes, "max-request-body-bytes", 16<<20, "larger request bodies are answered 413 before they are read whole, in bytes or as a quantity (16Mi); 0 = unlimited")
	bytesVar(fs, &f.BufferBudgetBytes, "request-buffer-budget", 0, "bytes all requests may hold at once, or a quantity (150Mi): request bodies as they arrive, the work of deciding them, and answers the gateway has not taken; over it a request is answered 503 processor-overloaded. 0 = 30% of --memory-limit, or 1 GiB without one")
	bytesVar(fs, &f.MemoryLimit, "memory-limit", 0, "the process's memory limit in bytes or as a Kubernetes quantity (512Mi, 1Gi), which the defaults derive from: the buffer budget (30%) and the Go runtime's soft limit (70%, unless GOMEMLIMIT is set). 0 = the container's (cgroup) limit")
	fs.IntVar(&f.MaxStreams, "max-streams", 10000, "ext_proc streams (requests in flight) open at once; one more is answered 503 processor-overloaded. 0 = unlimited")
	fs.IntVar(&f.MaxStreamsPerConnection, "max-streams-per-connection", 1000, "ext_proc streams one gateway connection may have open at once, announced as HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS (a stream beyond it is refused, and Envoy opens another connection), so that one connection cannot take all of --max-streams; 0 = unlimited")
	fs.DurationVar(&f.RequestIdleTimeout, "request-idle-timeout", 30*time.Second, "a request that sends nothing for this long before its end is answered 408 request-timeout and its body freed; 0 = none")
	fs.DurationVar(&f.StreamIdleTimeout, "stream-idle-timeout", 15*time.Minute, "once a request is decided, a stream that receives nothing for this long (the gateway waits on a model longer than any route allows, or does not take the answers) is ended with DEADLINE_EXCEEDED and what it holds freed; keep it above the gateway's route and stream idle timeouts; 0 = none")
	fs.DurationVar(&f.DrainTimeout, "drain-timeout", 30*time.Second, "on stop, how long open streams may finish")
	fs.DurationVar(&f.ShutdownDelay, "shutdown-delay", 0, "on stop, how long to go on serving new streams with the health service NOT_SERVING before draining, so gateways' health checks take this processor out first (the charts set 5s); 0 = none")
	fs.BoolVar(&f.Pprof, "enable-pprof", false, "serve Go profiles under /debug/pprof/ on the metrics listener")
	fs.StringVar(&f.Transport, "extproc-transport", TransportAuto, "what serves ext_proc: grpc (grpc-go, a goroutine per request), h2 (infergate's own HTTP/2, opt-in: each connection's requests on one goroutine, less CPU per request and a shorter tail; not yet proven against a gateway's HTTP/2 codec; refused with the picker's flow control), or auto (grpc)")
}

// Validate checks the flags without touching files or the network; each
// error names the flag.
func (f *Flags) Validate() error {
	for _, p := range []struct {
		name string
		port int
	}{{"--grpc-port", f.GRPCPort}, {"--grpc-health-port", f.HealthPort}, {"--metrics-port", f.MetricsPort}} {
		if p.port < 0 || p.port > 65535 {
			return fmt.Errorf("%s: %d is not a port", p.name, p.port)
		}
	}
	for _, n := range []struct {
		name  string
		value int64
	}{{"--max-request-body-bytes", f.MaxRequestBodyBytes}, {"--request-buffer-budget", f.BufferBudgetBytes}, {"--memory-limit", f.MemoryLimit}, {"--max-streams", int64(f.MaxStreams)},
		{"--max-streams-per-connection", int64(f.MaxStreamsPerConnection)}} {
		if n.value < 0 {
			return fmt.Errorf("%s: %d is negative", n.name, n.value)
		}
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{{"--shutdown-delay", f.ShutdownDelay}, {"--request-idle-timeout", f.RequestIdleTimeout}, {"--stream-idle-timeout", f.StreamIdleTimeout},
		{"--drain-timeout", f.DrainTimeout}} {
		if d.value < 0 {
			return fmt.Errorf("%s: %s is negative", d.name, d.value)
		}
	}
	if int64(f.MaxStreamsPerConnection) > math.MaxUint32 {
		return fmt.Errorf("--max-streams-per-connection: %d is over HTTP/2's %d", f.MaxStreamsPerConnection, uint32(math.MaxUint32))
	}
	switch f.Transport {
	case TransportAuto, TransportGRPC, TransportH2:
	default:
		return fmt.Errorf("--extproc-transport: %q is not %s, %s or %s", f.Transport, TransportAuto, TransportGRPC, TransportH2)
	}
	if f.ClientCAFile != "" && !f.Secure {
		return fmt.Errorf("--client-ca-file needs --secure-serving")
	}
	return nil
}

// Options are the server options the flags give (a port of 0 turns the
// health or metrics listener off); the buffer budget defaults from the
// container's memory limit.
func (f *Flags) Options() Options {
	o := Options{
		Transport:     f.Transport,
		GRPCAddr:      net.JoinHostPort(f.GRPCBind, strconv.Itoa(f.GRPCPort)),
		TLS:           TLSOptions{Enabled: f.Secure, ClientCAFile: f.ClientCAFile},
		DrainTimeout:  f.DrainTimeout,
		ShutdownDelay: f.ShutdownDelay,
		Pprof:         f.Pprof,
		Limits: Limits{
			MaxRequestBodyBytes:     f.MaxRequestBodyBytes,
			MaxStreams:              f.MaxStreams,
			MaxStreamsPerConnection: f.MaxStreamsPerConnection,
			RequestIdleTimeout:      f.RequestIdleTimeout,
			StreamIdleTimeout:       f.StreamIdleTimeout,
			BufferBudgetBytes:       f.BufferBudgetBytes,
		},
	}
	if f.HealthPort > 0 {
		o.HealthAddr = net.JoinHostPort(f.HealthBind, strconv.Itoa(f.HealthPort))
	}
	if f.MetricsPort > 0 {
		o.MetricsAddr = net.JoinHostPort(f.MetricsBind, strconv.Itoa(f.MetricsPort))
	}
	if f.CertPath != "" {
		o.TLS.CertFile = filepath.Join(f.CertPath, "tls.crt")
		o.TLS.KeyFile = filepath.Join(f.CertPath, "tls.key")
	}
	if o.Limits.BufferBudgetBytes == 0 {
		o.Limits.BufferBudgetBytes = defaultBufferBudget(f.memoryLimit())
	}
	return o
}

// memoryLimit is --memory-limit, or the container's.
func (f *Flags) memoryLimit() int64 {
	if f.MemoryLimit > 0 {
		return f.MemoryLimit
	}
	return cgroupMemoryLimit()
}

// The shares of the memory limit the defaults take. The collector lets
// the heap grow to about twice the live bytes (GOGC 100) before it runs,
// and a process under churn is resident some 30–40 MiB above the soft
// limit (freed pages go back to the system after a lag). A full budget
// (30%) plus the process's own tens of MiB is a live heap near 40% of the
// limit, well under the soft limit at 70%, which holds the peak under 80%
// of the limit: make bench-stalled measured 75–79% of the charts' 512 MiB
// across its shapes, where 40% and 90% peaked at 92–100%, and 30% and 75%
// at up to 83%.
const (
	budgetShare    = 0.30
	softLimitShare = 0.70
)

// defaultBufferBudget is budgetShare of the memory limit, 1 GiB when the
// process has no limit.
func defaultBufferBudget(limit int64) int64 {
	if limit <= 0 {
		return 1 << 30
	}
	return int64(float64(limit) * budgetShare)
}

// cgroupMemoryLimit is the container's memory limit in bytes (cgroup v2,
// then v1), or 0 when there is none or it cannot be read.
func cgroupMemoryLimit() int64 {
	for _, path := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		// "max" (v2) or a page-rounded MaxInt64 (v1) mean no limit.
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0
		}
		return n
	}
	return 0
}

// LimitGoMemory sets the Go runtime's soft memory limit to softLimitShare
// of the memory limit (--memory-limit or the container's), unless
// GOMEMLIMIT says otherwise: without it the collector lets the heap grow
// to several times the live bytes (the processors set GOGC to 100 or 400)
// before it runs, so a process holding its full buffer budget plus the
// garbage of growing buffers would pass the limit and be killed. It
// returns the limit set, 0 for none.
func (f *Flags) LimitGoMemory() int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	limit := f.memoryLimit()
	if limit <= 0 {
		return 0
	}
	soft := int64(float64(limit) * softLimitShare)
	debug.SetMemoryLimit(soft)
	return soft
}
