package envoysim

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/envoysim/xdsclient"
)

// Options are the stand-in's command-line options: those all modes share,
// those of flag mode (one listener, filters and endpoints from flags), of
// xDS mode (an Envoy node of a control plane) and of bootstrap mode (an
// Envoy bootstrap's static resources).
type Options struct {
	Address        string
	RouteTimeout   time.Duration
	ConnectTimeout time.Duration
	DebugMetadata  bool

	// flag mode
	Port              int
	ExtProcs          []string
	Routing           string
	FallbackEndpoints []string
	SubsetHint        []string

	// xDS mode
	XDSServer, NodeID, NodeCluster     string
	XDSTLS                             bool
	XDSCAFile, XDSCertFile, XDSKeyFile string
	XDSServerName                      string
	FreePorts                          bool
	Resolve                            []string // also taken with Bootstrap

	// bootstrap mode
	Bootstrap string

	// flags are those AddFlags bound: Validate asks them which options
	// were given.
	flags *pflag.FlagSet
}

// Mode is how the stand-in takes its configuration.
type Mode int

const (
	// FlagMode: one listener, the filters in order, every request to one cluster.
	FlagMode Mode = iota
	// XDSMode: an Envoy node taking its configuration over ADS.
	XDSMode
	// BootstrapMode: an Envoy bootstrap's static_resources, as envoy -c serves them.
	BootstrapMode
)

var flagModeOnly = []string{"port", "ext-proc", "routing", "fallback-endpoints", "subset-hint"}

// xdsModeOnly are the flags only xDS mode takes (--resolve is also taken
// with --bootstrap).
var xdsModeOnly = []string{"node-id", "node-cluster", "xds-tls", "xds-ca-file", "xds-cert-file", "xds-key-file", "xds-server-name", "free-ports"}

// AddFlags binds the options to fs with their defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.flags = fs
	fs.StringVar(&o.Address, "address", "127.0.0.1", "IP address to listen on (in xDS mode: every listener, whatever address the control plane gives it)")
	fs.DurationVar(&o.RouteTimeout, "route-timeout", 60*time.Second, "upper bound for one request, streaming included")
	fs.DurationVar(&o.ConnectTimeout, "connect-timeout", 5*time.Second, "upstream connect timeout (flag mode; xDS clusters carry their own)")
	fs.BoolVar(&o.DebugMetadata, "debug-metadata", false, "add the filters' envoy.lb metadata to responses as header "+DebugMetadataHeader)

	fs.IntVar(&o.Port, "port", 8080, "port to listen on (0 picks a free one)")
	fs.StringArrayVar(&o.ExtProcs, "ext-proc", nil,
		"ext_proc filter as name=host:port[+host:port...][,failure-mode=FailOpen|FailClose][,tls=true|false][,response-body=streamed|none]; several hosts are replicas, each stream to the next healthy one; repeat in filter order (default FailClose, plaintext)")
	fs.StringVar(&o.Routing, "routing", string(RoutingOverrideHost),
		"how the picked endpoint is honoured: override-host (metadata, then header, comma list walked) or original-dst-header (first header value only)")
	fs.StringSliceVar(&o.FallbackEndpoints, "fallback-endpoints", nil, "ip:port list used round robin when no filter picked an endpoint")
	fs.StringSliceVar(&o.SubsetHint, "subset-hint", nil, "ip:port list sent to the filters as envoy.lb.subset_hint metadata")

	fs.StringVar(&o.XDSServer, "xds-server", "", "host:port of an ADS server: take the configuration over xDS as an Envoy node")
	fs.StringVar(&o.NodeID, "node-id", "", "the Envoy node id (required with --xds-server; control planes key proxies on it)")
	fs.StringVar(&o.NodeCluster, "node-cluster", "", "the Envoy node cluster")
	fs.BoolVar(&o.XDSTLS, "xds-tls", false, "connect to the xDS server with TLS")
	fs.StringVar(&o.XDSCAFile, "xds-ca-file", "", "PEM CA bundle that verifies the xDS server (with --xds-tls; without it the system roots)")
	fs.StringVar(&o.XDSCertFile, "xds-cert-file", "", "PEM client certificate for mutual TLS to the xDS server (Envoy Gateway requires one)")
	fs.StringVar(&o.XDSKeyFile, "xds-key-file", "", "PEM key of --xds-cert-file")
	fs.StringVar(&o.XDSServerName, "xds-server-name", "", "server name to verify the xDS server's certificate against (default: the host of --xds-server)")
	fs.BoolVar(&o.FreePorts, "free-ports", false, "bind each xDS listener on a free port instead of its own, and print where")
	fs.StringArrayVar(&o.Resolve, "resolve", nil, "name=ip: resolve a cluster host name (e.g. the picker's Service) to ip; repeat")

	fs.StringVar(&o.Bootstrap, "bootstrap", "", "Envoy bootstrap file (YAML or JSON): serve its static_resources as envoy -c does, without a control plane")
}

