package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/infergate/infergate/extproc/server"
)

// serverFlags are the flags every ext_proc server takes (listeners, TLS,
// body limit, drain, pprof), named as the reference endpoint picker names
// them so deployments carry over.
type serverFlags struct {
	grpcPort, healthPort, metricsPort int
	grpcBind, healthBind, metricsBind string
	secure                            bool
	certPath, clientCA                string
	maxBody, bufferBudget             int64
	maxStreams                        int
	drain, requestIdle, shutdownDelay time.Duration
	pprof                             bool
	transport                         string
}

func (l *serverFlags) register(fs *pflag.FlagSet, grpcPort, healthPort int) {
	fs.IntVar(&l.grpcPort, "grpc-port", grpcPort, "ext_proc gRPC port")
	fs.StringVar(&l.grpcBind, "grpc-bind-address", "", "address the ext_proc listener binds (empty: all interfaces)")
	fs.IntVar(&l.healthPort, "grpc-health-port", healthPort, "gRPC health port (services liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor); 0 disables")
	fs.StringVar(&l.healthBind, "grpc-health-bind-address", "", "address the health listener binds (empty: all interfaces)")
	fs.IntVar(&l.metricsPort, "metrics-port", 9090, "Prometheus metrics port; 0 disables")
	fs.StringVar(&l.metricsBind, "metrics-bind-address", "", "address the metrics listener binds (empty: all interfaces)")
	fs.BoolVar(&l.secure, "secure-serving", true, "serve ext_proc over TLS (a self-signed certificate unless --cert-path is set)")
	fs.StringVar(&l.certPath, "cert-path", "", "directory holding tls.crt and tls.key for secure serving")
	fs.StringVar(&l.clientCA, "client-ca-file", "", "PEM CA bundle: when set, ext_proc clients must present a certificate it signed (mutual TLS; needs --secure-serving)")
	fs.Int64Var(&l.maxBody, "max-request-body-bytes", 16<<20, "larger request bodies are answered 413 before they are read whole; 0 = unlimited")
	fs.Int64Var(&l.bufferBudget, "request-buffer-budget", 0, "request-body bytes all requests may hold at once while their bodies arrive; over it a request is answered 503 processor-overloaded. 0 = 40% of the container's memory limit (cgroup), or 1 GiB without one")
	fs.IntVar(&l.maxStreams, "max-streams", 10000, "ext_proc streams (requests in flight) open at once; one more is answered 503 processor-overloaded. 0 = unlimited")
	fs.DurationVar(&l.requestIdle, "request-idle-timeout", 30*time.Second, "a request that sends nothing for this long before its end is answered 408 request-timeout and its body freed (the response path is not timed); 0 = none")
	fs.DurationVar(&l.drain, "drain-timeout", 30*time.Second, "on stop, how long open streams may finish")
	fs.DurationVar(&l.shutdownDelay, "shutdown-delay", 0, "on stop, how long to go on serving new streams with the health service NOT_SERVING before draining, so gateways' health checks take this processor out first (the charts set 5s); 0 = none")
	fs.BoolVar(&l.pprof, "enable-pprof", false, "serve Go profiles under /debug/pprof/ on the metrics listener")
	fs.StringVar(&l.transport, "extproc-transport", server.TransportAuto, "what serves ext_proc: grpc (grpc-go, a goroutine per request), h2 (infergate's own HTTP/2, opt-in: each connection's requests on one goroutine, less CPU per request and a shorter tail; not yet proven against a gateway's HTTP/2 codec; refused with the picker's flow control), or auto (grpc)")
}

