package main

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/infergate/infergate/extproc/devproxy"
	"github.com/infergate/infergate/extproc/extproctest"
)

func newDevproxyCommand() *cobra.Command {
	var (
		address, routing       string
		port                   int
		extProcs               []string
		fallback, subsetHint   []string
		routeTimeout, connectT time.Duration
		logs                   logFlags
		debugMetadata          bool
	)
	cmd := &cobra.Command{
		Use:   "devproxy",
		Short: "Loopback HTTP proxy that drives ext_proc servers the way Envoy does (tests and demos only)",
		Long: `devproxy stands in for Envoy where Envoy cannot run. It runs every request through
the --ext-proc filters in order (the response path in reverse order), with Envoy's
ext_proc semantics (FULL_DUPLEX_STREAMED bodies, failure_mode_allow, served-endpoint
metadata), then routes it the way gateways honour the endpoint picker's answer.
It is not a production proxy.`,
		Example: `  infergate devproxy --port 8080 \
    --ext-proc payload=127.0.0.1:9004 \
    --ext-proc epp=127.0.0.1:9002,failure-mode=FailOpen,tls=true \
    --fallback-endpoints 127.0.0.1:8000,127.0.0.1:8001`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if port < 0 || port > 65535 {
				return fmt.Errorf("--port %d: want 0-65535", port)
			}
			if net.ParseIP(address) == nil {
				return fmt.Errorf("--address %q: want an IP address", address)
			}
			var hint []string
			for _, s := range subsetHint {
				ep, err := devproxy.ParseEndpoint(s)
				if err != nil {
					return fmt.Errorf("--subset-hint: %w", err)
				}
				hint = append(hint, ep)
			}
			var filters []extproctest.FilterConfig
			for _, spec := range extProcs {
				fc, err := devproxy.ParseFilterFlag(spec)
				if err != nil {
					return fmt.Errorf("--ext-proc %q: %w", spec, err)
				}
				if len(hint) > 0 {
					fc.ForwardMetadata = extproctest.SubsetHintMetadata(hint...)
				}
				filters = append(filters, fc)
			}
			for _, s := range fallback {
				if _, err := devproxy.ParseEndpoint(s); err != nil {
					return fmt.Errorf("--fallback-endpoints: %w", err)
				}
			}
			mode := devproxy.RoutingMode(routing)
			if mode != devproxy.RoutingOverrideHost && mode != devproxy.RoutingOriginalDstHeader {
				return fmt.Errorf("--routing %q: want %s or %s", routing, devproxy.RoutingOverrideHost, devproxy.RoutingOriginalDstHeader)
			}

			log, err := logs.logger()
			if err != nil {
				return fmt.Errorf("devproxy logger: %w", err)
			}
			tuneGC()

			proxy, err := devproxy.New(devproxy.Config{
				Filters:           filters,
				Routing:           mode,
				FallbackEndpoints: fallback,
				Timeouts:          devproxy.Timeouts{Route: routeTimeout, Connect: connectT},
				DebugMetadata:     debugMetadata,
				Logger:            log,
			})
			if err != nil {
				return fmt.Errorf("devproxy: %w", err)
			}
			var lc net.ListenConfig
			ln, err := lc.Listen(cmd.Context(), "tcp", net.JoinHostPort(address, strconv.Itoa(port)))
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
			log.Info("devproxy started", "address", ln.Addr().String(), "filters", len(filters), "routing", routing)
			return proxy.Serve(cmd.Context(), ln)
		},
	}
	f := cmd.Flags()
	f.StringVar(&address, "address", "127.0.0.1", "IP address to listen on")
	f.IntVar(&port, "port", 8080, "port to listen on (0 picks a free one)")
	f.StringArrayVar(&extProcs, "ext-proc", nil,
		"ext_proc filter as name=host:port[,failure-mode=FailOpen|FailClose][,tls=true|false]; repeat in filter order (default FailClose, plaintext)")
	f.StringVar(&routing, "routing", string(devproxy.RoutingOverrideHost),
		"how the picked endpoint is honoured: override-host (metadata, then header, comma list walked) or original-dst-header (first header value only)")
	f.StringSliceVar(&fallback, "fallback-endpoints", nil, "ip:port list used round robin when no filter picked an endpoint")
	f.StringSliceVar(&subsetHint, "subset-hint", nil, "ip:port list sent to the filters as envoy.lb.subset_hint metadata")
	f.DurationVar(&routeTimeout, "route-timeout", 60*time.Second, "upper bound for one request, streaming included")
	f.DurationVar(&connectT, "connect-timeout", 5*time.Second, "upstream connect timeout")
	f.BoolVar(&debugMetadata, "debug-metadata", false, "add the filters' envoy.lb metadata to responses as header "+devproxy.DebugMetadataHeader)
	logs.register(f)
	return cmd
}
