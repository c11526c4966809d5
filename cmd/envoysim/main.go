// Command envoysim is the Envoy stand-in (package envoysim) as a process,
// for the demo, the benchmarks and the end-to-end tests on machines where
// Envoy cannot run. It is a test harness, never a product gateway, and is
// not in the image.
package main

import (
	"fmt"
	"net"
	"strconv"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/internal/cli"
)

// gcPercent is the stand-in's GC target: like the picker's (cmd/infergate
// gc.go), a small live heap and a little garbage per request.
const gcPercent = 400

func main() { cli.Main(newRootCommand()) }

func newRootCommand() *cobra.Command {
	var (
		o    envoysim.Options
		logs cli.LogFlags
	)
	cmd := &cobra.Command{
		Use:   "envoysim",
		Short: "Loopback HTTP proxy that drives ext_proc servers the way Envoy does (tests and demos only)",
		Long: `envoysim stands in for Envoy where Envoy cannot run. It runs every request through
ext_proc filters with Envoy's semantics (FULL_DUPLEX_STREAMED bodies, failure_mode_allow,
served-endpoint metadata), then routes it the way gateways honour the endpoint picker's
answer. It is a test harness, not a production proxy.

Flag mode (--ext-proc ...): one listener, the filters in order, every request to one
cluster. xDS mode (--xds-server ...): an Envoy node taking listeners, routes, clusters
and endpoints over ADS from a control plane (Envoy Gateway, Istio, go-control-plane);
it NACKs, with the field named, any configuration it does not reproduce. Bootstrap
mode (--bootstrap file): the static_resources of an Envoy bootstrap, as envoy -c
serves them, without a control plane; what xDS mode would NACK fails start-up.`,
		Example: `  envoysim --port 8080 \
    --ext-proc payload=127.0.0.1:9004 \
    --ext-proc epp=127.0.0.1:9002,failure-mode=FailOpen,tls=true \
    --fallback-endpoints 127.0.0.1:8000,127.0.0.1:8001

  envoysim --xds-server 127.0.0.1:15010 --node-id router~10.0.0.1~gw.default~default.svc.cluster.local \
    --free-ports --resolve pool-epp.default.svc.cluster.local=127.0.0.1

  envoysim --bootstrap envoy.yaml --resolve pool-epp.default.svc.cluster.local=127.0.0.1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			log, err := logs.Logger()
			if err != nil {
				return err
			}
			cli.TuneGC(gcPercent)
			if o.Mode() == envoysim.FlagMode {
				return runProxy(cmd, o, log)
			}
			return runNode(cmd, o, log)
		},
	}
	o.AddFlags(cmd.Flags())
	logs.AddFlags(cmd.Flags())
	return cmd
}

// runProxy serves flag mode's one listener until the command's context ends.
func runProxy(cmd *cobra.Command, o envoysim.Options, log logr.Logger) error {
	cfg, err := o.ProxyConfig()
	if err != nil {
		return err
	}
	cfg.Logger = log
	proxy, err := envoysim.New(cfg)
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(cmd.Context(), "tcp", net.JoinHostPort(o.Address, strconv.Itoa(o.Port)))
	if err != nil {
		_ = proxy.Close()
		return fmt.Errorf("--address/--port: %w", err)
	}
	// The bound address, so that scripts using --port 0 find it.
	if _, err := fmt.Fprintf(cmd.OutOrStdout(), "envoysim listening on http://%s\n", ln.Addr()); err != nil {
		_ = ln.Close()
		_ = proxy.Close()
		return err
	}
	log.Info("envoysim started", "address", ln.Addr().String(), "filters", len(cfg.Filters), "routing", cfg.Routing)
	return proxy.Serve(cmd.Context(), ln)
}

// runNode runs xDS or bootstrap mode's node until the command's context ends.
func runNode(cmd *cobra.Command, o envoysim.Options, log logr.Logger) error {
	cfg, err := o.NodeConfig()
	if err != nil {
		return err
	}
	source, logKV := "xDS", []any{"xdsServer", o.XDSServer, "nodeID", o.NodeID}
	if o.Mode() == envoysim.BootstrapMode {
		source, logKV = "bootstrap", []any{"bootstrap", o.Bootstrap}
	}
	out := cmd.OutOrStdout()
	cfg.Logger = log
	cfg.OnListener = func(name, addr, bound string) {
		// One line a listener, so that scripts using --free-ports find it.
		_, _ = fmt.Fprintf(out, "envoysim listener %s (%s %s) on http://%s\n", name, source, addr, bound)
	}
	node, err := envoysim.NewNode(cfg)
	if err == nil {
		log.Info("envoysim started in "+source+" mode", logKV...)
		err = node.Run(cmd.Context())
	}
	if err != nil && o.Mode() == envoysim.BootstrapMode {
		return fmt.Errorf("--bootstrap %s: %w", o.Bootstrap, err)
	}
	return err
}
