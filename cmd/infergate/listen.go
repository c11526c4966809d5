package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/infergate/infergate/extproc/server"
)

// listenFlags are the listener flags every ext_proc server takes, named as
// the reference endpoint picker names them so deployments carry over.
type listenFlags struct {
	grpcPort, healthPort, metricsPort int
	grpcBind, healthBind, metricsBind string
	secure                            bool
	certPath                          string
}

func (l *listenFlags) register(fs *pflag.FlagSet, grpcPort, healthPort int) {
	fs.IntVar(&l.grpcPort, "grpc-port", grpcPort, "ext_proc gRPC port")
	fs.StringVar(&l.grpcBind, "grpc-bind-address", "", "address the ext_proc listener binds (empty: all interfaces)")
	fs.IntVar(&l.healthPort, "grpc-health-port", healthPort, "gRPC health port (services liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor); 0 disables")
	fs.StringVar(&l.healthBind, "grpc-health-bind-address", "", "address the health listener binds (empty: all interfaces)")
	fs.IntVar(&l.metricsPort, "metrics-port", 9090, "Prometheus metrics port; 0 disables")
	fs.StringVar(&l.metricsBind, "metrics-bind-address", "", "address the metrics listener binds (empty: all interfaces)")
	fs.BoolVar(&l.secure, "secure-serving", true, "serve ext_proc over TLS (a self-signed certificate unless --cert-path is set)")
	fs.StringVar(&l.certPath, "cert-path", "", "directory holding tls.crt and tls.key for secure serving")
}

// addrs validates the ports and returns the listen addresses ("" = off)
// and the TLS options.
func (l *listenFlags) addrs() (grpcAddr, healthAddr, metricsAddr string, tls server.TLSOptions, err error) {
	for _, p := range []struct {
		name string
		port int
	}{{"--grpc-port", l.grpcPort}, {"--grpc-health-port", l.healthPort}, {"--metrics-port", l.metricsPort}} {
		if p.port < 0 || p.port > 65535 {
			return "", "", "", tls, fmt.Errorf("%s: %d is not a port", p.name, p.port)
		}
	}
	grpcAddr = net.JoinHostPort(l.grpcBind, strconv.Itoa(l.grpcPort))
	if l.healthPort > 0 {
		healthAddr = net.JoinHostPort(l.healthBind, strconv.Itoa(l.healthPort))
	}
	if l.metricsPort > 0 {
		metricsAddr = net.JoinHostPort(l.metricsBind, strconv.Itoa(l.metricsPort))
	}
	tls = server.TLSOptions{Enabled: l.secure}
	if l.certPath != "" {
		tls.CertFile = filepath.Join(l.certPath, "tls.crt")
		tls.KeyFile = filepath.Join(l.certPath, "tls.key")
	}
	return grpcAddr, healthAddr, metricsAddr, tls, nil
}
