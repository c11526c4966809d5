package report

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/onsi/ginkgo/v2/types"
	gie "sigs.k8s.io/gateway-api-inference-extension/conformance"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
)

func spec(text, label string, state types.SpecState) types.SpecReport {
	return types.SpecReport{LeafNodeType: types.NodeTypeIt, LeafNodeText: text, State: state,
		ContainerHierarchyLabels: [][]string{{label}}}
}

func TestProfile(t *testing.T) {
	cases := []struct {
		name    string
		specs   []types.SpecReport
		want    confv1.Result
		says    string // in the summary
		passed  int
		failed  []string
		skipped []string
	}{
		{name: "all passed", specs: []types.SpecReport{spec("a", "epp", types.SpecStatePassed), spec("b", "epp", types.SpecStatePassed)},
			want: confv1.Success, says: "succeeded", passed: 2},
		{name: "a failure", specs: []types.SpecReport{spec("b", "epp", types.SpecStateFailed), spec("a", "epp", types.SpecStatePanicked),
			spec("c", "epp", types.SpecStatePassed)}, want: confv1.Failure, says: "failed", passed: 1, failed: []string{"a", "b"}},
		{name: "a skip", specs: []types.SpecReport{spec("a", "epp", types.SpecStateSkipped), spec("b", "epp", types.SpecStatePassed)},
			want: confv1.Partial, says: "partially", passed: 1, skipped: []string{"a"}},
		{name: "other labels and nodes left out", specs: []types.SpecReport{spec("a", "payload", types.SpecStateFailed),
			{LeafNodeType: types.NodeTypeBeforeSuite, State: types.SpecStateFailed, ContainerHierarchyLabels: [][]string{{"epp"}}},
			spec("b", "epp", types.SpecStatePassed)}, want: confv1.Success, says: "1 passed, 0 failed", passed: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Profile(EPPProfile, types.Report{SpecReports: tc.specs}, "epp")
			st := p.Core
			if p.Name != EPPProfile || st.Result != tc.want || st.Passed != uint32(tc.passed) ||
				st.Failed != uint32(len(tc.failed)) || st.Skipped != uint32(len(tc.skipped)) ||
				!slices.Equal(st.FailedTests, tc.failed) || !slices.Equal(st.SkippedTests, tc.skipped) {
				t.Errorf("profile %+v", p)
			}
			if !strings.Contains(p.Summary, tc.says) {
				t.Errorf("summary %q does not say %q", p.Summary, tc.says)
			}
		})
	}
}

func read(t *testing.T, path string) gie.GatewayAPIInferenceExtensionConformanceReport {
	t.Helper()
	r, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return *r
}

func names(r gie.GatewayAPIInferenceExtensionConformanceReport) []string {
	var out []string
	for _, p := range r.ProfileReports {
		out = append(out, p.Name)
	}
	return out
}

// TestWrite: a new report, profiles added to a gateway run's report and
// replaced on a second run, and a report of another implementation left
// alone.
func TestWrite(t *testing.T) {
	impl := confv1.Implementation{Organization: "acme", Project: "gw", URL: "https://acme.example", Version: "v1", Contact: []string{"@acme"}}
	path := filepath.Join(t.TempDir(), "report.yaml")
	gateway := gie.GatewayAPIInferenceExtensionConformanceReport{GatewayAPIInferenceExtensionVersion: "v1.6.0",
		ConformanceReport: confv1.ConformanceReport{Implementation: impl, GatewayAPIVersion: "v1.6.3", Mode: "default",
			ProfileReports: []confv1.ProfileReport{{Name: "Gateway"}}}}
	if err := gateway.WriteReport(t.Logf, path); err != nil {
		t.Fatal(err)
	}
	failed := confv1.ProfileReport{Name: EPPProfile, Core: confv1.Status{Result: confv1.Failure}}
	if err := Write(path, impl, "default", failed, confv1.ProfileReport{Name: PayloadProfile}); err != nil {
		t.Fatal(err)
	}
	passed := confv1.ProfileReport{Name: EPPProfile, Core: confv1.Status{Result: confv1.Success}}
	if err := Write(path, impl, "default", passed); err != nil {
		t.Fatal(err)
	}
	r := read(t, path)
	if got := names(r); !slices.Equal(got, []string{EPPProfile, "Gateway", PayloadProfile}) {
		t.Fatalf("profiles %v", got)
	}
	if r.ProfileReports[0].Core.Result != confv1.Success || r.GatewayAPIVersion != "v1.6.3" {
		t.Errorf("the second run's profile or the gateway run's fields lost: %+v", r)
	}

	other := impl
	other.Project = "other"
	if err := Write(path, other, "default", passed); err == nil || !strings.Contains(err.Error(), "acme/gw v1") {
		t.Errorf("writing another implementation's profiles into the report: %v", err)
	}

	fresh := filepath.Join(t.TempDir(), "new.yaml")
	if err := Write(fresh, impl, "default", passed); err != nil {
		t.Fatal(err)
	}
	r = read(t, fresh)
	if r.Kind != "ConformanceReport" || r.GatewayAPIInferenceExtensionVersion != SuiteVersion || r.Implementation.Project != "gw" ||
		r.Date == "" || !slices.Equal(names(r), []string{EPPProfile}) {
		t.Errorf("new report %+v", r)
	}
}
