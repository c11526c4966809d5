package main

import (
	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logFlags are the logging flags every long-running subcommand shares.
type logFlags struct {
	verbosity int
	json      bool
}

func (f *logFlags) register(fs *pflag.FlagSet) {
	fs.IntVarP(&f.verbosity, "v", "v", 0, "log verbosity: 0 info, 1 every decision, 2 and more for debugging")
	fs.BoolVar(&f.json, "log-json", false, "log as JSON lines instead of console text")
}

func (f *logFlags) logger() (logr.Logger, error) {
	var cfg zap.Config
	if f.json {
		cfg = zap.NewProductionConfig()
	} else {
		cfg = zap.NewDevelopmentConfig()
		cfg.DisableStacktrace = true
	}
	cfg.Level = zap.NewAtomicLevelAt(zapcore.Level(-f.verbosity))
	cfg.Sampling = nil
	z, err := cfg.Build()
	if err != nil {
		return logr.Logger{}, err
	}
	return zapr.NewLogger(z), nil
}
