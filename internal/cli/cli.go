// Package cli holds what infergate's three commands (infergate,
// infergate-conformance, envoysim) share: the logging flags, the GC target
// and the process's main, so that each command's files only bind options
// to flags and run.
package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Main runs root until it returns or the process is told to stop (SIGINT,
// SIGTERM cancel the command's context), and exits non-zero with the error
// prefixed by the command's name when it fails.
func Main(root *cobra.Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", root.Name(), err)
		os.Exit(1)
	}
}

// LogFlags are the logging flags every long-running command shares.
type LogFlags struct {
	Verbosity int
	JSON      bool
}

// AddFlags binds the options to -v and --log-json.
func (f *LogFlags) AddFlags(fs *pflag.FlagSet) {
	fs.IntVarP(&f.Verbosity, "v", "v", 0, "log verbosity: 0 info, 1 every decision, 2 and more for debugging")
	fs.BoolVar(&f.JSON, "log-json", false, "log as JSON lines instead of console text")
}

// Logger builds the logger the flags describe: console text for people,
// JSON lines for collectors, never sampled (a dropped decision log is a
// decision nobody can explain).
func (f *LogFlags) Logger() (logr.Logger, error) {
	var cfg zap.Config
	if f.JSON {
		cfg = zap.NewProductionConfig()
	} else {
		cfg = zap.NewDevelopmentConfig()
		cfg.DisableStacktrace = true
	}
	cfg.Level = zap.NewAtomicLevelAt(zapcore.Level(-f.Verbosity))
	cfg.Sampling = nil
	z, err := cfg.Build()
	if err != nil {
		return logr.Logger{}, fmt.Errorf("logger: %w", err)
	}
	return zapr.NewLogger(z), nil
}

// TuneGC sets the GC target percent unless GOGC says otherwise: each
// server knows its own heap's shape better than Go's default of 100 does.
func TuneGC(percent int) {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(percent)
	}
}
