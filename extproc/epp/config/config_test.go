package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/config"
)

const head = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"

func TestLoadRejectsBadConfigsNamingTheField(t *testing.T) {
	cases := []struct {
		name, text, wantErr string
	}{
		{"unknown plugin type", head + "plugins:\n- type: magic-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: magic-scorer\n",
			`plugins[0].type: unknown plugin type "magic-scorer"`},
		{"dangling pluginRef", head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: kv\n",
			`schedulingProfiles[0]: plugins[0].pluginRef: "kv" names no scheduling plugin`},
		{"duplicate plugin names", head + "plugins:\n- type: queue-scorer\n  name: s\n- type: kv-cache-utilization-scorer\n  name: s\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: s\n",
			`plugins[1].name: "s" is used by another plugin`},
		{"duplicate default names", head + "plugins:\n- type: queue-scorer\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n",
			`plugins[1].name: "queue-scorer" is used`},
		{"duplicate profile names", head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n",
			`schedulingProfiles[1].name: profile "a" defined twice`},
		{"two pickers", head + "plugins:\n- type: max-score-picker\n- type: random-picker\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: max-score-picker\n  - pluginRef: random-picker\n",
			`schedulingProfiles[0]: plugins[1].pluginRef: a profile takes one picker`},
		{"zero weight", head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n    weight: 0\n",
			`schedulingProfiles[0]: plugins[0].weight: must be a positive number`},
		{"negative weight", head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n    weight: -2\n",
			`plugins[0].weight: must be a positive number`},
		{"string weight", head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n    weight: heavy\n",
			`weight`},
		{"bad apiVersion", "apiVersion: v1\nkind: EndpointPickerConfig\n", `apiVersion: "v1"`},
		{"bad kind", "apiVersion: llm-d.ai/v1alpha1\nkind: Pod\n", `kind: "Pod"`},
		{"unknown top-level field", head + "plugin:\n- type: queue-scorer\n", `unknown field "plugin"`},
		{"unknown parameter", head + "plugins:\n- type: max-score-picker\n  parameters:\n    maxEndpoints: 2\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: max-score-picker\n",
			`plugins[0] (max-score-picker): parameters: json: unknown field "maxEndpoints"`},
		{"no profiles", head + "plugins:\n- type: queue-scorer\n", `schedulingProfiles: at least one profile`},
		{"handler in a profile", head + "plugins:\n- type: single-profile-handler\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: single-profile-handler\n",
			`does not belong in a profile`},
		{"two profiles without handler", head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n- name: b\n  plugins:\n  - pluginRef: queue-scorer\n",
			`2 profiles need a profile handler`},
		{"bad data source scheme", head + "plugins:\n- type: metrics-data-source\n  parameters:\n    scheme: ftp\nschedulingProfiles:\n- name: a\n  plugins: []\n",
			`plugins[0] (metrics-data-source): parameters.scheme: "ftp"`},
		{"empty", "  \n", "empty config"},
		{"bad flow-control ttl", head + "flowControl:\n  defaultRequestTTL: soon\n", `flowControl: defaultRequestTTL`},
		{"scrape interval too short", head + "plugins:\n- type: metrics-data-source\n  parameters:\n    interval: 10ms\nschedulingProfiles:\n- name: a\n  plugins: []\n",
			`plugins[0] (metrics-data-source): parameters.interval: 10ms is below the minimum of 50ms`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load([]byte(tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestLoadFileNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "epp.yaml")
	if err := os.WriteFile(path, []byte(head+"plugins:\n- type: nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := config.LoadFile(path)
	if err == nil || !strings.Contains(err.Error(), "config file "+path+": plugins[0].type") {
		t.Fatalf("error = %v", err)
	}
}

func TestDefaultConfigBuilds(t *testing.T) {
	l, err := config.Load([]byte(config.DefaultConfig))
	if err != nil {
		t.Fatal(err)
	}
	p := l.Scheduler.Profiles["default"]
	if p == nil || len(p.Scorers) != 5 || len(p.Filters) != 1 || p.Picker == nil || p.Picker.Type() != "max-score-picker" {
		t.Fatalf("default profile = %+v", p)
	}
	if len(l.Scheduler.Producers) != 1 || l.Scheduler.Producers[0].Type() != "approx-prefix-cache-producer" {
		t.Fatalf("producers %v", l.Scheduler.Producers)
	}
	if l.Scheduler.Handler.Type() != "single-profile-handler" {
		t.Errorf("handler = %s", l.Scheduler.Handler.Type())
	}
	weights := map[string]float64{}
	for _, s := range p.Scorers {
		weights[s.Type()] = s.Weight
	}
	if weights["queue-scorer"] != 2 || weights["kv-cache-utilization-scorer"] != 2 || weights["prefix-cache-scorer"] != 3 ||
		weights["no-hit-lru-scorer"] != 2 || weights["lora-affinity-scorer"] != 1 {
		t.Errorf("weights = %v", weights)
	}
}

func TestPrefixProducerIsInjectedOnce(t *testing.T) {
	l, err := config.Load([]byte(head + "plugins:\n- type: prefix-cache-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: prefix-cache-scorer\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Scheduler.Producers) != 1 {
		t.Fatalf("want the producer injected, got %v", l.Scheduler.Producers)
	}
	if l, _ := config.Load([]byte(head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: queue-scorer\n")); len(l.Scheduler.Producers) != 0 {
		t.Fatal("producer injected where nothing needs it")
	}
	_, err = config.Load([]byte(head + "plugins:\n- type: approx-prefix-cache-producer\n- type: approx-prefix-cache-producer\n  name: second\nschedulingProfiles:\n- name: a\n  plugins: []\n"))
	if err == nil || !strings.Contains(err.Error(), "declare at most one") {
		t.Fatalf("two producers: %v", err)
	}
}

func TestUpstreamShapedConfigLoads(t *testing.T) {
	text := `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: ["flowControl=false"]
plugins:
- type: metrics-data-source
  parameters:
    scheme: http
    path: /metrics
    interval: 100ms
- type: core-metrics-extractor
- type: utilization-detector
  parameters:
    queueDepthThreshold: 8
    kvCacheUtilThreshold: 0.9
    metricsStalenessThreshold: 500ms
- name: gpu-a100
  type: label-selector-filter
  parameters:
    matchLabels: {gpu: a100}
- type: queue-scorer
- type: max-score-picker
  parameters:
    maxNumOfEndpoints: 3
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: gpu-a100
  - pluginRef: queue-scorer
    weight: 1.5
  - pluginRef: max-score-picker
dataLayer:
  sources: []
flowControl:
  defaultRequestTTL: 15s
  maxRequests: 100
  priorityBands: []
`
	l, err := config.Load([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if l.Deprecated == "" {
		t.Error("legacy apiVersion should be reported as deprecated")
	}
	if l.DataLayer.Interval != 100*time.Millisecond || l.Saturation.QueueDepthThreshold != 8 || l.Saturation.KVCacheUtilThreshold != 0.9 || l.Saturation.MetricsStaleness != 500*time.Millisecond {
		t.Errorf("data layer %+v saturation %+v", l.DataLayer, l.Saturation)
	}
	if l.FeatureGates["flowControl"] || l.FlowControl.Enabled {
		t.Error("flowControl=false should disable the gate")
	}
	if l.FlowControl.RequestTTL != 15*time.Second || l.FlowControl.MaxRequests != 100 {
		t.Errorf("flow control %+v", l.FlowControl)
	}
	if fmt.Sprint(l.Ignored) != "[dataLayer flowControl.priorityBands]" {
		t.Errorf("ignored %v", l.Ignored)
	}
	p := l.Scheduler.Profiles["default"]
	if len(p.Filters) != 1 || p.Scorers[0].Weight != 1.5 {
		t.Errorf("profile = %+v", p)
	}
}
