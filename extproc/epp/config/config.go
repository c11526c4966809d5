// Package config loads an EndpointPickerConfig (the upstream file shape, so
// existing configs load unchanged), validates it with errors that name the
// field, and builds the scheduler and the data-layer settings from it.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/epp/scheduling"
)

// Accepted apiVersions: the current group and the older one it moved from.
const (
	APIVersion       = "llm-d.ai/v1alpha1"
	LegacyAPIVersion = "inference.networking.x-k8s.io/v1alpha1"
	Kind             = "EndpointPickerConfig"
)

// EndpointPickerConfig is the file shape.
type EndpointPickerConfig struct {
	APIVersion         string          `json:"apiVersion"`
	Kind               string          `json:"kind"`
	FeatureGates       []string        `json:"featureGates,omitempty"`
	Plugins            []PluginSpec    `json:"plugins,omitempty"`
	SchedulingProfiles []ProfileSpec   `json:"schedulingProfiles,omitempty"`
	DataLayer          json.RawMessage `json:"dataLayer,omitempty"`
	FlowControl        json.RawMessage `json:"flowControl,omitempty"`
	RequestHandler     json.RawMessage `json:"requestHandler,omitempty"`
	SaturationDetector json.RawMessage `json:"saturationDetector,omitempty"`
	Parser             json.RawMessage `json:"parser,omitempty"`
}

// PluginSpec declares one plugin instance.
type PluginSpec struct {
	Name       string          `json:"name,omitempty"`
	Type       string          `json:"type"`
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// ProfileSpec is a scheduling profile: an ordered list of plugin references.
type ProfileSpec struct {
	Name    string       `json:"name"`
	Plugins []ProfileRef `json:"plugins"`
}

// ProfileRef references a plugin by name, with a weight for scorers.
type ProfileRef struct {
	PluginRef string   `json:"pluginRef"`
	Weight    *float64 `json:"weight,omitempty"`
}

// DefaultConfig runs when no config is given. Requests whose prompt an
// endpoint already holds stay there (affinity filter, prefix scorer)
// unless it is clearly busier; new prompts spread over the endpoints in
// proportion to their KV caches (no-hit LRU), so the pool partitions the
// prefix space by capacity; queue depth and KV-cache use balance the rest, and LoRA
// adapters go where they are loaded.
const DefaultConfig = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
- type: prefix-cache-affinity-filter
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: no-hit-lru-scorer
- type: lora-affinity-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: no-hit-lru-scorer
    weight: 2
  - pluginRef: lora-affinity-scorer
    weight: 1
  - pluginRef: max-score-picker
`

// ConformanceTestConfig is the test picker of conformance runs: any
// endpoint the request's test-epp-endpoint-selection header names (all of
// them without it), at random. Model servers there are echo servers with
// no metrics, so no scorer has anything to read.
const ConformanceTestConfig = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-based-testing-filter
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: header-based-testing-filter
  - pluginRef: random-picker
`

// MinScrapeInterval is the shortest metrics scrape interval accepted.
const MinScrapeInterval = 50 * time.Millisecond

// DataLayer is how endpoints' metrics are scraped.
type DataLayer struct {
	Scheme             string
	Path               string
	Interval           time.Duration
	InsecureSkipVerify bool
	// EngineLabel names the endpoint label that selects the metric mapping.
	EngineLabel string
}

// Saturation configures the utilization detector used for shedding.
type Saturation struct {
	QueueDepthThreshold  float64
	KVCacheUtilThreshold float64
	// MetricsStaleness: older metrics make an endpoint count as saturated.
	MetricsStaleness time.Duration
	// SheddableThreshold is the saturation at which sheddable requests are
	// refused (without flow control).
	SheddableThreshold float64
}

// FlowControlGate is the feature gate that turns on queueing.
const FlowControlGate = "flowControl"

// FlowControl configures late-binding queueing (feature gate flowControl).
// Without it, only sheddable requests give way, with 429, when the pool is
// saturated.
type FlowControl struct {
	Enabled bool
	// RequestTTL bounds a queued request's wait (expiry → 429).
	RequestTTL time.Duration
	// MaxRequests bounds the queued requests (beyond → 429).
	MaxRequests int
}

// Loaded is a validated config turned into working parts.
type Loaded struct {
	Scheduler    *scheduling.Scheduler
	DataLayer    DataLayer
	Saturation   Saturation
	FeatureGates map[string]bool
	FlowControl  FlowControl
	// Deprecated is set when the file used the legacy apiVersion.
	Deprecated string
	// Ignored lists accepted settings this picker does not act on, so the
	// operator hears about them instead of assuming they work.
	Ignored []string
}

// LoadFile reads and builds a config file; errors are prefixed with the path.
func LoadFile(path string) (*Loaded, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	l, err := Load(raw)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return l, nil
}

// Load parses and builds config text (YAML or JSON).
func Load(raw []byte) (*Loaded, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("empty config")
	}
	var c EndpointPickerConfig
	if err := yaml.UnmarshalStrict(raw, &c); err != nil {
		return nil, err
	}
	return build(&c)
}

