package childproc

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics reads the Prometheus endpoint at addr (host:port, /metrics)
// into "name{label="value",...}" → value, labels in the exposition's
// order; a family's series without labels is keyed by its name alone.
func Metrics(ctx context.Context, addr string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", addr, err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := name
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			}
		}
	}
	return out, nil
}

// Sum adds up the series of family name in metrics (as Metrics reads
// them).
func Sum(metrics map[string]float64, name string) float64 {
	total := 0.0
	for k, v := range metrics {
		if k == name || strings.HasPrefix(k, name+"{") {
			total += v
		}
	}
	return total
}
