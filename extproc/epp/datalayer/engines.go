package datalayer

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// selector picks the series of one metric family, optionally only those
// whose label has a given value (Triton packs several signals into one
// family, told apart by a label).
type selector struct {
	name         string
	label, value string
}

// signal lists selectors in order of preference: the first one with any
// matching series is used. This is how a renamed metric falls back to its
// older name.
type signal []selector

// intSignal is an optional integer: either read from a label of the newest
// series of an info-style gauge, or the largest value of a plain gauge.
type intSignal struct {
	signal
	label string // "" reads the value
}

// mapping says where one engine reports what datastore.Metrics holds.
// Waiting, running and KV usage are required; the rest is optional.
type mapping struct {
	waiting, running, kvUsage signal
	blockSize, numGPUBlocks   intSignal
	// promptTokens, prefixQueries and prefixHits are cumulative counters
	// in the server's tokens (optional; nil when the engine has none).
	promptTokens, prefixQueries, prefixHits signal
	// lora names an info gauge with labels max_lora, running_lora_adapters
	// and waiting_lora_adapters whose value is the time of the last change;
	// "" when the engine does not report LoRA.
	lora string
}

func gauge(names ...string) signal {
	s := make(signal, len(names))
	for i, n := range names {
		s[i] = selector{name: n}
	}
	return s
}

func where(name, label, value string) signal {
	return signal{{name: name, label: label, value: value}}
}

func infoLabel(name, label string) intSignal { return intSignal{signal: gauge(name), label: label} }

func valueOf(s signal) intSignal { return intSignal{signal: s} }

