// Package reportdir writes a profile run's report, in the upstream suite's
// format, where make conformance-reports keeps the committed ones:
// $INFERGATE_CONFORMANCE_REPORTS/<project>/<version>-default-report.yaml,
// the version being infergate's (the VERSION file at the module root).
package reportdir

import (
	"context"
	"os"
	"path/filepath"

	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"

	"github.com/infergate/infergate/conformance/report"
	"github.com/infergate/infergate/test/controlplane"
)

// Env names the folder; unset, Write writes nothing.
const Env = "INFERGATE_CONFORMANCE_REPORTS"

// Write adds profile to project's report under $INFERGATE_CONFORMANCE_REPORTS.
func Write(project string, profile confv1.ProfileReport) error {
	dir := os.Getenv(Env)
	if dir == "" {
		return nil
	}
	version, err := controlplane.Version(context.Background())
	if err != nil {
		return err
	}
	path := filepath.Join(dir, project, version+"-default-report.yaml")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	impl := confv1.Implementation{Organization: "infergate", Project: project, URL: "https://github.com/infergate/infergate",
		Version: version, Contact: []string{"@infergate/maintainers"}}
	return report.Write(path, impl, "default", profile)
}