// Kinds of plugin the config knows; scheduling plugins come from
// scheduling.Builtins, the rest configure other parts of the picker.
const (
	dataSourceType        = "metrics-data-source"
	metricsExtractorType  = "core-metrics-extractor"
	utilizationDetectorTy = "utilization-detector"
)

func build(c *EndpointPickerConfig) (*Loaded, error) {
	l, err := newLoaded(c)
	if err != nil {
		return nil, err
	}
	builtins := scheduling.Builtins()
	d, err := l.declare(c.Plugins, builtins)
	if err != nil {
		return nil, err
	}
	producers, err := prefixProducer(d.plugins, d.producers, builtins)
	if err != nil {
		return nil, err
	}
	profiles, err := buildProfiles(c.SchedulingProfiles, d.plugins, builtins)
	if err != nil {
		return nil, err
	}
	handler, err := profileHandler(d.handlers, profiles, builtins)
	if err != nil {
		return nil, err
	}
	l.Scheduler = &scheduling.Scheduler{Producers: producers, Handler: handler, Profiles: profiles}
	return l, nil
}

// newLoaded checks the file's apiVersion and kind and applies its settings
// outside the plugins over the defaults.
func newLoaded(c *EndpointPickerConfig) (*Loaded, error) {
	l := &Loaded{
		DataLayer:    DataLayer{Scheme: "http", Path: "/metrics", Interval: 50 * time.Millisecond, InsecureSkipVerify: true, EngineLabel: datastore.EngineLabel},
		Saturation:   Saturation{QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8, MetricsStaleness: 200 * time.Millisecond, SheddableThreshold: 0.8},
		FeatureGates: map[string]bool{},
	}
	switch c.APIVersion {
	case APIVersion:
	case LegacyAPIVersion:
		l.Deprecated = fmt.Sprintf("apiVersion %s is deprecated; use %s", LegacyAPIVersion, APIVersion)
	default:
		return nil, fmt.Errorf("apiVersion: %q (want %s or %s)", c.APIVersion, APIVersion, LegacyAPIVersion)
	}
	if c.Kind != Kind {
		return nil, fmt.Errorf("kind: %q (want %s)", c.Kind, Kind)
	}
	for _, g := range c.FeatureGates {
		name, off := strings.CutSuffix(g, "=false")
		l.FeatureGates[name] = !off
	}
	l.FlowControl = FlowControl{Enabled: l.FeatureGates[FlowControlGate], RequestTTL: 60 * time.Second, MaxRequests: 5000}
	if err := l.applyFlowControl(c.FlowControl); err != nil {
		return nil, fmt.Errorf("flowControl: %w", err)
	}
	for key, raw := range map[string]json.RawMessage{"dataLayer": c.DataLayer, "requestHandler": c.RequestHandler, "saturationDetector": c.SaturationDetector, "parser": c.Parser} {
		if len(raw) > 0 {
			l.Ignored = append(l.Ignored, key)
		}
	}
	slices.Sort(l.Ignored)
	return l, nil
}

// declared are the scheduling plugins a config declares, by name, and
// those of them that are profile handlers and producers.
type declared struct {
	plugins   map[string]scheduling.Plugin
	handlers  []scheduling.ProfileHandler
	producers []scheduling.Producer
}

