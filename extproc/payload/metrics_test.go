package payload_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/extproc/payload"
)

// metricsRig is a payload processor with its metrics listener, configured
// by the YAML in config.
type metricsRig struct{ *rig }

func newMetricsRig(t *testing.T, config string) *metricsRig {
	t.Helper()
	path := filepath.Join(t.TempDir(), "payload.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return &metricsRig{serve(t, path, func(c *payload.Config) { c.Server.MetricsAddr = "127.0.0.1:0" })}
}

// exchange sends a request for model and an upstream response reporting
// usage, as one stream.
func (r *metricsRig) exchange(t *testing.T, model string) {
	t.Helper()
	r.exchangePrompt(t, model, "hi")
}

func (r *metricsRig) exchangePrompt(t *testing.T, model, prompt string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ex := r.client.Open(ctx)
	defer ex.Close()
	body := []byte(fmt.Sprintf(`{"model":%q,"prompt":%q}`, model, prompt))
	res, err := ex.RunRequest(extprocfilter.Request{Path: "/v1/completions", Body: [][]byte{body}})
	if err != nil {
		t.Fatal(err)
	}
	if res.LocalReply != nil {
		t.Fatalf("model %.40q: rejected with %d %s", model, res.LocalReply.Status, res.LocalReply.Body)
	}
	usage := []byte(`{"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)
	if _, err := ex.RunResponse(extprocfilter.Response{Headers: extprocfilter.Headers{{Key: "content-type", Value: "application/json"}}, Body: [][]byte{usage}}); err != nil {
		t.Fatal(err)
	}
}

// scrape reads /metrics from the processor's own listener.
func (r *metricsRig) scrape(t *testing.T) ([]byte, map[string]*dto.MetricFamily) {
	t.Helper()
	resp, err := http.Get("http://" + r.svc.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return raw, fams
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestMetricLabelsBoundedForClientModels floods the processor with
// distinct and long model names (allowed by a prefix and passed through):
// the tokens series stay the configured names plus "other", every label
// value is short, and /metrics does not grow with the flood.
func TestMetricLabelsBoundedForClientModels(t *testing.T) {
	long := strings.Repeat("x", 300)
	r := newMetricsRig(t, `models:
  bases:
  - name: llama
    adapters: [sql-lora, `+long+`]
  allow: [llama, sql-lora, gpt-4o, `+long+`, "free-*"]
pii:
- {name: `+long+`, detector: email, action: mask}
`)
	r.exchangePrompt(t, "llama", "mail me at a@example.com") // a rule name over the bound
	for _, m := range []string{"llama", "sql-lora", "gpt-4o"} {
		r.exchange(t, m)
	}
	before, _ := r.scrape(t)

	distinct, huge := 1000, 20
	if testing.Short() {
		distinct = 200
	}
	for i := range distinct {
		r.exchange(t, fmt.Sprintf("free-%d", i))
	}
	for i := range huge {
		// As long as a model name may be (1 KiB): longer ones are refused
		// before they reach the metrics.
		r.exchange(t, fmt.Sprintf("free-%02d-%s", i, strings.Repeat("y", 1024-len("free-00-"))))
	}
	r.exchange(t, long) // configured, but over the label bound
	after, fams := r.scrape(t)

	want := map[string]float64{"llama": 6, "sql-lora": 3, "gpt-4o": 3, "other": float64(3 * (distinct + huge + 1))}
	got := map[string]float64{}
	tokens := fams["infergate_payload_tokens_total"]
	for _, m := range tokens.GetMetric() {
		if labelOf(m, "type") == "prompt" {
			got[labelOf(m, "model")] = m.GetCounter().GetValue()
		}
	}
	if len(tokens.GetMetric()) != 2*len(want) || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%d tokens series, prompt tokens by model %v; want %d series, %v", len(tokens.GetMetric()), got, 2*len(want), want)
	}
	for name, fam := range fams {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if len(l.GetValue()) > 128 {
					t.Errorf("%s{%s} has a label value of %d bytes", name, l.GetName(), len(l.GetValue()))
				}
			}
		}
	}
	if masked := fams["infergate_payload_masked_total"].GetMetric(); len(masked) != 1 || labelOf(masked[0], "rule") != "other" {
		t.Errorf("masked_total series %v, want one with rule=\"other\"", masked)
	}
	// The Go and process collectors move a little between scrapes; the
	// flood itself must add nothing.
	if growth := len(after) - len(before); growth > 2<<10 {
		t.Errorf("/metrics grew by %d bytes (from %d) after %d distinct and %d huge model names", growth, len(before), distinct, huge)
	}
}

// TestMetricLabelsFollowReload: a model the configuration comes to name
// gets its own label from the next stream on; before, it was "other".
func TestMetricLabelsFollowReload(t *testing.T) {
	r := newMetricsRig(t, "models:\n  allow: [\"team-*\"]\n")
	r.exchange(t, "team-a")
	if err := os.WriteFile(r.cfg, []byte("models:\n  allow: [\"team-*\"]\n  bases: [{name: team-a}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.exchange(t, "team-a")
		_, fams := r.scrape(t)
		got := map[string]float64{}
		for _, m := range fams["infergate_payload_tokens_total"].GetMetric() {
			if labelOf(m, "type") == "prompt" {
				got[labelOf(m, "model")] = m.GetCounter().GetValue()
			}
		}
		if got["team-a"] > 0 {
			if got["other"] < 3 || len(got) != 2 {
				t.Errorf("prompt tokens by model %v; want team-a's and, from before the reload, other's", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no team-a series 5s after the reload: %v", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
