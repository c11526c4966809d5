package sim

import (
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// ttftBuckets spans sub-millisecond to long-queue TTFTs, in seconds.
var ttftBuckets = []float64{
	0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
	1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560,
}

// metrics holds the vLLM-named series of one Server. Counters and the
// histogram are updated as requests run; gauges are read at scrape time by
// Collect so that fake values can stand in for them.
//
// The token counters count tokens of the server's tokenizer, as vLLM's
// count the model's: the prefix-cache queries and hits when a request is
// admitted (all its prompt tokens, and those of its leading blocks found
// cached), the prompt tokens when its prefill is done (all of them, cached
// or not, as vLLM V1 counts them when a request's first token comes out),
// and the generation tokens as they become due: the first with the end of
// prefill, the others of a streamed answer one per inter-token latency,
// those of an answer written at once when its last one is due. A request
// whose client leaves early counts the tokens due before it left.
type metrics struct {
	registry *prometheus.Registry

	prefixQueries    prometheus.Counter
	prefixHits       prometheus.Counter
	promptTokens     prometheus.Counter
	generationTokens prometheus.Counter
	requestSuccess   prometheus.Counter
	ttft             prometheus.Histogram

	gauges *gaugeCollector
}

func newMetrics(s *Server) *metrics {
	labels := prometheus.Labels{"model_name": s.cfg.Model}
	m := &metrics{
		registry: prometheus.NewRegistry(),
		prefixQueries: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "vllm:prefix_cache_queries_total",
			Help:        "Prompt tokens looked up in the prefix cache.",
			ConstLabels: labels,
		}),
		prefixHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "vllm:prefix_cache_hits_total",
			Help:        "Prompt tokens found in the prefix cache.",
			ConstLabels: labels,
		}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "vllm:prompt_tokens_total",
			Help:        "Number of prefill tokens processed.",
			ConstLabels: labels,
		}),
		generationTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "vllm:generation_tokens_total",
			Help:        "Number of generation tokens processed.",
			ConstLabels: labels,
		}),
		// Generation always stops at the token limit, hence the one reason.
		requestSuccess: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "vllm:request_success_total",
			Help:        "Requests that finished successfully.",
			ConstLabels: prometheus.Labels{"model_name": s.cfg.Model, "finished_reason": finishLength},
		}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "vllm:time_to_first_token_seconds",
			Help:        "Time from arrival to first token, in simulated seconds.",
			Buckets:     ttftBuckets,
			ConstLabels: labels,
		}),
		gauges: newGaugeCollector(s, labels),
	}
	m.registry.MustRegister(m.prefixQueries, m.prefixHits, m.promptTokens, m.generationTokens,
		m.requestSuccess, m.ttft, m.gauges)
	return m
}

// gaugeCollector reports the state gauges, faked or measured.
type gaugeCollector struct {
	s                                               *Server
	waiting, running, kvUsage, cache, lora          *prometheus.Desc
	blockSizeLabel, numGPUBlocksLabel, maxLoRALabel string
}

func newGaugeCollector(s *Server, labels prometheus.Labels) *gaugeCollector {
	return &gaugeCollector{
		s: s,
		waiting: prometheus.NewDesc("vllm:num_requests_waiting",
			"Requests waiting to run.", nil, labels),
		running: prometheus.NewDesc("vllm:num_requests_running",
			"Requests running.", nil, labels),
		kvUsage: prometheus.NewDesc("vllm:kv_cache_usage_perc",
			"Fraction of KV cache blocks in use, 0 to 1.", nil, labels),
		cache: prometheus.NewDesc("vllm:cache_config_info",
			"KV cache configuration.", []string{"block_size", "num_gpu_blocks"}, labels),
		lora: prometheus.NewDesc("vllm:lora_requests_info",
			"Adapters of running and waiting requests; the value is the Unix time of the last change.",
			[]string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, labels),
		blockSizeLabel:    strconv.Itoa(s.cfg.BlockSize),
		numGPUBlocksLabel: strconv.Itoa(s.cache.capacity),
		maxLoRALabel:      strconv.Itoa(s.cfg.MaxLoRAs),
	}
}

func (g *gaugeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{g.waiting, g.running, g.kvUsage, g.cache, g.lora} {
		ch <- d
	}
}

func (g *gaugeCollector) Collect(ch chan<- prometheus.Metric) {
	v := g.s.reported()
	ch <- prometheus.MustNewConstMetric(g.waiting, prometheus.GaugeValue, float64(v.waiting))
	ch <- prometheus.MustNewConstMetric(g.running, prometheus.GaugeValue, float64(v.running))
	ch <- prometheus.MustNewConstMetric(g.kvUsage, prometheus.GaugeValue, v.kvUsage)
	ch <- prometheus.MustNewConstMetric(g.cache, prometheus.GaugeValue, 1, g.blockSizeLabel, g.numGPUBlocksLabel)
	ch <- prometheus.MustNewConstMetric(g.lora, prometheus.GaugeValue, float64(v.loraChanged.Unix()),
		g.maxLoRALabel, strings.Join(v.runningLoRAs, ","), strings.Join(v.waitingLoRAs, ","))
}
