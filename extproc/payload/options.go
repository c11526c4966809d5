package payload

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/infergate/infergate/extproc/server"
)

// Options are the payload processor's command-line options: the server's
// flags and the processor's own.
type Options struct {
	Server             *server.Flags
	ConfigFile         string
	ConfigPoll         time.Duration
	ConfigMapNamespace string
	Kubeconfig         string
	KeepStreamOptions  bool
}

// NewOptions are the defaults: ext_proc on 9004, health on 9005.
func NewOptions() *Options {
	return &Options{Server: server.NewFlags(9004, 9005)}
}

// AddFlags binds the options to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Server.AddFlags(fs)
	fs.StringVar(&o.ConfigFile, "config-file", "", "YAML policy: models, limits, pii and deny rules (default: model headers only)")
	fs.DurationVar(&o.ConfigPoll, "config-poll-interval", time.Second, "how often the config file is checked for changes")
	fs.StringVar(&o.ConfigMapNamespace, "configmap-namespace", "", `read adapter ConfigMaps (label inference.llm-d.ai/ipp-managed: "true") in this namespace; "*" for all; empty: off`)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file for --configmap-namespace (default: $KUBECONFIG, then in-cluster)")
	fs.BoolVar(&o.KeepStreamOptions, "keep-stream-options", false, "forward streamed chat/completions requests as sent; by default the processor adds stream_options.include_usage so their tokens are metered, and removes the extra usage chunk for clients that did not ask")
}

// Validate checks the options without reading files; New reads the policy
// and fails with the file and field named.
func (o *Options) Validate() error {
	if err := o.Server.Validate(); err != nil {
		return err
	}
	if o.ConfigPoll <= 0 {
		return fmt.Errorf("--config-poll-interval: %s is not positive", o.ConfigPoll)
	}
	if o.Kubeconfig != "" && o.ConfigMapNamespace == "" {
		return fmt.Errorf("--kubeconfig is read for --configmap-namespace only")
	}
	return nil
}

// Config is the processor's configuration from the options (its logger
// left to the caller).
func (o *Options) Config() Config {
	return Config{
		Server:             o.Server.Options(),
		ConfigFile:         o.ConfigFile,
		ConfigPoll:         o.ConfigPoll,
		ConfigMapNamespace: o.ConfigMapNamespace,
		Kubeconfig:         o.Kubeconfig,
		KeepStreamOptions:  o.KeepStreamOptions,
	}
}
