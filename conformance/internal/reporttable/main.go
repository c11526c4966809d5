// Command reporttable prints the table of the conformance reports under a
// folder (conformance/reports/<suite version>/<implementation>/
// *-report.yaml, upstream's format) as Markdown, for the folder's README
// and the project's: make conformance-reports runs it.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"

	"github.com/infergate/infergate/conformance/report"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: reporttable <reports folder>")
		os.Exit(2)
	}
	if err := write(os.Stdout, os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "reporttable:", err)
		os.Exit(1)
	}
}

// write prints one row per report under dir, by implementation.
func write(w io.Writer, dir string) error {
	paths, err := filepath.Glob(filepath.Join(dir, "*", "*-report.yaml"))
	if err != nil {
		return err
	}
	if len(paths) == 0 {
		return errors.New("no report under " + dir)
	}
	slices.Sort(paths)
	var b strings.Builder
	b.WriteString("| implementation | version | profile | result | passed | failed | skipped | failed tests | report |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, p := range paths {
		r, err := report.Read(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		profiles := slices.Clone(r.ProfileReports)
		slices.SortFunc(profiles, func(a, b confv1.ProfileReport) int { return strings.Compare(a.Name, b.Name) })
		for _, pr := range profiles {
			failed := strings.Join(pr.Core.FailedTests, ", ")
			if failed == "" {
				failed = "none"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %d | %d | %s | [%s](%s) |\n", r.Project, r.Version, pr.Name, pr.Core.Result,
				pr.Core.Passed, pr.Core.Failed, pr.Core.Skipped, failed, filepath.Base(p), filepath.ToSlash(rel))
		}
	}
	_, err = io.WriteString(w, b.String())
	return err
}