// Mode is the mode the options select.
func (o *Options) Mode() Mode {
	switch {
	case o.Bootstrap != "":
		return BootstrapMode
	case o.XDSServer != "":
		return XDSMode
	}
	return FlagMode
}

// given reports whether the flag was set on the command line.
func (o *Options) given(name string) bool { return o.flags.Changed(name) }

// Validate checks the options without touching files or the network; each
// error names the flag. It needs the options bound by AddFlags and parsed:
// an option of another mode is refused even when given its default.
func (o *Options) Validate() error {
	if o.flags == nil {
		return errors.New("envoysim options: Validate before AddFlags")
	}
	if net.ParseIP(o.Address) == nil {
		return fmt.Errorf("--address %q: want an IP address", o.Address)
	}
	switch o.Mode() {
	case BootstrapMode:
		if o.XDSServer != "" {
			return errors.New("--bootstrap and --xds-server are mutually exclusive: a bootstrap is served without a control plane")
		}
		if err := o.refuse(flagModeOnly, "--%s is a flag-mode option; with --bootstrap the bootstrap configures listeners, filters and clusters"); err != nil {
			return err
		}
		if err := o.refuse(xdsModeOnly, "--%s needs --xds-server (with --bootstrap, listeners bind the bootstrap's ports)"); err != nil {
			return err
		}
		_, err := o.resolveTable()
		return err
	case XDSMode:
		if err := o.refuse(flagModeOnly, "--%s is a flag-mode option; with --xds-server the control plane configures listeners, filters and clusters"); err != nil {
			return err
		}
		if o.NodeID == "" {
			return errors.New("--node-id is required with --xds-server")
		}
		if err := o.validateXDSTLS(); err != nil {
			return err
		}
		_, err := o.resolveTable()
		return err
	}
	if err := o.refuse(xdsModeOnly, "--%s needs --xds-server"); err != nil {
		return err
	}
	if o.given("resolve") {
		return errors.New("--resolve needs --xds-server or --bootstrap")
	}
	_, err := o.ProxyConfig()
	return err
}

// refuse fails with format (naming the flag) for the first of names given.
func (o *Options) refuse(names []string, format string) error {
	for _, name := range names {
		if o.given(name) {
			return fmt.Errorf(format, name)
		}
	}
	return nil
}

