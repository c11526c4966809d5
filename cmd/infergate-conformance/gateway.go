package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/spf13/pflag"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"

	"github.com/infergate/infergate/conformance/gateway"
	"github.com/infergate/infergate/internal/kubeconfig"
)

// gatewayOptions are the gateway profile's flags, named as the upstream
// suite names them so that a vendor's command line carries over.
type gatewayOptions struct {
	kubeconfig           string
	gatewayClass         string
	runTest              string
	skipTests            []string
	reportOutput         string
	organization         string
	project              string
	url                  string
	version              string
	contact              []string
	mode                 string
	cleanupBaseResources bool
	allowCRDsMismatch    bool
	debug                bool
	eppImage             string
	modelServerImage     string
	maxWait              time.Duration
	upstreamOnly         bool
}

// defaultImage is the image the base manifests run the test picker and the
// echo server from: this release's.
func defaultImage() string { return "ghcr.io/infergate/infergate:" + version }

func (o *gatewayOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "gateway profile: kubeconfig of the cluster under test (default: $KUBECONFIG, then in-cluster)")
	f.StringVar(&o.gatewayClass, "gateway-class", "gateway-conformance", "gateway profile: the GatewayClass under test (it must be Accepted)")
	f.StringVar(&o.runTest, "run-test", "", "gateway profile: run only this test (its short name)")
	f.StringSliceVar(&o.skipTests, "skip-tests", nil, "gateway profile: tests to skip (short names, comma-separated)")
	f.StringVar(&o.reportOutput, "report-output", "", "write the report (upstream's format) to this file; the epp and payload profiles add theirs to a report already there for the same implementation")
	f.StringVar(&o.organization, "organization", "", "report: the implementation's organization")
	f.StringVar(&o.project, "project", "", "report: the implementation's project")
	f.StringVar(&o.url, "url", "", "report: the implementation's URL")
	f.StringVar(&o.version, "version", "", "report: the implementation's version")
	f.StringSliceVar(&o.contact, "contact", nil, "report: contacts (comma-separated)")
	f.StringVar(&o.mode, "mode", "default", "report: the implementation's mode")
	f.BoolVar(&o.cleanupBaseResources, "cleanup-base-resources", true, "gateway profile: delete the base resources (namespaces, pools, pickers, echo servers) at the end")
	f.BoolVar(&o.allowCRDsMismatch, "allow-crds-mismatch", false, "gateway profile: accept InferencePool CRDs of another or no bundle version (the report says UNDEFINED)")
	f.BoolVar(&o.debug, "debug", false, "gateway profile: log every request and response")
	f.StringVar(&o.eppImage, "epp-image", "", "gateway profile: image of the test endpoint picker (infergate epp --conformance-test-mode; default "+defaultImage()+")")
	f.StringVar(&o.modelServerImage, "model-server-image", "", "gateway profile: image of the echo server (infergate sim --echo; default "+defaultImage()+")")
	f.BoolVar(&o.upstreamOnly, "upstream-only", false, "gateway profile: run upstream's tests alone, without infergate's stricter ones (profile "+string(gateway.StrictProfileName)+")")
	f.DurationVar(&o.maxWait, "max-wait", 0, "gateway profile: cap every wait of the suite at this (default: upstream's, up to 300s; below that, GatewayWeightedAcrossTwoInferencePools' warm-up can fail a correct gateway)")
}

// gatewayRunOptions are the profile's options for o: the cluster's
// credentials are loaded here, so that a bad kubeconfig fails before a
// test runs.
func gatewayRunOptions(o gatewayOptions) (gateway.Options, error) {
	cfg, err := kubeconfig.Load(o.kubeconfig)
	if err != nil {
		return gateway.Options{}, fmt.Errorf("--profile gateway: %w", err)
	}
	images := gateway.Images{EPP: o.eppImage, ModelServer: o.modelServerImage}
	if images.EPP == "" {
		images.EPP = defaultImage()
	}
	if images.ModelServer == "" {
		images.ModelServer = defaultImage()
	}
	impl, err := o.implementation()
	if err != nil {
		return gateway.Options{}, err
	}
	out := gateway.Options{
		RestConfig:           cfg,
		GatewayClass:         o.gatewayClass,
		RunTest:              o.runTest,
		SkipTests:            o.skipTests,
		CleanupBaseResources: o.cleanupBaseResources,
		ReportOutput:         o.reportOutput,
		Implementation:       impl,
		Mode:                 o.mode,
		Images:               images,
		AllowCRDsMismatch:    o.allowCRDsMismatch,
		Debug:                o.debug,
		UpstreamOnly:         o.upstreamOnly,
	}
	if o.maxWait > 0 {
		t := gateway.CappedTimeouts(o.maxWait)
		out.Timeouts = &t
	}
	return out, nil
}

// implementation is what the report names, checked complete when a
// report is asked for.
func (o gatewayOptions) implementation() (confv1.Implementation, error) {
	if o.reportOutput != "" && (o.organization == "" || o.project == "" || o.url == "" || o.version == "" || len(o.contact) == 0) {
		return confv1.Implementation{}, fmt.Errorf("--report-output needs --organization, --project, --url, --version and --contact: the report names the implementation")
	}
	return confv1.Implementation{Organization: o.organization, Project: o.project, URL: o.url, Version: o.version, Contact: o.contact}, nil
}

// listGatewayTests writes the tests a run with o would run, and why the
// others would not.
func listGatewayTests(w io.Writer, o gatewayOptions) error {
	profiles := fmt.Sprintf("%s: upstream's tests at v1.6.0; %s: those and infergate's", gateway.ProfileName, gateway.StrictProfileName)
	if o.upstreamOnly {
		profiles = fmt.Sprintf("%s: upstream's tests at v1.6.0", gateway.ProfileName)
	}
	if _, err := fmt.Fprintf(w, "gateway profile (%s) against GatewayClass %q:\n", profiles, o.gatewayClass); err != nil {
		return err
	}
	for _, tc := range gateway.AllTests(gateway.Options{UpstreamOnly: o.upstreamOnly}) {
		mark := "run"
		switch {
		case o.runTest != "" && tc.ShortName != o.runTest:
			mark = "skip (not --run-test)"
		case slices.Contains(o.skipTests, tc.ShortName):
			mark = "skip (--skip-tests)"
		}
		if _, err := fmt.Fprintf(w, "  %-52s %s\n      %s\n", tc.ShortName, mark, tc.Description); err != nil {
			return err
		}
	}
	return nil
}

// runGatewayProfile runs the profile under the testing package, as the
// upstream suite needs a *testing.T, and exits with its status: 0 when
// every test passed. It does not return.
func runGatewayProfile(o gateway.Options) {
	// testing parses the process's flags: leave it only its own.
	os.Args = []string{os.Args[0], "-test.v=true", "-test.timeout=0", "-test.run=^" + regexp.QuoteMeta(gatewayTestName) + "$"}
	flag.CommandLine = flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	testing.Main(func(pat, str string) (bool, error) { return regexp.MatchString(pat, str) },
		[]testing.InternalTest{{Name: gatewayTestName, F: func(t *testing.T) { gateway.Run(t, o) }}}, nil, nil)
}

// gatewayTestName is the run's name in the output.
const gatewayTestName = "GatewayProfile"