// declare builds the plugins that specs declare: the scheduling plugins,
// and the settings of the other parts of the picker that configs declare
// as plugins too.
func (l *Loaded) declare(specs []PluginSpec, builtins map[string]scheduling.Factory) (*declared, error) {
	d := &declared{plugins: map[string]scheduling.Plugin{}}
	for i, ps := range specs {
		field := fmt.Sprintf("plugins[%d]", i)
		if ps.Type == "" {
			return nil, fmt.Errorf("%s.type: required", field)
		}
		name := ps.Name
		if name == "" {
			name = ps.Type
		}
		if isOtherPlugin(name, specs[:i]) {
			return nil, fmt.Errorf("%s.name: %q is used by another plugin", field, name)
		}
		var err error
		switch ps.Type {
		case dataSourceType:
			err = l.DataLayer.applySource(ps.Parameters)
		case metricsExtractorType:
			err = l.DataLayer.applyExtractor(ps.Parameters)
		case utilizationDetectorTy:
			err = l.Saturation.apply(ps.Parameters)
		default:
			f, ok := builtins[ps.Type]
			if !ok {
				return nil, fmt.Errorf("%s.type: unknown plugin type %q (known: %s)", field, ps.Type, strings.Join(knownTypes(builtins), ", "))
			}
			err = d.add(f, name, ps.Parameters)
		}
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", field, name, err)
		}
	}
	return d, nil
}

// add builds one scheduling plugin.
func (d *declared) add(f scheduling.Factory, name string, params json.RawMessage) error {
	p, err := f(name, params)
	if err != nil {
		return err
	}
	d.plugins[name] = p
	if h, ok := p.(scheduling.ProfileHandler); ok {
		d.handlers = append(d.handlers, h)
	}
	if pr, ok := p.(scheduling.Producer); ok {
		d.producers = append(d.producers, pr)
	}
	return nil
}

// buildProfiles builds the scheduling profiles from the declared plugins.
func buildProfiles(specs []ProfileSpec, plugins map[string]scheduling.Plugin, builtins map[string]scheduling.Factory) (map[string]*scheduling.Profile, error) {
	profiles := map[string]*scheduling.Profile{}
	for i, ps := range specs {
		field := fmt.Sprintf("schedulingProfiles[%d]", i)
		if ps.Name == "" {
			return nil, fmt.Errorf("%s.name: required", field)
		}
		if _, dup := profiles[ps.Name]; dup {
			return nil, fmt.Errorf("%s.name: profile %q defined twice", field, ps.Name)
		}
		p, err := buildProfile(ps, plugins, builtins)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		profiles[ps.Name] = p
	}
	if len(profiles) == 0 {
		return nil, errors.New("schedulingProfiles: at least one profile is required")
	}
	return profiles, nil
}

// profileHandler is the one declared profile handler, or the
// single-profile handler for a config of one profile that declares none.
func profileHandler(handlers []scheduling.ProfileHandler, profiles map[string]*scheduling.Profile, builtins map[string]scheduling.Factory) (scheduling.ProfileHandler, error) {
	switch {
	case len(handlers) > 1:
		return nil, fmt.Errorf("plugins: %d profile handlers declared (%s and %s); use one", len(handlers), handlers[0].Name(), handlers[1].Name())
	case len(handlers) == 0 && len(profiles) > 1:
		return nil, fmt.Errorf("plugins: %d profiles need a profile handler that chooses between them", len(profiles))
	case len(handlers) == 0:
		h, _ := builtins[scheduling.SingleProfileHandlerType](scheduling.SingleProfileHandlerType, nil)
		return h.(scheduling.ProfileHandler), nil
	case handlers[0].Type() == scheduling.SingleProfileHandlerType && len(profiles) > 1:
		return nil, fmt.Errorf("plugins: %s %q cannot run %d profiles", scheduling.SingleProfileHandlerType, handlers[0].Name(), len(profiles))
	}
	return handlers[0], nil
}

