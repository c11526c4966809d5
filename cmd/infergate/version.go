package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version and commit are set at build time with -ldflags "-X
// main.version=... -X main.commit=..." (the Makefile does); a plain go
// build falls back to what the go command recorded, if anything.
var (
	version = "dev"
	commit  = ""
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		RunE: func(cmd *cobra.Command, _ []string) error {
			goVersion, c := "unknown", commit
			if info, ok := debug.ReadBuildInfo(); ok {
				goVersion = info.GoVersion
				if c == "" {
					c = revision(info)
				}
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "infergate %s (%s%s)\n", version, goVersion, commitSuffix(c))
			return err
		},
	}
}

// commitSuffix names the commit, so a version shared by many commits
// still identifies one.
func commitSuffix(c string) string {
	if c == "" {
		return ""
	}
	return ", commit " + c
}

// revision is the checkout the go command recorded (with -buildvcs), as
// <hash>[-dirty].
func revision(info *debug.BuildInfo) string {
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return ""
	}
	return rev[:min(12, len(rev))] + dirty
}
