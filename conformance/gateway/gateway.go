// Package gateway is the gateway profile of infergate's conformance suite:
// does a gateway resolve InferencePool backendRefs, follow the picker and
// honour the pool's failure mode? It runs the upstream Gateway API
// Inference Extension suite's tests from its own module
// (sigs.k8s.io/gateway-api-inference-extension/conformance, v1.6.0) with
// the same base resources, names and namespaces, and writes the report in
// upstream's format (ConformanceReport plus
// GatewayAPIInferenceExtensionVersion), so results compare with published
// ones. Unless Options.UpstreamOnly, infergate's stricter tests run after
// upstream's and the report carries a second profile, Gateway-infergate,
// holding both (strict.go); upstream's profile stays as upstream defines it.
//
// The base manifests run infergate's test picker and echo server in place
// of upstream's (Images): same contract (test-epp-endpoint-selection,
// X-Echo-Set-Header, x-conformance-test-served-endpoint), pinned to a
// release rather than lwepp:main.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientset "k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gie "sigs.k8s.io/gateway-api-inference-extension/conformance"
	gietests "sigs.k8s.io/gateway-api-inference-extension/conformance/tests"
	gieconfig "sigs.k8s.io/gateway-api-inference-extension/conformance/utils/config"
	"sigs.k8s.io/gateway-api-inference-extension/version"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
	gwconfig "sigs.k8s.io/gateway-api/conformance/utils/config"
	confsuite "sigs.k8s.io/gateway-api/conformance/utils/suite"
)

// Options configure a run.
type Options struct {
	RestConfig *rest.Config
	// GatewayClass is the class under test; it must be Accepted.
	GatewayClass string
	// RunTest runs only that test (its ShortName); SkipTests skips these.
	RunTest   string
	SkipTests []string
	// CleanupBaseResources deletes the base resources at the end (the
	// tests' own resources are always deleted).
	CleanupBaseResources bool
	// ReportOutput, when set, is where the report is written.
	ReportOutput   string
	Implementation confv1.Implementation
	// Mode is the report's mode (default "default").
	Mode string
	// Images run in the base manifests.
	Images Images
	// Timeouts overrides upstream's defaults (300 s for most waits) when
	// non-nil.
	Timeouts *gwconfig.TimeoutConfig
	// AllowCRDsMismatch accepts mixed or unannotated InferencePool CRD
	// versions (the report says UNDEFINED).
	AllowCRDsMismatch bool
	Debug             bool
	// UpstreamOnly runs upstream's profile alone, without infergate's
	// stricter one (StrictProfile).
	UpstreamOnly bool
}

// ProfileName is upstream's profile: infergate runs the same tests under it.
const ProfileName = gie.GatewayLayerProfileName

// DefaultTimeouts are upstream's, for a real cluster.
func DefaultTimeouts() gwconfig.TimeoutConfig {
	return gieconfig.DefaultInferenceExtensionTimeoutConfig().TimeoutConfig
}

// CappedTimeouts are upstream's timeouts with none longer than limit (the
// poll interval and the fixed waits under it stay): for a control plane
// that converges in seconds, so that a gateway that never converges fails
// a run in minutes rather than hours.
func CappedTimeouts(limit time.Duration) gwconfig.TimeoutConfig {
	cfg := DefaultTimeouts()
	v := reflect.ValueOf(&cfg).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.Type() == reflect.TypeFor[time.Duration]() && time.Duration(f.Int()) > limit {
			f.SetInt(int64(limit))
		}
	}
	return cfg
}

// Tests are the tests of upstream's profile, in the order they run.
func Tests() []confsuite.ConformanceTest {
	return slices.Clone(gietests.ConformanceTests)
}

// AllTests are the tests a run with o runs: upstream's, then infergate's
// unless o.UpstreamOnly.
func AllTests(o Options) []confsuite.ConformanceTest {
	if o.UpstreamOnly {
		return Tests()
	}
	return append(Tests(), StrictTests()...)
}