// options validates the flags and returns the server options (an empty
// address turns that listener off).
func (l *serverFlags) options() (server.Options, error) {
	var o server.Options
	for _, p := range []struct {
		name string
		port int
	}{{"--grpc-port", l.grpcPort}, {"--grpc-health-port", l.healthPort}, {"--metrics-port", l.metricsPort}} {
		if p.port < 0 || p.port > 65535 {
			return o, fmt.Errorf("%s: %d is not a port", p.name, p.port)
		}
	}
	if l.maxBody < 0 {
		return o, fmt.Errorf("--max-request-body-bytes: %d is negative", l.maxBody)
	}
	if l.bufferBudget < 0 {
		return o, fmt.Errorf("--request-buffer-budget: %d is negative", l.bufferBudget)
	}
	if l.shutdownDelay < 0 {
		return o, fmt.Errorf("--shutdown-delay: %s is negative", l.shutdownDelay)
	}
	if l.requestIdle < 0 {
		return o, fmt.Errorf("--request-idle-timeout: %s is negative", l.requestIdle)
	}
	if l.maxStreams < 0 {
		return o, fmt.Errorf("--max-streams: %d is negative", l.maxStreams)
	}
	switch l.transport {
	case server.TransportAuto, server.TransportGRPC, server.TransportH2:
	default:
		return o, fmt.Errorf("--extproc-transport: %q is not %s, %s or %s", l.transport, server.TransportAuto, server.TransportGRPC, server.TransportH2)
	}
	o.Transport = l.transport
	o.GRPCAddr = net.JoinHostPort(l.grpcBind, strconv.Itoa(l.grpcPort))
	if l.healthPort > 0 {
		o.HealthAddr = net.JoinHostPort(l.healthBind, strconv.Itoa(l.healthPort))
	}
	if l.metricsPort > 0 {
		o.MetricsAddr = net.JoinHostPort(l.metricsBind, strconv.Itoa(l.metricsPort))
	}
	if l.clientCA != "" && !l.secure {
		return o, fmt.Errorf("--client-ca-file needs --secure-serving")
	}
	o.TLS = server.TLSOptions{Enabled: l.secure, ClientCAFile: l.clientCA}
	if l.certPath != "" {
		o.TLS.CertFile = filepath.Join(l.certPath, "tls.crt")
		o.TLS.KeyFile = filepath.Join(l.certPath, "tls.key")
	}
	o.Limits.MaxRequestBodyBytes = l.maxBody
	o.Limits.MaxStreams = l.maxStreams
	o.Limits.RequestIdleTimeout = l.requestIdle
	o.Limits.BufferBudgetBytes = l.bufferBudget
	if o.Limits.BufferBudgetBytes == 0 {
		o.Limits.BufferBudgetBytes = defaultBufferBudget(cgroupMemoryLimit())
	}
	o.DrainTimeout, o.ShutdownDelay, o.Pprof = l.drain, l.shutdownDelay, l.pprof
	return o, nil
}

// defaultBufferBudget is 40% of the memory limit, leaving the rest for
// the process itself, the copies a decision makes (a masked body is a
// second copy) and the garbage of grown buffers the collector has not yet
// reclaimed (measured by make bench-stalled: a full budget peaks near 450
// MiB of a 512 MiB limit); 1 GiB when the process has no limit.
func defaultBufferBudget(limit int64) int64 {
	if limit <= 0 {
		return 1 << 30
	}
	return limit / 5 * 2
}

// cgroupMemoryLimit is the container's memory limit in bytes (cgroup v2,
// then v1), or 0 when there is none or it cannot be read.
func cgroupMemoryLimit() int64 {
	for _, path := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		n, err := strconv.ParseInt(v, 10, 64)
		// "max" (v2) or a page-rounded MaxInt64 (v1) mean no limit.
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0
		}
		return n
	}
	return 0
}

// limitGoMemory sets the Go runtime's soft memory limit to 90% of the
// container's, unless GOMEMLIMIT says otherwise: without it the collector
// lets the heap grow to several times the live bytes (GOGC is 400 for the
// picker, 100 for the payload processor,
// see tuneGC) before it runs, so a process holding its full
// buffer budget (half the limit) plus the garbage of growing buffers would
// pass the limit and be killed. It returns the limit set, 0 for none.
func limitGoMemory() int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	limit := cgroupMemoryLimit()
	if limit <= 0 {
		return 0
	}
	soft := limit / 10 * 9
	debug.SetMemoryLimit(soft)
	return soft
}