// engines maps datastore engine names to their metric names
// (epp-protocol.md §3). It is never written.
var engines = map[string]mapping{
	datastore.EngineVLLM: {
		waiting: gauge("vllm:num_requests_waiting"),
		running: gauge("vllm:num_requests_running"),
		// vLLM renamed this gauge; older servers only have the gpu_ name.
		kvUsage:      gauge("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
		blockSize:    infoLabel("vllm:cache_config_info", "block_size"),
		numGPUBlocks: infoLabel("vllm:cache_config_info", "num_gpu_blocks"),
		lora:         "vllm:lora_requests_info",
		promptTokens: gauge("vllm:prompt_tokens_total", "vllm:prompt_tokens"),
		// vLLM V1 counts prefix-cache lookups in tokens; early V1 releases
		// named them gpu_prefix_cache_*.
		prefixQueries: gauge("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries"),
		prefixHits:    gauge("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits"),
	},
	datastore.EngineSGLang: {
		waiting:      gauge("sglang:num_queue_reqs"),
		running:      gauge("sglang:num_running_reqs"),
		kvUsage:      gauge("sglang:token_usage"),
		blockSize:    infoLabel("sglang:cache_config_info", "page_size"),
		numGPUBlocks: infoLabel("sglang:cache_config_info", "num_pages"),
		promptTokens: gauge("sglang:prompt_tokens_total", "sglang:prompt_tokens"),
	},
	datastore.EngineTRTLLMServe: {
		waiting:      gauge("trtllm_num_requests_waiting"),
		running:      gauge("trtllm_num_requests_running"),
		kvUsage:      gauge("trtllm_kv_cache_utilization"),
		blockSize:    valueOf(gauge("trtllm_kv_cache_tokens_per_block")),
		numGPUBlocks: valueOf(gauge("trtllm_kv_cache_max_blocks")),
	},
	datastore.EngineTritonTensorRTLLM: {
		waiting:      where("nv_trt_llm_request_metrics", "request_type", "waiting"),
		running:      where("nv_trt_llm_request_metrics", "request_type", "scheduled"),
		kvUsage:      where("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "fraction"),
		blockSize:    valueOf(where("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "tokens_per")),
		numGPUBlocks: valueOf(where("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "max")),
	},
}

// mappingFor returns the mapping of an engine; empty means vLLM.
func mappingFor(engine string) (mapping, bool) {
	if engine == "" {
		engine = datastore.EngineVLLM
	}
	m, ok := engines[engine]
	return m, ok
}

// wants reports whether the mapping reads the family name (compared as
// bytes, so that no string is made for it).
func (m mapping) wants(name []byte) bool {
	if m.lora != "" && string(name) == m.lora {
		return true
	}
	for _, sig := range []signal{m.waiting, m.running, m.kvUsage, m.blockSize.signal, m.numGPUBlocks.signal, m.promptTokens, m.prefixQueries, m.prefixHits} {
		for _, sel := range sig {
			if string(name) == sel.name {
				return true
			}
		}
	}
	return false
}

// extract builds Metrics from parsed families. Several series of a count
// (one per model, rank, ...) add up; utilization takes the largest. It fails
// with ReasonMissingSeries when a required signal has no series.
func (m mapping) extract(fams map[string]*dto.MetricFamily) (*datastore.Metrics, error) {
	waiting, okW := sum(m.waiting.series(fams))
	running, okR := sum(m.running.series(fams))
	usage, okU := largest(m.kvUsage.series(fams))
	var missing []string
	for _, r := range []struct {
		ok  bool
		sig signal
	}{{okW, m.waiting}, {okR, m.running}, {okU, m.kvUsage}} {
		if !r.ok {
			missing = append(missing, r.sig.String())
		}
	}
	if len(missing) > 0 {
		return nil, &ScrapeError{Reason: ReasonMissingSeries,
			Err: fmt.Errorf("no series for %s", strings.Join(missing, ", "))}
	}
	out := &datastore.Metrics{
		WaitingQueueSize: count(waiting),
		RunningRequests:  count(running),
		KVCacheUsage:     min(max(usage, 0), 1),
		BlockSize:        m.blockSize.get(fams),
		NumGPUBlocks:     m.numGPUBlocks.get(fams),
		Tokens: datastore.TokenCounters{
			Prompt:        counter(m.promptTokens, fams),
			PrefixQueries: counter(m.prefixQueries, fams),
			PrefixHits:    counter(m.prefixHits, fams),
		},
	}
	if m.lora != "" {
		if s := newest(gauge(m.lora).series(fams)); s != nil {
			out.MaxActiveAdapters = atoi(labelValue(s, "max_lora"))
			out.ActiveAdapters = adapterSet(labelValue(s, "running_lora_adapters"))
			out.WaitingAdapters = adapterSet(labelValue(s, "waiting_lora_adapters"))
		}
	}
	return out, nil
}

// series returns the usable series of the first selector that has any.
func (sig signal) series(fams map[string]*dto.MetricFamily) []*dto.Metric {
	for _, sel := range sig {
		var out []*dto.Metric
		for _, s := range fams[sel.name].GetMetric() {
			if _, ok := value(s); ok && (sel.label == "" || labelValue(s, sel.label) == sel.value) {
				out = append(out, s)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// String names the signal for error messages, e.g. "a{k=v} or b".
func (sig signal) String() string {
	names := make([]string, len(sig))
	for i, sel := range sig {
		names[i] = sel.name
		if sel.label != "" {
			names[i] += "{" + sel.label + "=" + sel.value + "}"
		}
	}
	return strings.Join(names, " or ")
}

func (is intSignal) get(fams map[string]*dto.MetricFamily) int {
	series := is.series(fams)
	if is.label != "" {
		return atoi(labelValue(newest(series), is.label))
	}
	v, _ := largest(series)
	return count(v)
}

// value reads a gauge, counter or untyped sample; histograms, summaries and
// NaN do not count as values.
func value(s *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case s.Gauge != nil:
		v = s.Gauge.GetValue()
	case s.Counter != nil:
		v = s.Counter.GetValue()
	case s.Untyped != nil:
		v = s.Untyped.GetValue()
	default:
		return 0, false
	}
	return v, !math.IsNaN(v)
}

// counter sums a cumulative counter's series (one per model or engine
// rank); -1 when the server reports none.
func counter(sig signal, fams map[string]*dto.MetricFamily) float64 {
	if v, ok := sum(sig.series(fams)); ok {
		return v
	}
	return -1
}

func sum(series []*dto.Metric) (float64, bool) {
	var total float64
	for _, s := range series {
		v, _ := value(s)
		total += v
	}
	return total, len(series) > 0
}

func largest(series []*dto.Metric) (float64, bool) {
	best := math.Inf(-1)
	for _, s := range series {
		v, _ := value(s)
		best = max(best, v)
	}
	return best, len(series) > 0
}

// newest returns the series with the largest value: info gauges such as
// vllm:lora_requests_info carry the time of their last change as value, and
// a server may still expose older label sets.
func newest(series []*dto.Metric) *dto.Metric {
	var best *dto.Metric
	bestV := math.Inf(-1)
	for _, s := range series {
		if v, _ := value(s); best == nil || v > bestV {
			best, bestV = s, v
		}
	}
	return best
}

func labelValue(s *dto.Metric, name string) string {
	for _, lp := range s.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// count turns a gauge into a non-negative int; servers report counts as
// floats, and a wild value must not overflow.
func count(v float64) int {
	if !(v > 0) {
		return 0
	}
	return int(min(math.Round(v), math.MaxInt32))
}

// atoi reads an optional integer label; absent or malformed means 0,
// "unreported".
func atoi(s string) int {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// adapterSet splits a comma list of adapter names; always non-nil so that a
// server reporting LoRA with no adapters differs from one not reporting it.
func adapterSet(list string) map[string]struct{} {
	set := map[string]struct{}{}
	for name := range strings.SplitSeq(list, ",") {
		if name = strings.TrimSpace(name); name != "" {
			set[name] = struct{}{}
		}
	}
	return set
}
