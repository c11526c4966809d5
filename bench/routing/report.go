package main

import (
	"bufio"
	"fmt"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// percentile returns the nearest-rank p-quantile (0 < p ≤ 1) of sorted
// values: the smallest value with at least p of the values at or below it.
// It returns 0 for no values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p*float64(len(sorted)) - 1e-9))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func mean(v []time.Duration) time.Duration {
	if len(v) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range v {
		sum += d
	}
	return sum / time.Duration(len(v))
}

// table is a Markdown table; columns whose alignment is true are
// right-aligned.
type table struct {
	header []string
	right  []bool
	rows   [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) String() string {
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for i := range t.header {
			c := ""
			if i < len(cells) {
				c = cells[i]
			}
			b.WriteString(" " + strings.ReplaceAll(c, "|", `\|`) + " |")
		}
		b.WriteString("\n")
	}
	line(t.header)
	b.WriteString("|")
	for i := range t.header {
		if i < len(t.right) && t.right[i] {
			b.WriteString("---:|")
		} else {
			b.WriteString("---|")
		}
	}
	b.WriteString("\n")
	for _, r := range t.rows {
		line(r)
	}
	return b.String()
}

// ms formats a simulated duration in milliseconds.
func ms(d time.Duration) string {
	v := d.Seconds() * 1000
	if v < 100 {
		return strconv.FormatFloat(v, 'f', 1, 64) + " ms"
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + " ms"
}

// us formats a wall-clock duration in microseconds.
func us(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) + " µs" }

func pctString(f float64) string {
	if math.IsNaN(f) {
		return "-"
	}
	return strconv.FormatFloat(100*f, 'f', 1, 64) + "%"
}

// ratio formats a/b, or "-" when it is undefined.
func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "-"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64)
}

// promSamples parses Prometheus text exposition into name{labels} → value
// for the names wanted (all when wanted is empty); the key is the metric
// name without labels, samples of the same name are summed.
func promSamples(r io.Reader, wanted ...string) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if len(wanted) > 0 && !slices.Contains(wanted, name) {
			continue
		}
		if strings.HasPrefix(rest, "{") {
			// Label values may contain spaces or braces; skip to the closing
			// brace outside quotes.
			inQuote, end := false, -1
			for i := 1; i < len(rest); i++ {
				switch {
				case rest[i] == '\\' && inQuote:
					i++
				case rest[i] == '"':
					inQuote = !inQuote
				case rest[i] == '}' && !inQuote:
					end = i
				}
				if end >= 0 {
					break
				}
			}
			if end < 0 {
				continue
			}
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		out[name] += v
	}
	return out, sc.Err()
}

// series is one sample of Prometheus text exposition with its labels.
type series struct {
	name   string
	labels map[string]string
	value  float64
}

// promSeries parses Prometheus text exposition into its gauge, counter
// and untyped samples of the names wanted, labels and all.
func promSeries(r io.Reader, wanted ...string) ([]series, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation) // vLLM names have colons
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	var out []series
	for _, name := range wanted {
		for _, m := range fams[name].GetMetric() {
			s := series{name: name, labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.GetGauge() != nil:
				s.value = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				s.value = m.GetCounter().GetValue()
			case m.GetUntyped() != nil:
				s.value = m.GetUntyped().GetValue()
			default:
				continue
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// bytesString formats a byte count.
func bytesString(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}
