// Package reportdir writes a profile run's report, in the upstream suite's
// format, where make conformance-reports keeps the committed ones:
// $INFERGATE_CONFORMANCE_REPORTS/<project>/<version>-default-report.yaml,
// the version being infergate's (the VERSION file at the module root).
package reportdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"

	"github.com/infergate/infergate/conformance/report"
)

// Env names the folder; unset, Write writes nothing.
const Env = "INFERGATE_CONFORMANCE_REPORTS"

// Write adds profile to project's report under $INFERGATE_CONFORMANCE_REPORTS.
func Write(project string, profile confv1.ProfileReport) error {
	dir := os.Getenv(Env)
	if dir == "" {
		return nil
	}
	version, err := moduleVersion()
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

// moduleVersion reads VERSION from the nearest folder up from the working
// directory that holds go.mod.
func moduleVersion() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			v, err := os.ReadFile(filepath.Join(dir, "VERSION"))
			if err != nil {
				return "", fmt.Errorf("reportdir: %w", err)
			}
			return strings.TrimSpace(string(v)), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("reportdir: no go.mod above the working directory")
		}
		dir = parent
	}
}
