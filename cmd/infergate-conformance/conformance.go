package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"github.com/spf13/cobra"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"

	"github.com/infergate/infergate/conformance/epp"
	"github.com/infergate/infergate/conformance/payload"
	"github.com/infergate/infergate/conformance/report"
	"github.com/infergate/infergate/wasm/wasmtest"
)

// conformanceOptions are the conformance subcommand's flags.
type conformanceOptions struct {
	profiles          []string
	eppAddress        string
	eppHealthAddress  string
	eppEndpoints      []string
	eppExtensions     bool
	eppMaxBody        int
	payloadAddress    string
	payloadModel      string
	payloadBaseModel  string
	payloadDenied     string
	payloadWasm       string
	payloadWasmConfig string
	plaintext, dryRun bool
	timeout           time.Duration
	verbose, noColor  bool
	gateway           gatewayOptions
}

func newConformanceCommand() *cobra.Command {
	var o conformanceOptions
	cmd := &cobra.Command{
		Use:   "infergate-conformance --profile gateway|epp|payload ...",
		Short: "Check a gateway, an endpoint picker or a payload processor against the InferencePool conformance suite",
		Long: `infergate-conformance runs the profiles of infergate's InferencePool conformance suite.

  gateway  a gateway in a cluster (--kubeconfig) resolving InferencePool backendRefs, following the
           picker and honouring the pool's failure mode: the upstream Gateway API Inference Extension
           suite's tests (v1.6.0) with its base resources, names and namespaces, the report in its
           format (--report-output). The suite applies its base resources (pools, test pickers, echo
           servers: --epp-image and --model-server-image, infergate's image by default) and removes
           them at the end (--cleanup-base-resources). For a vendor's gateway, in one command:

             infergate-conformance --profile gateway --gateway-class my-class \
               --report-output report.yaml --organization acme --project acme-gw \
               --url https://acme.example/gw --version v1.2.3 --contact @acme

The other profiles check components at an address, with no cluster: Envoy's ext_proc filter is
played by infergate.

  epp      any endpoint picker over ext_proc: the pick in the x-gateway-destination-endpoint header
           and the envoy.lb metadata, route cache, chunked and large bodies, body-less requests,
           anti-spoof, subset hints, 503 on an empty match, 400 on malformed JSON, 413 over its body
           limit (--epp-max-body-bytes), grpc health for the ext_proc service, liveness and readiness
           (--epp-address, --epp-endpoints: the pool it was given)
  payload  any payload processor over ext_proc: model and base-model headers, client copies replaced,
           the destination header removed, 400 on bad bodies, the guardrail answer's shape, health
           (--payload-address, --payload-model, --payload-base-model, --payload-denied-prompt); or a
           proxy-wasm plugin in infergate's host of Envoy's Wasm filter (--payload-wasm,
           --payload-wasm-config), health left out

With --report-output the results go into a report in the upstream suite's format, as the gateway
profile's do; run against the same file (and the same --organization, --project and --version), the
epp and payload profiles add theirs to a gateway run's report.

Each failure names the behaviour that is missing. The exit status is non-zero when a spec fails.
The gateway profile runs alone (it needs a cluster, the others an address).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runConformance(cmd, o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.profiles, "profile", nil, "profiles to run: gateway, or epp and payload (repeat or comma-separate)")
	f.StringVar(&o.eppAddress, "epp-address", "", "the endpoint picker's ext_proc address, host:port")
	f.StringVar(&o.eppHealthAddress, "epp-health-address", "", "where the picker serves grpc.health.v1 (default --epp-address)")
	f.StringSliceVar(&o.eppEndpoints, "epp-endpoints", nil, "the pool endpoints (ip:port) the picker was given; two with different IPs for the subset specs")
	f.BoolVar(&o.eppExtensions, "epp-extensions", false, "also run the specs of infergate's extensions (comma-string and port-less subset hints)")
	f.IntVar(&o.eppMaxBody, "epp-max-body-bytes", 0, "the picker's request body limit (infergate's --max-request-body-bytes), for the 413 spec (skipped without it)")
	f.StringVar(&o.payloadAddress, "payload-address", "", "the payload processor's ext_proc address, host:port")
	f.StringVar(&o.payloadModel, "payload-model", "", "a model the processor serves")
	f.StringVar(&o.payloadBaseModel, "payload-base-model", "", "the base model the processor maps --payload-model to (default: the model itself)")
	f.StringVar(&o.payloadDenied, "payload-denied-prompt", "", "a prompt the processor's guardrails refuse (the guardrail spec is skipped without it)")
	f.StringVar(&o.payloadWasm, "payload-wasm", "", "check this proxy-wasm plugin (.wasm) in infergate's host of Envoy's Wasm filter instead of a processor at --payload-address")
	f.StringVar(&o.payloadWasmConfig, "payload-wasm-config", "", "file holding the plugin's configuration, passed as Envoy passes a plugin's configuration")
	f.BoolVar(&o.plaintext, "plaintext", false, "dial without TLS (by default TLS, accepting any server certificate, as gateways reach processors)")
	f.DurationVar(&o.timeout, "timeout", 10*time.Second, "bound of each exchange")
	f.BoolVar(&o.dryRun, "dry-run", false, "list the specs that would run, without running them")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "report every spec, not only failures")
	f.BoolVar(&o.noColor, "no-color", false, "no colours in the report")
	o.gateway.addFlags(f)
	return cmd
}

// loadWasmPlugin loads the plugin at path, with its configuration from
// configPath (none when empty), in wasmtest's host.
func loadWasmPlugin(ctx context.Context, path, configPath string) (*wasmtest.Host, error) {
	wasm, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--payload-wasm: %w", err)
	}
	var cfg []byte
	if configPath != "" {
		if cfg, err = os.ReadFile(configPath); err != nil {
			return nil, fmt.Errorf("--payload-wasm-config: %w", err)
		}
	}
	h, err := wasmtest.Load(ctx, wasm, wasmtest.Options{PluginConfig: cfg})
	if err != nil {
		return nil, fmt.Errorf("--payload-wasm %s: %w", path, err)
	}
	return h, nil
}

// profileName is the report's name of the profile run by label.
func profileName(label string) string {
	if label == "epp" {
		return report.EPPProfile
	}
	return report.PayloadProfile
}

// testingT is what ginkgo's RunSpecs reports a failure to outside go test.
type testingT struct{ failed bool }

func (t *testingT) Fail() { t.failed = true }

func runConformance(cmd *cobra.Command, o conformanceOptions) error {
	if len(o.profiles) == 0 {
		return fmt.Errorf("--profile is required: gateway, epp or payload")
	}
	if slices.Contains(o.profiles, "gateway") {
		if len(o.profiles) > 1 {
			return fmt.Errorf("--profile gateway runs alone: it checks a cluster, epp and payload check addresses")
		}
		if o.dryRun {
			return listGatewayTests(cmd.OutOrStdout(), o.gateway)
		}
		g, err := gatewayRunOptions(o.gateway)
		if err != nil {
			return err
		}
		runGatewayProfile(g)
	}
	impl, err := o.gateway.implementation()
	if err != nil {
		return err
	}
	var labels []string
	for _, p := range o.profiles {
		switch p {
		case "epp":
			if o.eppAddress == "" || len(o.eppEndpoints) == 0 {
				return fmt.Errorf("--profile epp needs --epp-address and --epp-endpoints")
			}
			epp.Register(&epp.Config{Address: o.eppAddress, HealthAddress: o.eppHealthAddress, TLS: !o.plaintext,
				Endpoints: o.eppEndpoints, Extensions: o.eppExtensions, MaxBodyBytes: o.eppMaxBody, Timeout: o.timeout})
		case "payload":
			if (o.payloadAddress == "") == (o.payloadWasm == "") || o.payloadModel == "" {
				return fmt.Errorf("--profile payload needs --payload-model and one of --payload-address and --payload-wasm")
			}
			base := o.payloadBaseModel
			if base == "" {
				base = o.payloadModel
			}
			c := &payload.Config{Address: o.payloadAddress, TLS: !o.plaintext, Model: o.payloadModel,
				BaseModel: base, DeniedPrompt: o.payloadDenied, Timeout: o.timeout}
			if o.payloadWasm != "" {
				h, err := loadWasmPlugin(cmd.Context(), o.payloadWasm, o.payloadWasmConfig)
				if err != nil {
					return err
				}
				defer func() { _ = h.Close(context.WithoutCancel(cmd.Context())) }()
				c.Processor = payload.WasmPlugin(h)
			}
			payload.Register(c)
		default:
			return fmt.Errorf("--profile %q: want gateway, epp or payload", p)
		}
		labels = append(labels, p)
	}
	var reportErr error
	if o.gateway.reportOutput != "" && !o.dryRun {
		ginkgo.ReportAfterSuite("the report", func(r ginkgo.Report) {
			var profiles []confv1.ProfileReport
			for _, l := range labels {
				profiles = append(profiles, report.Profile(profileName(l), r, l))
			}
			reportErr = report.Write(o.gateway.reportOutput, impl, o.gateway.mode, profiles...)
		})
	}
	suite, reporter := ginkgo.GinkgoConfiguration()
	suite.LabelFilter = strings.Join(labels, " || ")
	suite.DryRun = o.dryRun
	reporter.Verbose = o.verbose || o.dryRun
	reporter.NoColor = o.noColor
	gomega.RegisterFailHandler(ginkgo.Fail)
	var t testingT
	ginkgo.RunSpecs(&t, "InferencePool conformance", suite, reporter)
	if reportErr != nil {
		return reportErr
	}
	if o.gateway.reportOutput != "" && !o.dryRun {
		fmt.Fprintf(cmd.OutOrStdout(), "conformance report written to %s\n", o.gateway.reportOutput)
	}
	if t.failed {
		return fmt.Errorf("conformance: some specs failed (above, each with the behaviour that is missing)")
	}
	return nil
}