// readsPrefixMatch reports whether plugins of type typ read the prefix
// producer's per-request match.
func readsPrefixMatch(typ string) bool {
	switch typ {
	case scheduling.PrefixCacheScorerType, scheduling.PrefixAffinityFilterType, scheduling.NoHitLRUScorerType:
		return true
	}
	return false
}

// prefixProducer injects the prefix producer with its defaults when a
// plugin needs it and the config declares none, and refuses two: they
// would keep two indexes and disagree.
func prefixProducer(plugins map[string]scheduling.Plugin, producers []scheduling.Producer, builtins map[string]scheduling.Factory) ([]scheduling.Producer, error) {
	var declared []string
	for _, p := range producers {
		if p.Type() == scheduling.PrefixProducerType {
			declared = append(declared, p.Name())
		}
	}
	if len(declared) > 1 {
		return nil, fmt.Errorf("plugins: %d %s plugins (%s); declare at most one", len(declared), scheduling.PrefixProducerType, strings.Join(declared, ", "))
	}
	if len(declared) == 1 {
		return producers, nil
	}
	for _, p := range plugins {
		if readsPrefixMatch(p.Type()) {
			pr, err := builtins[scheduling.PrefixProducerType](scheduling.PrefixProducerType, nil)
			if err != nil {
				return nil, err
			}
			return append(producers, pr.(scheduling.Producer)), nil
		}
	}
	return producers, nil
}

func isOtherPlugin(name string, earlier []PluginSpec) bool {
	for _, ps := range earlier {
		if ps.Name == name || (ps.Name == "" && ps.Type == name) {
			return true
		}
	}
	return false
}

func buildProfile(ps ProfileSpec, plugins map[string]scheduling.Plugin, builtins map[string]scheduling.Factory) (*scheduling.Profile, error) {
	p := &scheduling.Profile{Name: ps.Name}
	seen := map[string]bool{}
	for j, ref := range ps.Plugins {
		field := fmt.Sprintf("plugins[%d]", j)
		if ref.Weight != nil && !(*ref.Weight > 0) { // also rejects NaN
			return nil, fmt.Errorf("%s.weight: must be a positive number, got %v", field, *ref.Weight)
		}
		pl, ok := plugins[ref.PluginRef]
		if !ok {
			return nil, fmt.Errorf("%s.pluginRef: %q names no scheduling plugin declared under plugins", field, ref.PluginRef)
		}
		if seen[ref.PluginRef] {
			return nil, fmt.Errorf("%s.pluginRef: %q referenced twice in one profile", field, ref.PluginRef)
		}
		seen[ref.PluginRef] = true
		switch x := pl.(type) {
		case scheduling.Filter:
			p.Filters = append(p.Filters, x)
		case scheduling.Scorer:
			w := 1.0
			if ref.Weight != nil {
				w = *ref.Weight
			}
			p.Scorers = append(p.Scorers, scheduling.WeightedScorer{Scorer: x, Weight: w})
		case scheduling.Picker:
			if p.Picker != nil {
				return nil, fmt.Errorf("%s.pluginRef: a profile takes one picker; %q and %q are both pickers", field, p.Picker.Name(), x.Name())
			}
			p.Picker = x
		default:
			return nil, fmt.Errorf("%s.pluginRef: %q is a %s, which does not belong in a profile", field, ref.PluginRef, pl.Type())
		}
	}
	if p.Picker == nil {
		pk, _ := builtins[scheduling.MaxScorePickerType](scheduling.MaxScorePickerType, nil)
		p.Picker = pk.(scheduling.Picker)
	}
	return p, nil
}

func knownTypes(builtins map[string]scheduling.Factory) []string {
	out := []string{dataSourceType, metricsExtractorType, utilizationDetectorTy}
	for t := range builtins {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// duration accepts "50ms" style strings in parameters.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string like \"50ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v <= 0 {
		return fmt.Errorf("duration %q must be positive", s)
	}
	*d = duration(v)
	return nil
}