// ProxyConfig is flag mode's proxy configuration (without its logger).
func (o *Options) ProxyConfig() (Config, error) {
	if o.Port < 0 || o.Port > 65535 {
		return Config{}, fmt.Errorf("--port %d: want 0-65535", o.Port)
	}
	var hint []string
	for _, s := range o.SubsetHint {
		ep, err := ParseEndpoint(s)
		if err != nil {
			return Config{}, fmt.Errorf("--subset-hint: %w", err)
		}
		hint = append(hint, ep)
	}
	var filters []extprocfilter.FilterConfig
	hosts := map[string][]string{}
	for _, spec := range o.ExtProcs {
		fc, hs, err := ParseFilterFlag(spec)
		if err != nil {
			return Config{}, fmt.Errorf("--ext-proc %q: %w", spec, err)
		}
		if len(hs) > 1 {
			hosts[fc.Name] = hs
		}
		if len(hint) > 0 {
			fc.ForwardMetadata = extprocfilter.SubsetHintMetadata(hint...)
		}
		filters = append(filters, fc)
	}
	for _, s := range o.FallbackEndpoints {
		if _, err := ParseEndpoint(s); err != nil {
			return Config{}, fmt.Errorf("--fallback-endpoints: %w", err)
		}
	}
	mode := RoutingMode(o.Routing)
	if mode != RoutingOverrideHost && mode != RoutingOriginalDstHeader {
		return Config{}, fmt.Errorf("--routing %q: want %s or %s", o.Routing, RoutingOverrideHost, RoutingOriginalDstHeader)
	}
	return Config{
		Filters:           filters,
		FilterHosts:       hosts,
		Routing:           mode,
		FallbackEndpoints: o.FallbackEndpoints,
		Timeouts:          o.timeouts(),
		DebugMetadata:     o.DebugMetadata,
	}, nil
}

// NodeConfig is xDS or bootstrap mode's node configuration (without its
// logger and listener callback); it reads the bootstrap and the xDS TLS
// files.
func (o *Options) NodeConfig() (NodeConfig, error) {
	resolve, err := o.resolveTable()
	if err != nil {
		return NodeConfig{}, err
	}
	cfg := NodeConfig{Address: o.Address, Resolve: resolve, Timeouts: o.timeouts(), DebugMetadata: o.DebugMetadata}
	if o.Mode() == BootstrapMode {
		bs, err := LoadBootstrap(o.Bootstrap)
		if err != nil {
			return NodeConfig{}, fmt.Errorf("--bootstrap: %w", err)
		}
		cfg.Bootstrap = bs
		return cfg, nil
	}
	tlsCfg, err := o.xdsTLSConfig()
	if err != nil {
		return NodeConfig{}, err
	}
	cfg.XDS = xdsclient.Config{Server: o.XDSServer, NodeID: o.NodeID, NodeCluster: o.NodeCluster, TLS: tlsCfg}
	cfg.FreePorts = o.FreePorts
	return cfg, nil
}

func (o *Options) timeouts() Timeouts {
	return Timeouts{Route: o.RouteTimeout, Connect: o.ConnectTimeout}
}

// resolveTable parses --resolve.
func (o *Options) resolveTable() (map[string]string, error) {
	resolve := map[string]string{}
	for _, r := range o.Resolve {
		name, ip, ok := strings.Cut(r, "=")
		if !ok || name == "" || net.ParseIP(ip) == nil {
			return nil, fmt.Errorf("--resolve %q: want name=ip", r)
		}
		resolve[name] = ip
	}
	return resolve, nil
}

func (o *Options) validateXDSTLS() error {
	if !o.XDSTLS {
		for _, f := range []struct{ name, value string }{
			{"xds-ca-file", o.XDSCAFile}, {"xds-cert-file", o.XDSCertFile}, {"xds-key-file", o.XDSKeyFile}, {"xds-server-name", o.XDSServerName},
		} {
			if f.value != "" {
				return fmt.Errorf("--%s needs --xds-tls", f.name)
			}
		}
		return nil
	}
	if (o.XDSCertFile == "") != (o.XDSKeyFile == "") {
		return errors.New("--xds-cert-file and --xds-key-file go together")
	}
	return nil
}

// xdsTLSConfig builds the TLS settings for the ADS channel, or nil for plaintext.
func (o *Options) xdsTLSConfig() (*tls.Config, error) {
	if err := o.validateXDSTLS(); err != nil || !o.XDSTLS {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.XDSServerName}
	if o.XDSCAFile != "" {
		pem, err := os.ReadFile(o.XDSCAFile)
		if err != nil {
			return nil, fmt.Errorf("--xds-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--xds-ca-file %s: no PEM certificate in it", o.XDSCAFile)
		}
		cfg.RootCAs = pool
	}
	if o.XDSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.XDSCertFile, o.XDSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--xds-cert-file/--xds-key-file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
