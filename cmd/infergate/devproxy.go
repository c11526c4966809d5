package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/envoysim/xdsclient"
)

// devproxyFlags are the command's flags: the shared ones, those of flag
// mode, and those of xDS mode.
type devproxyFlags struct {
	address       string
	port          int
	routeTimeout  time.Duration
	connect       time.Duration
	debugMetadata bool
	logs          logFlags

	// flag mode
	extProcs, fallback, subsetHint []string
	routing                        string

	// xDS mode
	xdsServer, nodeID, nodeCluster string
	xdsTLS                         bool
	xdsCA, xdsCert, xdsKey         string
	xdsServerName                  string
	freePorts                      bool
	resolve                        []string

	// bootstrap mode (resolve is shared with xDS mode)
	bootstrap string
}

var flagModeOnly = []string{"port", "ext-proc", "routing", "fallback-endpoints", "subset-hint"}

// xdsModeOnly are the flags only xDS mode takes (--resolve is also taken
// with --bootstrap).
var xdsModeOnly = []string{"node-id", "node-cluster", "xds-tls", "xds-ca-file", "xds-cert-file", "xds-key-file", "xds-server-name", "free-ports"}

func newDevproxyCommand() *cobra.Command {
	var fl devproxyFlags
	cmd := &cobra.Command{
		Use:   "devproxy",
		Short: "Loopback HTTP proxy that drives ext_proc servers the way Envoy does (tests and demos only)",
		Long: `devproxy stands in for Envoy where Envoy cannot run. It runs every request through
ext_proc filters with Envoy's semantics (FULL_DUPLEX_STREAMED bodies, failure_mode_allow,
served-endpoint metadata), then routes it the way gateways honour the endpoint picker's
answer. It is a test harness, not a production proxy.

Flag mode (--ext-proc ...): one listener, the filters in order, every request to one
cluster. xDS mode (--xds-server ...): an Envoy node taking listeners, routes, clusters
and endpoints over ADS from a control plane (Envoy Gateway, Istio, go-control-plane);
it NACKs, with the field named, any configuration it does not reproduce. Bootstrap
mode (--bootstrap file): the static_resources of an Envoy bootstrap, as envoy -c
serves them, without a control plane; what xDS mode would NACK fails start-up.`,
		Example: `  infergate devproxy --port 8080 \
    --ext-proc payload=127.0.0.1:9004 \
    --ext-proc epp=127.0.0.1:9002,failure-mode=FailOpen,tls=true \
    --fallback-endpoints 127.0.0.1:8000,127.0.0.1:8001

  infergate devproxy --xds-server 127.0.0.1:15010 --node-id router~10.0.0.1~gw.default~default.svc.cluster.local \
    --free-ports --resolve pool-epp.default.svc.cluster.local=127.0.0.1

  infergate devproxy --bootstrap envoy.yaml --resolve pool-epp.default.svc.cluster.local=127.0.0.1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if net.ParseIP(fl.address) == nil {
				return fmt.Errorf("--address %q: want an IP address", fl.address)
			}
			if fl.bootstrap != "" {
				if fl.xdsServer != "" {
					return errors.New("--bootstrap and --xds-server are mutually exclusive: a bootstrap is served without a control plane")
				}
				for _, name := range flagModeOnly {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("--%s is a flag-mode option; with --bootstrap the bootstrap configures listeners, filters and clusters", name)
					}
				}
				for _, name := range xdsModeOnly {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("--%s needs --xds-server (with --bootstrap, listeners bind the bootstrap's ports)", name)
					}
				}
				return fl.runBootstrap(cmd)
			}
			if fl.xdsServer != "" {
				for _, name := range flagModeOnly {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("--%s is a flag-mode option; with --xds-server the control plane configures listeners, filters and clusters", name)
					}
				}
				return fl.runXDS(cmd)
			}
			for _, name := range xdsModeOnly {
				if cmd.Flags().Changed(name) {
					return fmt.Errorf("--%s needs --xds-server", name)
				}
			}
			if cmd.Flags().Changed("resolve") {
				return errors.New("--resolve needs --xds-server or --bootstrap")
			}
			return fl.runFlags(cmd)
		},
	}
	fl.register(cmd.Flags())
	return cmd
}

func (fl *devproxyFlags) register(f *pflag.FlagSet) {
	f.StringVar(&fl.address, "address", "127.0.0.1", "IP address to listen on (in xDS mode: every listener, whatever address the control plane gives it)")
	f.DurationVar(&fl.routeTimeout, "route-timeout", 60*time.Second, "upper bound for one request, streaming included")
	f.DurationVar(&fl.connect, "connect-timeout", 5*time.Second, "upstream connect timeout (flag mode; xDS clusters carry their own)")
	f.BoolVar(&fl.debugMetadata, "debug-metadata", false, "add the filters' envoy.lb metadata to responses as header "+envoysim.DebugMetadataHeader)
	fl.logs.register(f)

	f.IntVar(&fl.port, "port", 8080, "port to listen on (0 picks a free one)")
	f.StringArrayVar(&fl.extProcs, "ext-proc", nil,
		"ext_proc filter as name=host:port[,failure-mode=FailOpen|FailClose][,tls=true|false]; repeat in filter order (default FailClose, plaintext)")
	f.StringVar(&fl.routing, "routing", string(envoysim.RoutingOverrideHost),
		"how the picked endpoint is honoured: override-host (metadata, then header, comma list walked) or original-dst-header (first header value only)")
	f.StringSliceVar(&fl.fallback, "fallback-endpoints", nil, "ip:port list used round robin when no filter picked an endpoint")
	f.StringSliceVar(&fl.subsetHint, "subset-hint", nil, "ip:port list sent to the filters as envoy.lb.subset_hint metadata")

	f.StringVar(&fl.xdsServer, "xds-server", "", "host:port of an ADS server: take the configuration over xDS as an Envoy node")
	f.StringVar(&fl.nodeID, "node-id", "", "the Envoy node id (required with --xds-server; control planes key proxies on it)")
	f.StringVar(&fl.nodeCluster, "node-cluster", "", "the Envoy node cluster")
	f.BoolVar(&fl.xdsTLS, "xds-tls", false, "connect to the xDS server with TLS")
	f.StringVar(&fl.xdsCA, "xds-ca-file", "", "PEM CA bundle that verifies the xDS server (with --xds-tls; without it the system roots)")
	f.StringVar(&fl.xdsCert, "xds-cert-file", "", "PEM client certificate for mutual TLS to the xDS server (Envoy Gateway requires one)")
	f.StringVar(&fl.xdsKey, "xds-key-file", "", "PEM key of --xds-cert-file")
	f.StringVar(&fl.xdsServerName, "xds-server-name", "", "server name to verify the xDS server's certificate against (default: the host of --xds-server)")
	f.BoolVar(&fl.freePorts, "free-ports", false, "bind each xDS listener on a free port instead of its own, and print where")
	f.StringArrayVar(&fl.resolve, "resolve", nil, "name=ip: resolve a cluster host name (e.g. the picker's Service) to ip; repeat")

	f.StringVar(&fl.bootstrap, "bootstrap", "", "Envoy bootstrap file (YAML or JSON): serve its static_resources as envoy -c does, without a control plane")
}

func (fl *devproxyFlags) runFlags(cmd *cobra.Command) error {
	if fl.port < 0 || fl.port > 65535 {
		return fmt.Errorf("--port %d: want 0-65535", fl.port)
	}
	var hint []string
	for _, s := range fl.subsetHint {
		ep, err := envoysim.ParseEndpoint(s)
		if err != nil {
			return fmt.Errorf("--subset-hint: %w", err)
		}
		hint = append(hint, ep)
	}
	var filters []extprocfilter.FilterConfig
	for _, spec := range fl.extProcs {
		fc, err := envoysim.ParseFilterFlag(spec)
		if err != nil {
			return fmt.Errorf("--ext-proc %q: %w", spec, err)
		}
		if len(hint) > 0 {
			fc.ForwardMetadata = extprocfilter.SubsetHintMetadata(hint...)
		}
		filters = append(filters, fc)
	}
	for _, s := range fl.fallback {
		if _, err := envoysim.ParseEndpoint(s); err != nil {
			return fmt.Errorf("--fallback-endpoints: %w", err)
		}
	}
	mode := envoysim.RoutingMode(fl.routing)
	if mode != envoysim.RoutingOverrideHost && mode != envoysim.RoutingOriginalDstHeader {
		return fmt.Errorf("--routing %q: want %s or %s", fl.routing, envoysim.RoutingOverrideHost, envoysim.RoutingOriginalDstHeader)
	}

	log, err := fl.logs.logger()
	if err != nil {
		return fmt.Errorf("devproxy logger: %w", err)
	}
	tuneGC(serverGCPercent)

	proxy, err := envoysim.New(envoysim.Config{
		Filters:           filters,
		Routing:           mode,
		FallbackEndpoints: fl.fallback,
		Timeouts:          envoysim.Timeouts{Route: fl.routeTimeout, Connect: fl.connect},
		DebugMetadata:     fl.debugMetadata,
		Logger:            log,
	})
	if err != nil {
		return fmt.Errorf("devproxy: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(cmd.Context(), "tcp", net.JoinHostPort(fl.address, strconv.Itoa(fl.port)))
	if err != nil {
		_ = proxy.Close()
		return fmt.Errorf("devproxy: --address/--port: %w", err)
	}
	// Print the bound address so scripts using --port 0 can find it.
	if _, err := fmt.Fprintf(cmd.OutOrStdout(), "devproxy listening on http://%s\n", ln.Addr()); err != nil {
		_ = ln.Close()
		_ = proxy.Close()
		return err
	}
	log.Info("devproxy started", "address", ln.Addr().String(), "filters", len(filters), "routing", fl.routing)
	return proxy.Serve(cmd.Context(), ln)
}

func (fl *devproxyFlags) runXDS(cmd *cobra.Command) error {
	if fl.nodeID == "" {
		return errors.New("--node-id is required with --xds-server")
	}
	tlsCfg, err := fl.xdsTLSConfig()
	if err != nil {
		return err
	}
	return fl.runNode(cmd, envoysim.NodeConfig{
		XDS: xdsclient.Config{
			Server: fl.xdsServer, NodeID: fl.nodeID, NodeCluster: fl.nodeCluster, TLS: tlsCfg,
		},
		FreePorts: fl.freePorts,
	}, "xDS", "xdsServer", fl.xdsServer, "nodeID", fl.nodeID)
}

// runBootstrap serves an Envoy bootstrap's static resources: each listener
// on --address at the bootstrap's port, until the command's context ends.
func (fl *devproxyFlags) runBootstrap(cmd *cobra.Command) error {
	bs, err := envoysim.LoadBootstrap(fl.bootstrap)
	if err != nil {
		return fmt.Errorf("--bootstrap: %w", err)
	}
	if err := fl.runNode(cmd, envoysim.NodeConfig{Bootstrap: bs}, "bootstrap", "bootstrap", fl.bootstrap); err != nil {
		return fmt.Errorf("--bootstrap %s: %w", fl.bootstrap, err)
	}
	return nil
}

// runNode runs the stand-in as a node configured by cfg (its source of
// configuration set) and the flags both modes share, until the command's
// context ends; source names the mode in its output.
func (fl *devproxyFlags) runNode(cmd *cobra.Command, cfg envoysim.NodeConfig, source string, logKV ...any) error {
	resolve, err := fl.resolveTable()
	if err != nil {
		return err
	}
	log, err := fl.logs.logger()
	if err != nil {
		return fmt.Errorf("devproxy logger: %w", err)
	}
	tuneGC(serverGCPercent)
	out := cmd.OutOrStdout()
	cfg.Address, cfg.Resolve, cfg.Logger = fl.address, resolve, log
	cfg.Timeouts = envoysim.Timeouts{Route: fl.routeTimeout, Connect: fl.connect}
	cfg.DebugMetadata = fl.debugMetadata
	cfg.OnListener = func(name, addr, bound string) {
		// One line per listener, so scripts using --free-ports can find it.
		_, _ = fmt.Fprintf(out, "devproxy listener %s (%s %s) on http://%s\n", name, source, addr, bound)
	}
	node, err := envoysim.NewNode(cfg)
	if err != nil {
		return err
	}
	log.Info("devproxy started in "+source+" mode", logKV...)
	return node.Run(cmd.Context())
}

// resolveTable parses --resolve.
func (fl *devproxyFlags) resolveTable() (map[string]string, error) {
	resolve := map[string]string{}
	for _, r := range fl.resolve {
		name, ip, ok := strings.Cut(r, "=")
		if !ok || name == "" || net.ParseIP(ip) == nil {
			return nil, fmt.Errorf("--resolve %q: want name=ip", r)
		}
		resolve[name] = ip
	}
	return resolve, nil
}

// xdsTLSConfig builds the TLS settings for the ADS channel, or nil for plaintext.
func (fl *devproxyFlags) xdsTLSConfig() (*tls.Config, error) {
	if !fl.xdsTLS {
		for name, v := range map[string]string{"xds-ca-file": fl.xdsCA, "xds-cert-file": fl.xdsCert, "xds-key-file": fl.xdsKey, "xds-server-name": fl.xdsServerName} {
			if v != "" {
				return nil, fmt.Errorf("--%s needs --xds-tls", name)
			}
		}
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: fl.xdsServerName}
	if fl.xdsCA != "" {
		pem, err := readSmallFile(fl.xdsCA)
		if err != nil {
			return nil, fmt.Errorf("--xds-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--xds-ca-file %s: no PEM certificate in it", fl.xdsCA)
		}
		cfg.RootCAs = pool
	}
	if (fl.xdsCert == "") != (fl.xdsKey == "") {
		return nil, errors.New("--xds-cert-file and --xds-key-file go together")
	}
	if fl.xdsCert != "" {
		cert, err := tls.LoadX509KeyPair(fl.xdsCert, fl.xdsKey)
		if err != nil {
			return nil, fmt.Errorf("--xds-cert-file/--xds-key-file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func readSmallFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 1<<20))
}
