// Package report writes the results of the epp and payload profiles in
// the report format of the upstream InferencePool conformance suite
// (gateway-api's ConformanceReport plus gatewayAPIInferenceExtensionVersion),
// the format the gateway profile writes, so that one report can hold a
// gateway's results and its picker's and payload processor's.
package report

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gie "sigs.k8s.io/gateway-api-inference-extension/conformance"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
	"sigs.k8s.io/yaml"
)

// SuiteVersion is the upstream suite version the reports name; the
// gateway profile runs that version's tests.
const SuiteVersion = "v1.6.0"

// Profile names of the epp and payload profiles in a report. They carry
// the -infergate suffix as the gateway profile's stricter profile does:
// upstream has no such profiles.
const (
	EPPProfile     = "EPP-infergate"
	PayloadProfile = "Payload-infergate"
)

// Profile is the profile report named name of the It specs of r that
// carry label: each spec is a test, named by its text.
func Profile(name string, r types.Report, label string) confv1.ProfileReport {
	var st confv1.Status
	for _, s := range r.SpecReports {
		if s.LeafNodeType != types.NodeTypeIt || !slices.Contains(s.Labels(), label) {
			continue
		}
		switch {
		case s.State == types.SpecStatePassed:
			st.Passed++
		case s.State.Is(types.SpecStateSkipped | types.SpecStatePending):
			st.Skipped++
			st.SkippedTests = append(st.SkippedTests, s.LeafNodeText)
		case s.State.Is(types.SpecStateFailureStates):
			st.Failed++
			st.FailedTests = append(st.FailedTests, s.LeafNodeText)
		}
	}
	slices.Sort(st.SkippedTests)
	slices.Sort(st.FailedTests)
	switch {
	case st.Failed > 0:
		st.Result = confv1.Failure
	case st.Skipped > 0:
		st.Result = confv1.Partial
	default:
		st.Result = confv1.Success
	}
	summary := fmt.Sprintf("Core tests %s: %d passed, %d failed, %d skipped", resultWord(st.Result), st.Passed, st.Failed, st.Skipped)
	return confv1.ProfileReport{Name: name, Summary: summary, Core: st}
}

func resultWord(r confv1.Result) string {
	switch r {
	case confv1.Success:
		return "succeeded"
	case confv1.Partial:
		return "partially succeeded"
	default:
		return "failed"
	}
}

// Write puts profiles into the report at path: a report already there
// (from a gateway run, say) keeps its other profiles and its own fields,
// and must name the same implementation; otherwise a new report is
// written for impl and mode, dated now.
func Write(path string, impl confv1.Implementation, mode string, profiles ...confv1.ProfileReport) error {
	r := gie.GatewayAPIInferenceExtensionConformanceReport{
		GatewayAPIInferenceExtensionVersion: SuiteVersion,
		ConformanceReport: confv1.ConformanceReport{
			TypeMeta:       metav1.TypeMeta{APIVersion: "gateway.networking.k8s.io/v1", Kind: "ConformanceReport"},
			Implementation: impl,
			Date:           time.Now().Format(time.RFC3339),
			Mode:           mode,
		},
	}
	old, err := Read(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	default:
		if o := old.Implementation; o.Organization != impl.Organization || o.Project != impl.Project || o.Version != impl.Version {
			return fmt.Errorf("report %s is for %s/%s %s, not %s/%s %s: give another --report-output",
				path, o.Organization, o.Project, o.Version, impl.Organization, impl.Project, impl.Version)
		}
		r = *old
	}
	for _, p := range profiles {
		r.ProfileReports = slices.DeleteFunc(r.ProfileReports, func(q confv1.ProfileReport) bool { return q.Name == p.Name })
		r.ProfileReports = append(r.ProfileReports, p)
	}
	slices.SortFunc(r.ProfileReports, func(a, b confv1.ProfileReport) int { return strings.Compare(a.Name, b.Name) })
	out, err := yaml.Marshal(r)
	if err != nil {
		return fmt.Errorf("report %s: %w", path, err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return fmt.Errorf("report %s: %w", path, err)
	}
	return nil
}

// Read reads the report at path.
func Read(path string) (*gie.GatewayAPIInferenceExtensionConformanceReport, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("report %s: %w", path, err)
	}
	var r gie.GatewayAPIInferenceExtensionConformanceReport
	if err := yaml.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("report %s: %w", path, err)
	}
	return &r, nil
}