// Run runs the profile's tests as subtests of t and writes the report.
func Run(t *testing.T, o Options) {
	t.Helper()
	opts, err := suiteOptions(o)
	require.NoError(t, err, "conformance options")
	confsuite.RegisterConformanceProfile(gie.GatewayLayerProfile)
	confsuite.RegisterConformanceProfile(StrictProfile)
	suite, err := confsuite.NewConformanceTestSuite(opts)
	require.NoError(t, err, "conformance suite")
	extVersion, err := inferenceCRDVersion(context.Background(), opts.Client)
	if err != nil {
		if !o.AllowCRDsMismatch {
			require.NoError(t, err, "InferencePool CRD version")
		}
		extVersion = "UNDEFINED"
	}
	tests := AllTests(o)
	gie.SetupConformanceTestSuite(context.Background(), t, suite, opts, tests)
	runErr := suite.Run(t, tests)
	if o.ReportOutput != "" {
		report, err := suite.Report()
		require.NoError(t, err, "conformance report")
		r := gie.GatewayAPIInferenceExtensionConformanceReport{GatewayAPIInferenceExtensionVersion: extVersion, ConformanceReport: *report}
		require.NoError(t, r.WriteReport(t.Logf, o.ReportOutput), "writing the report")
	}
	require.NoError(t, runErr, "running the tests")
}

// suiteOptions are the upstream suite's options for o.
func suiteOptions(o Options) (confsuite.ConformanceOptions, error) {
	if o.RestConfig == nil {
		return confsuite.ConformanceOptions{}, errors.New("no cluster: RestConfig is nil")
	}
	if o.GatewayClass == "" {
		return confsuite.ConformanceOptions{}, errors.New("no GatewayClass to test")
	}
	if o.Images.EPP == "" || o.Images.ModelServer == "" {
		return confsuite.ConformanceOptions{}, errors.New("the images of the test picker and the echo server are not set")
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, gatewayv1.Install, apiextensionsv1.AddToScheme, inferencev1.Install} {
		if err := add(scheme); err != nil {
			return confsuite.ConformanceOptions{}, err
		}
	}
	clientOpts := client.Options{Scheme: scheme}
	c, err := client.New(o.RestConfig, clientOpts)
	if err != nil {
		return confsuite.ConformanceOptions{}, fmt.Errorf("kubernetes client: %w", err)
	}
	cs, err := clientset.NewForConfig(o.RestConfig)
	if err != nil {
		return confsuite.ConformanceOptions{}, fmt.Errorf("kubernetes clientset: %w", err)
	}
	fsys, err := manifests(&gie.Manifests, o.Images)
	if err != nil {
		return confsuite.ConformanceOptions{}, err
	}
	timeouts := DefaultTimeouts()
	if o.Timeouts != nil {
		timeouts = *o.Timeouts
	}
	mode := o.Mode
	if mode == "" {
		mode = "default"
	}
	profiles := []confsuite.ConformanceProfileName{ProfileName}
	supported := gie.GatewayLayerProfile.CoreFeatures.UnsortedList()
	if !o.UpstreamOnly {
		profiles = append(profiles, StrictProfileName)
		supported = append(supported, StrictFeature)
	}
	return confsuite.ConformanceOptions{
		ConfigurableOptions: confsuite.ConfigurableOptions{
			GatewayClassName:     o.GatewayClass,
			Debug:                o.Debug,
			CleanupBaseResources: o.CleanupBaseResources,
			CleanupTestResources: true,
			SupportedFeatures:    supported,
			TimeoutConfig:        timeouts,
			SkipTests:            o.SkipTests,
			RunTest:              o.RunTest,
			Mode:                 mode,
			AllowCRDsMismatch:    o.AllowCRDsMismatch,
			Implementation:       o.Implementation,
			ConformanceProfiles:  profiles,
		},
		Client:        c,
		ClientOptions: clientOpts,
		Clientset:     cs,
		RestConfig:    o.RestConfig,
		BaseManifests: baseManifests,
		ManifestFS:    []fs.FS{fsys},
	}, nil
}

// inferenceCRDVersion is the bundle version the installed InferencePool
// CRDs carry, as upstream reads it.
func inferenceCRDVersion(ctx context.Context, c client.Client) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var crds apiextensionsv1.CustomResourceDefinitionList
	if err := c.List(ctx, &crds); err != nil {
		return "", fmt.Errorf("listing CRDs: %w", err)
	}
	found := ""
	for _, crd := range crds.Items {
		v, ok := crd.Annotations[version.BundleVersionAnnotation]
		if !ok {
			continue
		}
		if found != "" && v != found {
			return "", fmt.Errorf("InferencePool CRDs of versions %s and %s are installed", found, v)
		}
		found = v
	}
	if found == "" {
		return "", errors.New("no InferencePool CRD carries the " + version.BundleVersionAnnotation + " annotation")
	}
	return found, nil
}