// applyFlowControl reads the flowControl keys this picker acts on; the
// upstream's per-band settings are accepted and reported as ignored.
func (l *Loaded) applyFlowControl(raw json.RawMessage) error {
	if len(raw) == 0 {
		return nil
	}
	var fc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fc); err != nil {
		return err
	}
	for key, v := range fc {
		switch key {
		case "defaultRequestTTL":
			var d duration
			if err := json.Unmarshal(v, &d); err != nil {
				return fmt.Errorf("defaultRequestTTL: %w", err)
			}
			l.FlowControl.RequestTTL = time.Duration(d)
		case "maxRequests":
			var n int
			if err := json.Unmarshal(v, &n); err != nil || n < 1 {
				return fmt.Errorf("maxRequests: want a positive integer, got %s", v)
			}
			l.FlowControl.MaxRequests = n
		default:
			l.Ignored = append(l.Ignored, "flowControl."+key)
		}
	}
	return nil
}

func (d *DataLayer) applySource(params json.RawMessage) error {
	var p struct {
		Scheme             *string   `json:"scheme"`
		Path               *string   `json:"path"`
		Interval           *duration `json:"interval"`
		InsecureSkipVerify *bool     `json:"insecureSkipVerify"`
	}
	if err := scheduling.DecodeParams(params, &p); err != nil {
		return err
	}
	if p.Scheme != nil {
		if *p.Scheme != "http" && *p.Scheme != "https" {
			return fmt.Errorf("parameters.scheme: %q (want http or https)", *p.Scheme)
		}
		d.Scheme = *p.Scheme
	}
	if p.Path != nil {
		if !strings.HasPrefix(*p.Path, "/") {
			return fmt.Errorf("parameters.path: %q must start with /", *p.Path)
		}
		d.Path = *p.Path
	}
	if p.Interval != nil {
		// Faster scraping costs the model servers more than it tells.
		if time.Duration(*p.Interval) < MinScrapeInterval {
			return fmt.Errorf("parameters.interval: %s is below the minimum of %s", time.Duration(*p.Interval), MinScrapeInterval)
		}
		d.Interval = time.Duration(*p.Interval)
	}
	if p.InsecureSkipVerify != nil {
		d.InsecureSkipVerify = *p.InsecureSkipVerify
	}
	return nil
}

func (d *DataLayer) applyExtractor(params json.RawMessage) error {
	var p struct {
		EngineLabelKey *string `json:"engineLabelKey"`
	}
	if err := scheduling.DecodeParams(params, &p); err != nil {
		return err
	}
	if p.EngineLabelKey != nil {
		d.EngineLabel = *p.EngineLabelKey
	}
	return nil
}

func (s *Saturation) apply(params json.RawMessage) error {
	var p struct {
		QueueDepthThreshold       *float64  `json:"queueDepthThreshold"`
		KVCacheUtilThreshold      *float64  `json:"kvCacheUtilThreshold"`
		MetricsStalenessThreshold *duration `json:"metricsStalenessThreshold"`
		SheddableThreshold        *float64  `json:"sheddableThreshold"`
	}
	if err := scheduling.DecodeParams(params, &p); err != nil {
		return err
	}
	if p.SheddableThreshold != nil {
		if !(*p.SheddableThreshold > 0 && *p.SheddableThreshold <= 1) {
			return fmt.Errorf("parameters.sheddableThreshold: must be in (0,1], got %v", *p.SheddableThreshold)
		}
		s.SheddableThreshold = *p.SheddableThreshold
	}
	if p.QueueDepthThreshold != nil {
		if !(*p.QueueDepthThreshold > 0) {
			return fmt.Errorf("parameters.queueDepthThreshold: must be positive, got %v", *p.QueueDepthThreshold)
		}
		s.QueueDepthThreshold = *p.QueueDepthThreshold
	}
	if p.KVCacheUtilThreshold != nil {
		if !(*p.KVCacheUtilThreshold > 0 && *p.KVCacheUtilThreshold <= 1) {
			return fmt.Errorf("parameters.kvCacheUtilThreshold: must be in (0,1], got %v", *p.KVCacheUtilThreshold)
		}
		s.KVCacheUtilThreshold = *p.KVCacheUtilThreshold
	}
	if p.MetricsStalenessThreshold != nil {
		s.MetricsStaleness = time.Duration(*p.MetricsStalenessThreshold)
	}
	return nil
}
