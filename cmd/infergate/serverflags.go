package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
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
	maxBody                           int64
	drain                             time.Duration
	pprof                             bool
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
	fs.DurationVar(&l.drain, "drain-timeout", 30*time.Second, "on stop, how long open streams may finish")
	fs.BoolVar(&l.pprof, "enable-pprof", false, "serve Go profiles under /debug/pprof/ on the metrics listener")
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
	o.DrainTimeout, o.Pprof = l.drain, l.pprof
	return o, nil
}
