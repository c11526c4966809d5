// Package flagtest checks options that own their flags (AddFlags,
// Validate): a command line is parsed into fresh options as a command
// would, and Validate is held to the error each case wants.
package flagtest

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// Options are options that bind their flags and check them.
type Options interface {
	AddFlags(*pflag.FlagSet)
	Validate() error
}

// Case is one command line and what Validate must say of it: "" for
// nothing, else a part of its error (the flag it names, say).
type Case struct {
	Name string
	Args []string
	Want string
}

// Parse binds o to a fresh flag set, parses args into it and returns o.
func Parse[O Options](t testing.TB, o O, args ...string) O {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o
}

// Validate runs each case, a subtest of its own, on options fresh from
// newOptions.
func Validate[O Options](t *testing.T, newOptions func() O, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			err := Parse(t, newOptions(), tc.Args...).Validate()
			switch {
			case tc.Want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.Want != "" && (err == nil || !strings.Contains(err.Error(), tc.Want)):
				t.Fatalf("Validate: %v, want it to contain %q", err, tc.Want)
			}
		})
	}
}
