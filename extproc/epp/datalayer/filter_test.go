package datalayer

import (
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// TestFamilyFilterKeepsWhatTheMappingReads: every engine's fixture gives
// the same metrics through the filter as without it, padded with families
// the mapping does not read (a histogram, another gauge, comments).
func TestFamilyFilterKeepsWhatTheMappingReads(t *testing.T) {
	const noise = "# HELP noise:latency_seconds Histogram.\n# TYPE noise:latency_seconds histogram\n" +
		"noise:latency_seconds_bucket{le=\"0.5\"} 3\nnoise:latency_seconds_bucket{le=\"+Inf\"} 4\n" +
		"noise:latency_seconds_sum 1.5\nnoise:latency_seconds_count 4\n\n# a comment\n" +
		"# TYPE go_goroutines gauge\ngo_goroutines 42\n"
	const after = "# HELP process_cpu_seconds_total CPU.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 7\n"
	for _, tc := range []struct{ engine, fixture string }{
		{datastore.EngineVLLM, "vllm.txt"}, {datastore.EngineVLLM, "vllm_old.txt"}, {datastore.EngineSGLang, "sglang.txt"},
		{datastore.EngineTRTLLMServe, "trtllm_serve.txt"}, {datastore.EngineTritonTensorRTLLM, "triton_trtllm.txt"},
	} {
		mp, _ := mappingFor(tc.engine)
		text := noise + fixture(t, tc.fixture) + after
		p1 := expfmt.NewTextParser(model.UTF8Validation)
		all, err := p1.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatalf("%s: %v", tc.fixture, err)
		}
		p2 := expfmt.NewTextParser(model.UTF8Validation)
		kept, err := p2.TextToMetricFamilies(newFamilyFilter(strings.NewReader(text), mp.wants))
		if err != nil {
			t.Fatalf("%s filtered: %v", tc.fixture, err)
		}
		want, err1 := mp.extract(all)
		got, err2 := mp.extract(kept)
		if fmt.Sprint(err1) != fmt.Sprint(err2) || !reflect.DeepEqual(want, got) {
			t.Errorf("%s: filtered %+v (%v), unfiltered %+v (%v)", tc.fixture, got, err2, want, err1)
		}
		for name := range kept {
			if !mp.wants([]byte(name)) {
				t.Errorf("%s: family %s passed the filter", tc.fixture, name)
			}
		}
		if _, ok := kept["noise:latency_seconds"]; ok || len(kept) >= len(all) {
			t.Errorf("%s: %d of %d families passed, the histogram among them: want fewer", tc.fixture, len(kept), len(all))
		}
	}
}

// TestFamilyFilterLines: what passes, line by line, including lines longer
// than the filter's buffer and text that is not the exposition format.
func TestFamilyFilterLines(t *testing.T) {
	want := func(name []byte) bool { return string(name) == "keep_me" }
	long := strings.Repeat("x", 40<<10)
	for _, tc := range []struct{ name, in, out string }{
		{"sample", "keep_me 1\ndrop_me 2\n", "keep_me 1\n"},
		{"labels", "keep_me{a=\"1\"} 1\ndrop_me{a=\"1\"} 2\n", "keep_me{a=\"1\"} 1\n"},
		{"help and type", "# HELP keep_me h\n# TYPE keep_me gauge\n# HELP drop_me h\n# TYPE drop_me gauge\n", "# HELP keep_me h\n# TYPE keep_me gauge\n"},
		{"comments and blank lines", "# just a comment\n\n  \nkeep_me 1\n", "keep_me 1\n"},
		{"a prefix of a wanted name", "keep_me_total 1\nkeep 2\n", ""},
		{"no final newline", "drop_me 1\nkeep_me 1", "keep_me 1"},
		{"long kept line", "keep_me{l=\"" + long + "\"} 1\ndrop_me 1\n", "keep_me{l=\"" + long + "\"} 1\n"},
		{"long dropped line", "drop_me{l=\"" + long + "\"} 1\nkeep_me 1\n", "keep_me 1\n"},
		{"not the format", "<html><body>moved</body></html>\ndrop_me 1\n", "<html><body>moved</body></html>\n"},
		{"a digit first", "9keep_me 1\n", "9keep_me 1\n"},
	} {
		got, err := io.ReadAll(newFamilyFilter(strings.NewReader(tc.in), want))
		if err != nil || string(got) != tc.out {
			t.Errorf("%s: got %.80q (%v), want %.80q", tc.name, got, err, tc.out)
		}
	}
}
