// Command benigncorpus writes the generated part of the benign corpus that
// inference/policy/benign_test.go runs the guardrails over to measure their
// false positives: ordinary numeric LLM traffic that holds no personal data.
//
//	go run ./hack/benigncorpus [-out inference/policy/testdata/benign]
//
// Everything is written under <out>/gen/. Every file has its own fixed seed
// and its own random number generator (splitmix64, implemented here so the
// output does not depend on the Go version), and times count from a fixed
// instant, so two runs write identical files. The numbers are random but
// the shapes are those of ordinary traffic: a row of a random matrix may
// read "123 45 6789", and that is the point, but no number is deliberately
// formatted as a social security number, a phone number, a payment card,
// an IBAN, an e-mail address or an IP address. Hosts are names, never
// addresses.
//
// The files (seed in brackets):
//
//   - gen/numpy_int_arrays.txt [101]: Python REPL sessions creating integer
//     arrays (randint, arange, reshape, argsort, bincount) and numpy's
//     printout of them: array([[ 512,   64, 2048], ...]) right-aligned as
//     numpy aligns them, with shape, dtype and sum lines.
//   - gen/numpy_float_arrays.txt [102]: the same for float arrays: whole
//     floats ("array([[ 512.,   64., 2048.]])"), four-decimal values padded
//     as numpy pads them, float32/float16 dtype suffixes, percentiles.
//   - gen/torch_shapes.txt [103]: PyTorch state-dict listings (parameter
//     name, torch.Size([...]), dtype), activation shapes of a forward pass
//     and tensor([...]) printouts of random weights.
//   - gen/matrices_plain.txt [104]: plain-text matrices of random integers
//     of one to four digits in the layouts people paste: space-separated,
//     aligned columns, tab-separated, MATLAB, LaTeX bmatrix, R print,
//     Mathematica lists and Markdown tables.
//   - gen/orders.csv [105]: an order-lines export (order number, SKU, date,
//     quantity, unit price, total, currency, warehouse, carrier tracking).
//   - gen/sensor_readings.csv [106]: a sensor log at one-minute steps
//     (timestamp, sensor id, temperature, humidity, pressure, latitude,
//     longitude, battery voltage).
//   - gen/inference_benchmark.csv [107]: LLM serving benchmark rows (model,
//     batch, sequence length, hidden size, latency percentiles, tokens/s).
//   - gen/app_logs.log [108]: application logs in six formats (RFC 3339
//     key=value, Go log, syslog with vLLM metrics, JSON lines, klog, Java
//     logback) with PIDs, ports, request ids, durations and latencies.
//   - gen/access_logs.log [109]: proxy access logs whose client field is a
//     host name, with status, bytes, upstream times and request ids.
//   - gen/events.jsonl [110]: JSON-lines usage events (ids, token counts,
//     latencies, prices in micro-dollars).
//   - gen/sequences.txt [111]: integer sequences and number lists:
//     Fibonacci, primes, squares, Collatz trajectories, random samples
//     sorted and unsorted, arithmetic progressions, linear equations.
//   - gen/hashes_ids.txt [112]: checksums (SHA-256, SHA-1, MD5 as hex),
//     base64 digests, git commits, UUIDs, ULID-like ids, image digests.
//   - gen/invoices.txt [113]: invoice and order summaries: invoice and
//     order numbers, SKUs, quantities, prices in several currencies and
//     tracking numbers of letters and digits.
//   - gen/dates_times.txt [114]: one instant per line in many date and
//     time formats (ISO 8601, RFC 1123, US and European dates, Unix seconds
//     and milliseconds, week dates, ordinal dates, durations).
//   - gen/versions.txt [115]: dependency and build listings with version
//     strings of two to four parts, build numbers and object identifiers.
//   - gen/coords_measurements.txt [116]: coordinates (decimal and DMS) and
//     measurements with units and tolerances.
//   - gen/lookup_tables.c [117]: C tables: a Q15 sine table, a CRC-32
//     table, a gamma table and int8 quantized weights.
//   - gen/inserts.sql [118]: SQL INSERT statements for products, orders
//     and stock movements (numeric ids, prices, dates; no people).
//   - gen/metrics.prom [119]: Prometheus exposition text with histogram
//     buckets, counters and gauges labelled by host name.
//   - gen/doc_NN.json [120+NN]: ten JSON documents that are not requests:
//     safetensors-style tensor indexes, tool arguments of tensor shapes and
//     arrays, histograms, confusion matrices, GeoJSON, benchmark results.
//   - gen/req_NNN.json [200+NNN]: a hundred complete request bodies in five
//     styles (NNN mod 5): 0, an OpenAI chat request whose tools have enum
//     schemas of sizes and resolutions and whose assistant tool call holds
//     a JSON arguments string of shapes and arrays; 1, an Anthropic
//     messages request with tool_use input and a tool_result of numbers;
//     2, a responses-API request with a function_call and its output; 3, a
//     completions request whose prompt is a numpy session; 4, a chat request
//     with content parts holding a matrix or a CSV excerpt.
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"log"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	out := flag.String("out", "inference/policy/testdata/benign", "corpus directory; files are written under its gen/ folder")
	flag.Parse()
	dir := filepath.Join(*out, "gen")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Fatal(err)
	}
	files := []genFile{
		{"numpy_int_arrays.txt", 101, numpyInts},
		{"numpy_float_arrays.txt", 102, numpyFloats},
		{"torch_shapes.txt", 103, torchShapes},
		{"matrices_plain.txt", 104, plainMatrices},
		{"orders.csv", 105, ordersCSV},
		{"sensor_readings.csv", 106, sensorCSV},
		{"inference_benchmark.csv", 107, benchmarkCSV},
		{"app_logs.log", 108, appLogs},
		{"access_logs.log", 109, accessLogs},
		{"events.jsonl", 110, eventsJSONL},
		{"sequences.txt", 111, sequences},
		{"hashes_ids.txt", 112, hashesIDs},
		{"invoices.txt", 113, invoices},
		{"dates_times.txt", 114, datesTimes},
		{"versions.txt", 115, versions},
		{"coords_measurements.txt", 116, coordsMeasurements},
		{"lookup_tables.c", 117, lookupTables},
		{"inserts.sql", 118, sqlInserts},
		{"metrics.prom", 119, promMetrics},
	}
	for n := 1; n <= 10; n++ {
		files = append(files, genFile{fmt.Sprintf("doc_%02d.json", n), uint64(120 + n), func(r *rng) []byte { return jsonDoc(r, n) }})
	}
	for n := 1; n <= 100; n++ {
		files = append(files, genFile{fmt.Sprintf("req_%03d.json", n), uint64(200 + n), func(r *rng) []byte { return request(r, n) }})
	}
	for _, f := range files {
		data := f.gen(newRNG(f.seed))
		if len(data) > 190<<10 {
			log.Fatalf("%s: %d bytes, over the corpus's 200 KB limit per file", f.name, len(data))
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), data, 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

// genFile is one generated file: its name under gen/, its seed and what
// writes it.
type genFile struct {
	name string
	seed uint64
	gen  func(*rng) []byte
}

// rng is splitmix64: small, fast and fully specified, so the corpus is the
// same whatever Go version writes it.
type rng struct{ s uint64 }

func newRNG(seed uint64) *rng { return &rng{s: seed * 0x2545f4914f6cdd1d} }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn returns a number in [0, n).
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }

// between returns a number in [lo, hi].
func (r *rng) between(lo, hi int) int { return lo + r.intn(hi-lo+1) }

// float returns a number in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) / (1 << 53) }

// normal returns an approximately standard normal number (the sum of
// twelve uniforms, minus six): arithmetic only, so identical everywhere.
func (r *rng) normal() float64 {
	s := 0.0
	for range 12 {
		s += r.float()
	}
	return s - 6
}

func (r *rng) chance(p float64) bool { return r.float() < p }

func pick[T any](r *rng, xs ...T) T { return xs[r.intn(len(xs))] }

// magnitude returns a non-negative integer of one to four digits, small
// ones more often, as the entries of ordinary matrices are.
func (r *rng) magnitude() int {
	switch d := r.intn(10); {
	case d < 3:
		return r.intn(10)
	case d < 6:
		return r.between(10, 99)
	case d < 8:
		return r.between(100, 999)
	default:
		return r.between(1000, 9999)
	}
}

func (r *rng) hex(n int) string {
	const digits = "0123456789abcdef"
	b := make([]byte, n)
	for i := range b {
		b[i] = digits[r.intn(16)]
	}
	return string(b)
}

func (r *rng) bytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.next())
	}
	return b
}

// uuid returns a random (version 4) UUID.
func (r *rng) uuid() string {
	b := r.bytes(16)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := fmt.Sprintf("%x", b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// ulid returns a ULID-like id: 26 characters of Crockford's base32.
func (r *rng) ulid() string {
	const alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
	b := make([]byte, 26)
	b[0] = alphabet[r.intn(8)]
	for i := 1; i < len(b); i++ {
		b[i] = alphabet[r.intn(32)]
	}
	return string(b)
}

// alnum returns n characters of letters and digits.
func (r *rng) alnum(n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.intn(len(alphabet))]
	}
	return string(b)
}

// upperAlnum returns n characters of upper-case letters and digits.
func (r *rng) upperAlnum(n int) string {
	const alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.intn(len(alphabet))]
	}
	return string(b)
}

func (r *rng) digits(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('0' + r.intn(10))
	}
	return string(b)
}

// epoch is where every generated clock starts: 2024-03-04 08:00:00 UTC.
var epoch = time.Date(2024, 3, 4, 8, 0, 0, 0, time.UTC)

// clock is a monotonic fake clock.
type clock struct {
	t time.Time
	r *rng
}

// tick advances the clock by up to maxMillis milliseconds (and some
// microseconds) and returns it.
func (c *clock) tick(maxMillis int) time.Time {
	c.t = c.t.Add(time.Duration(c.r.intn(maxMillis*1000)+1) * time.Microsecond)
	return c.t
}

var (
	hosts = []string{"api-gw-1.prod.internal", "api-gw-2.prod.internal", "inference-3.us-east.internal", "inference-7.us-east.internal",
		"inference-11.eu-west.internal", "worker-12", "worker-04", "batch-runner-03", "edge-proxy-2.example.net", "db-primary.internal",
		"cache-4.internal", "scheduler-0", "tokenizer-svc-1", "embedder-2.eu-west.internal"}
	shortHosts = []string{"api-gw-1", "api-gw-2", "inference-3", "inference-7", "inference-11", "worker-12", "worker-04", "batch-runner-03",
		"edge-proxy-2", "db-primary", "cache-4", "scheduler-0"}
	models = []string{"llama-3-8b-instruct", "llama-3-70b-instruct", "mistral-7b-instruct", "qwen2-7b-instruct", "sql-lora", "food-review",
		"gemma-2-9b-it", "phi-3-mini-4k"}
	paths = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/responses", "/v1/messages",
		"/healthz", "/metrics", "/v1/chat/completions?stream=true"}
)

// ---------------------------------------------------------------- numpy

// numpyArray prints a 1-D or 2-D array as numpy does: every element
// right-aligned to the widest, ", " between them, rows on their own lines
// indented under the first.
func numpyArray(prefix string, rows [][]string, oneD bool, suffix string) string {
	width := 0
	for _, row := range rows {
		for _, v := range row {
			width = max(width, len(v))
		}
	}
	var sb strings.Builder
	sb.WriteString(prefix + "(")
	indent := strings.Repeat(" ", len(prefix)+1)
	if oneD {
		// numpy wraps at 75 columns, continuing under the first element.
		sb.WriteString("[")
		col := len(prefix) + 2
		for j, v := range rows[0] {
			word := strings.Repeat(" ", width-len(v)) + v
			if j > 0 {
				if col+2+len(word)+2 > 75 {
					sb.WriteString(",\n" + indent + " ")
					col = len(indent) + 1
				} else {
					sb.WriteString(", ")
					col += 2
				}
			}
			sb.WriteString(word)
			col += len(word)
		}
		sb.WriteString("]")
	} else {
		sb.WriteString("[")
		for i, row := range rows {
			if i > 0 {
				sb.WriteString(",\n" + indent + " ")
			}
			sb.WriteString("[")
			for j, v := range row {
				if j > 0 {
					sb.WriteString(", ")
				}
				sb.WriteString(strings.Repeat(" ", width-len(v)) + v)
			}
			sb.WriteString("]")
		}
		sb.WriteString("]")
	}
	if suffix != "" {
		sb.WriteString(", " + suffix)
	}
	sb.WriteString(")")
	return sb.String()
}

func intRows(r *rng, n, m, lo, hi int) ([][]string, [][]int) {
	rows := make([][]string, n)
	vals := make([][]int, n)
	for i := range rows {
		for range m {
			v := r.between(lo, hi)
			vals[i] = append(vals[i], v)
			rows[i] = append(rows[i], strconv.Itoa(v))
		}
	}
	return rows, vals
}

func numpyInts(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("# Python 3.11.8 / numpy 1.26.4 interactive sessions, copied from a notebook scratch pad\n\n")
	for s := 0; sb.Len() < 40<<10; s++ {
		fmt.Fprintf(&sb, "# --- session %d ---\n", s+1)
		sb.WriteString(">>> import numpy as np\n")
		fmt.Fprintf(&sb, ">>> rng = np.random.default_rng(%d)\n", r.between(0, 9999))
		n, m := r.between(2, 6), r.between(3, 8)
		hi := pick(r, 10, 100, 1000, 10000)
		fmt.Fprintf(&sb, ">>> x = rng.integers(0, %d, size=(%d, %d))\n>>> x\n", hi, n, m)
		rows, vals := intRows(r, n, m, 0, hi-1)
		sb.WriteString(numpyArray("array", rows, false, "") + "\n")
		fmt.Fprintf(&sb, ">>> x.shape\n(%d, %d)\n>>> x.dtype\ndtype('int64')\n", n, m)
		total := 0
		colSums := make([]string, m)
		for j := range m {
			c := 0
			for i := range n {
				c += vals[i][j]
			}
			total += c
			colSums[j] = strconv.Itoa(c)
		}
		fmt.Fprintf(&sb, ">>> x.sum()\n%d\n>>> x.sum(axis=0)\n%s\n", total, numpyArray("array", [][]string{colSums}, true, ""))
		switch r.intn(5) {
		case 0:
			k := r.between(8, 30)
			start, step := r.between(0, 50), pick(r, 1, 2, 4, 8, 16, 64)
			fmt.Fprintf(&sb, ">>> np.arange(%d, %d, %d)\n", start, start+k*step, step)
			row := make([]string, k)
			for i := range row {
				row[i] = strconv.Itoa(start + i*step)
			}
			sb.WriteString(numpyArray("array", [][]string{row}, true, "") + "\n")
		case 1:
			a, b := r.between(2, 4), r.between(2, 6)
			fmt.Fprintf(&sb, ">>> y = np.arange(%d).reshape(%d, %d)\n>>> y\n", a*b, a, b)
			rows := make([][]string, a)
			for i := range rows {
				for j := range b {
					rows[i] = append(rows[i], strconv.Itoa(i*b+j))
				}
			}
			sb.WriteString(numpyArray("array", rows, false, "") + "\n")
			fmt.Fprintf(&sb, ">>> y.T.shape\n(%d, %d)\n", b, a)
		case 2:
			k := r.between(6, 14)
			row, _ := intRows(r, 1, k, 0, 9999)
			fmt.Fprintf(&sb, ">>> z = np.array([%s])\n", strings.Join(row[0], ", "))
			idx := make([]int, k)
			for i := range idx {
				idx[i] = i
			}
			sort.SliceStable(idx, func(a, b int) bool {
				va, _ := strconv.Atoi(row[0][idx[a]])
				vb, _ := strconv.Atoi(row[0][idx[b]])
				return va < vb
			})
			is := make([]string, k)
			for i, v := range idx {
				is[i] = strconv.Itoa(v)
			}
			sb.WriteString(">>> np.argsort(z)\n" + numpyArray("array", [][]string{is}, true, "") + "\n")
		case 3:
			k := r.between(5, 10)
			counts := make([]string, k)
			for i := range counts {
				counts[i] = strconv.Itoa(r.between(0, 400))
			}
			fmt.Fprintf(&sb, ">>> np.bincount(labels, minlength=%d)\n%s\n", k, numpyArray("array", [][]string{counts}, true, ""))
		default:
			dt := pick(r, "int32", "int16", "uint8", "uint16")
			lim := map[string]int{"int32": 99999, "int16": 32767, "uint8": 255, "uint16": 65535}[dt]
			a, b := r.between(2, 4), r.between(3, 6)
			rows, _ := intRows(r, a, b, 0, lim)
			fmt.Fprintf(&sb, ">>> w = rng.integers(0, %d, size=(%d, %d), dtype=np.%s)\n>>> w\n", lim+1, a, b, dt)
			sb.WriteString(numpyArray("array", rows, false, "dtype="+dt) + "\n")
			fmt.Fprintf(&sb, ">>> w.nbytes\n%d\n", a*b*map[string]int{"int32": 4, "int16": 2, "uint8": 1, "uint16": 2}[dt])
		}
		sb.WriteString("\n")
	}
	return []byte(sb.String())
}

// maxprec formats floats as numpy's default "maxprec" float mode: each
// with as few decimals as it needs (at most prec), then padded on the
// right to the most any needs; whole floats end in ".".
func maxprec(vals []float64, prec int) []string {
	strs := make([]string, len(vals))
	frac := 0
	for i, v := range vals {
		s := strconv.FormatFloat(v, 'f', prec, 64)
		s = strings.TrimRight(s, "0")
		strs[i] = s
		frac = max(frac, len(s)-strings.IndexByte(s, '.')-1)
	}
	for i, s := range strs {
		f := len(s) - strings.IndexByte(s, '.') - 1
		strs[i] = s + strings.Repeat(" ", frac-f)
	}
	return strs
}

func numpyFloats(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("# numpy float printing, checked while writing a tutorial on dtypes (numpy 1.26.4)\n\n")
	for s := 0; sb.Len() < 40<<10; s++ {
		fmt.Fprintf(&sb, "# --- example %d ---\n", s+1)
		n, m := r.between(1, 5), r.between(2, 7)
		switch r.intn(4) {
		case 0: // whole floats
			vals := make([]float64, n*m)
			for i := range vals {
				vals[i] = float64(pick(r, 1, 2, 3, 8, 16, 32, 64, 96, 128, 256, 384, 512, 768, 1024, 2048, 4096, r.magnitude()))
			}
			strs := maxprec(vals, 4)
			fmt.Fprintf(&sb, ">>> dims = np.array(shapes, dtype=float)  # %d layers\n>>> dims\n", n)
			sb.WriteString(numpyArray("array", chunk(strs, m), false, "") + "\n")
		case 1: // four decimals
			vals := make([]float64, n*m)
			for i := range vals {
				vals[i] = math.Round(r.normal()*1e4) / 1e4
			}
			fmt.Fprintf(&sb, ">>> w = rng.standard_normal((%d, %d))\n>>> np.round(w, 4)\n", n, m)
			sb.WriteString(numpyArray("array", chunk(maxprec(vals, 4), m), false, "") + "\n")
		case 2: // float32 with a dtype suffix
			vals := make([]float64, n*m)
			scale := pick(r, 1.0, 10.0, 100.0, 1000.0)
			for i := range vals {
				vals[i] = math.Round(r.float()*scale*1e3) / 1e3
			}
			dt := pick(r, "float32", "float16")
			fmt.Fprintf(&sb, ">>> a = (rng.random((%d, %d)) * %g).astype(np.%s)\n>>> a\n", n, m, scale, dt)
			sb.WriteString(numpyArray("array", chunk(maxprec(vals, 3), m), false, "dtype="+dt) + "\n")
			fmt.Fprintf(&sb, ">>> a.shape, a.itemsize\n((%d, %d), %d)\n", n, m, map[string]int{"float32": 4, "float16": 2}[dt])
		default: // percentiles and statistics
			k := r.between(4, 9)
			qs := []float64{}
			q := []string{}
			base := r.float() * 100
			v := base
			for i := range k {
				v += r.float() * 40
				qs = append(qs, math.Round(v*100)/100)
				q = append(q, strconv.Itoa(10*(i+1)))
			}
			fmt.Fprintf(&sb, ">>> np.percentile(latencies_ms, [%s])\n", strings.Join(q, ", "))
			sb.WriteString(numpyArray("array", [][]string{maxprec(qs, 2)}, true, "") + "\n")
			lo, hi := qs[0], qs[len(qs)-1]
			fmt.Fprintf(&sb, ">>> latencies_ms.mean(), latencies_ms.std()\n(%.6f, %.6f)\n", (lo+hi)/2+r.normal()*(hi-lo)/20, (hi-lo)/3*(0.8+r.float()*0.4))
		}
		sb.WriteString("\n")
	}
	return []byte(sb.String())
}

func chunk(s []string, m int) [][]string {
	var out [][]string
	for len(s) > 0 {
		k := min(m, len(s))
		out, s = append(out, s[:k]), s[k:]
	}
	return out
}

// ---------------------------------------------------------------- torch

func torchShapes(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("# state_dict listings and forward-pass shapes printed while porting checkpoints (torch 2.3.1)\n\n")
	for s := 0; sb.Len() < 36<<10; s++ {
		hidden := pick(r, 512, 768, 1024, 2048, 3072, 4096)
		headDim := pick(r, 64, 128)
		heads := hidden / headDim
		kvHeads := pick(r, heads, heads/4, heads/2)
		inter := pick(r, hidden*4, hidden*8/3/64*64, 11008, 14336)
		vocab := pick(r, 32000, 32768, 50257, 128256, 151936)
		layers := r.between(2, 4)
		dtype := pick(r, "torch.bfloat16", "torch.float16", "torch.float32")
		fmt.Fprintf(&sb, ">>> sd = torch.load(\"checkpoint-%d/pytorch_model.bin\", map_location=\"cpu\")\n", r.between(500, 90000))
		fmt.Fprintf(&sb, ">>> for k, v in list(sd.items())[:%d]:\n...     print(f\"{k:48s} {v.shape} {v.dtype}\")\n...\n", 2+layers*9)
		line := func(name string, dims ...int) {
			ds := make([]string, len(dims))
			for i, d := range dims {
				ds[i] = strconv.Itoa(d)
			}
			fmt.Fprintf(&sb, "%-48s torch.Size([%s]) %s\n", name, strings.Join(ds, ", "), dtype)
		}
		line("model.embed_tokens.weight", vocab, hidden)
		for l := range layers {
			p := fmt.Sprintf("model.layers.%d.", l)
			line(p+"self_attn.q_proj.weight", heads*headDim, hidden)
			line(p+"self_attn.k_proj.weight", kvHeads*headDim, hidden)
			line(p+"self_attn.v_proj.weight", kvHeads*headDim, hidden)
			line(p+"self_attn.o_proj.weight", hidden, heads*headDim)
			line(p+"mlp.gate_proj.weight", inter, hidden)
			line(p+"mlp.up_proj.weight", inter, hidden)
			line(p+"mlp.down_proj.weight", hidden, inter)
			line(p+"input_layernorm.weight", hidden)
			line(p+"post_attention_layernorm.weight", hidden)
		}
		line("lm_head.weight", vocab, hidden)
		batch, seq := pick(r, 1, 2, 4, 8, 16, 32), pick(r, 128, 256, 512, 1024, 2048, 4096)
		fmt.Fprintf(&sb, "\n# forward pass, batch=%d seq_len=%d\n", batch, seq)
		fmt.Fprintf(&sb, "input_ids        torch.Size([%d, %d])\n", batch, seq)
		fmt.Fprintf(&sb, "hidden_states    torch.Size([%d, %d, %d])\n", batch, seq, hidden)
		fmt.Fprintf(&sb, "query_states     torch.Size([%d, %d, %d, %d])\n", batch, heads, seq, headDim)
		fmt.Fprintf(&sb, "key_states       torch.Size([%d, %d, %d, %d])\n", batch, kvHeads, seq, headDim)
		fmt.Fprintf(&sb, "attn_weights     torch.Size([%d, %d, %d, %d])\n", batch, heads, seq, seq)
		fmt.Fprintf(&sb, "mlp_intermediate torch.Size([%d, %d, %d])\n", batch, seq, inter)
		fmt.Fprintf(&sb, "logits           torch.Size([%d, %d, %d])\n", batch, seq, vocab)
		a, b := r.between(2, 4), r.between(3, 6)
		fmt.Fprintf(&sb, ">>> sd[\"model.layers.0.input_layernorm.weight\"][:%d]\n", b)
		vals := make([]string, b)
		for i := range vals {
			vals[i] = fmt.Sprintf("%.4f", 1+r.normal()*0.05)
		}
		fmt.Fprintf(&sb, "tensor([%s], dtype=%s)\n", strings.Join(vals, ", "), dtype)
		fmt.Fprintf(&sb, ">>> torch.randn(%d, %d)\n", a, b)
		rows := make([]string, a)
		for i := range rows {
			vs := make([]string, b)
			for j := range vs {
				vs[j] = fmt.Sprintf("%7.4f", r.normal())
			}
			rows[i] = "[" + strings.Join(vs, ", ") + "]"
		}
		fmt.Fprintf(&sb, "tensor([%s])\n", strings.Join(rows, ",\n        "))
		params := vocab*hidden*2 + layers*(2*heads*headDim*hidden+2*kvHeads*headDim*hidden+3*inter*hidden+2*hidden)
		fmt.Fprintf(&sb, ">>> sum(p.numel() for p in sd.values())\n%d\n\n", params)
	}
	return []byte(sb.String())
}

// ---------------------------------------------------------------- matrices

func plainMatrices(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("Matrices pasted into prompts (exercise sheets, debugging output, spreadsheet copies).\n\n")
	for s := 0; sb.Len() < 60<<10; s++ {
		n, m := r.between(2, 6), r.between(2, 7)
		vals := make([][]int, n)
		strs := make([][]string, n)
		width := 0
		for i := range vals {
			for range m {
				v := r.magnitude()
				if r.chance(0.1) {
					v = -v
				}
				vals[i] = append(vals[i], v)
				strs[i] = append(strs[i], strconv.Itoa(v))
				width = max(width, len(strconv.Itoa(v)))
			}
		}
		name := string(rune('A' + s%26))
		switch r.intn(8) {
		case 0:
			fmt.Fprintf(&sb, "Matrix %s (%dx%d):\n", name, n, m)
			for _, row := range strs {
				sb.WriteString(strings.Join(row, " ") + "\n")
			}
		case 1:
			fmt.Fprintf(&sb, "%s =\n", name)
			for _, row := range strs {
				for j, v := range row {
					if j > 0 {
						sb.WriteString(" ")
					}
					fmt.Fprintf(&sb, "%*s", width+1, v)
				}
				sb.WriteString("\n")
			}
		case 2:
			fmt.Fprintf(&sb, "Sheet %d, range B2:%c%d (tab-separated)\n", s+1, 'B'+rune(m-1), n+1)
			for _, row := range strs {
				sb.WriteString(strings.Join(row, "\t") + "\n")
			}
		case 3:
			rows := make([]string, n)
			for i, row := range strs {
				rows[i] = strings.Join(row, " ")
			}
			fmt.Fprintf(&sb, ">> %s = [%s];\n>> size(%s)\nans =\n     %d     %d\n", name, strings.Join(rows, "; "), name, n, m)
		case 4:
			sb.WriteString("\\[\n" + name + " = \\begin{bmatrix}\n")
			for i, row := range strs {
				sb.WriteString("  " + strings.Join(row, " & "))
				if i < n-1 {
					sb.WriteString(" \\\\")
				}
				sb.WriteString("\n")
			}
			sb.WriteString("\\end{bmatrix}\n\\]\n")
		case 5:
			fmt.Fprintf(&sb, "> %s <- matrix(c(...), nrow = %d, byrow = TRUE)\n> %s\n", name, n, name)
			sb.WriteString("    ")
			for j := range m {
				fmt.Fprintf(&sb, "%*s", width+1, fmt.Sprintf("[,%d]", j+1))
			}
			sb.WriteString("\n")
			for i, row := range strs {
				fmt.Fprintf(&sb, "%-4s", fmt.Sprintf("[%d,]", i+1))
				for _, v := range row {
					fmt.Fprintf(&sb, "%*s", max(width, 4)+1, v)
				}
				sb.WriteString("\n")
			}
		case 6:
			rows := make([]string, n)
			for i, row := range strs {
				rows[i] = "{" + strings.Join(row, ", ") + "}"
			}
			fmt.Fprintf(&sb, "In[%d]:= %s = {%s};\nIn[%d]:= Dimensions[%s]\nOut[%d]= {%d, %d}\n", s+1, strings.ToLower(name), strings.Join(rows, ", "), s+2, strings.ToLower(name), s+2, n, m)
		default:
			sb.WriteString("| |")
			for j := range m {
				fmt.Fprintf(&sb, " c%d |", j+1)
			}
			sb.WriteString("\n|---|" + strings.Repeat("---|", m) + "\n")
			for i, row := range strs {
				fmt.Fprintf(&sb, "| r%d | %s |\n", i+1, strings.Join(row, " | "))
			}
		}
		if r.chance(0.4) {
			tr := 0
			for i := range min(n, m) {
				tr += vals[i][i]
			}
			fmt.Fprintf(&sb, "trace = %d\n", tr)
		}
		if r.chance(0.3) {
			sums := make([]string, n)
			for i := range vals {
				t := 0
				for _, v := range vals[i] {
					t += v
				}
				sums[i] = strconv.Itoa(t)
			}
			fmt.Fprintf(&sb, "row sums: %s\n", strings.Join(sums, " "))
		}
		sb.WriteString("\n")
	}
	return []byte(sb.String())
}

// ---------------------------------------------------------------- CSV

func ordersCSV(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("order_no,line,sku,order_date,qty,unit_price,line_total,currency,warehouse,carrier,tracking_no\n")
	c := clock{epoch.AddDate(0, -2, 0), r}
	order := 1004300
	skus := []string{"TSH-BLK-M", "TSH-WHT-L", "MUG-350-RED", "CBL-USBC-2M", "KBD-ISO-DE", "MSE-WL-GRY", "NB-A5-DOT", "PEN-GEL-07",
		"LMP-DSK-LED", "BAG-TOTE-NAT", "BTL-750-STL", "HDP-OE-BLK"}
	currencies := []string{"USD", "EUR", "GBP", "CHF", "JPY", "CAD"}
	carriers := []string{"DHL", "UPS", "FedEx", "PostNL", "Royal Mail", "DPD"}
	for sb.Len() < 40<<10 {
		order += r.between(1, 17)
		t := c.tick(3 * 3600 * 1000)
		cur := pick(r, currencies...)
		carrier := pick(r, carriers...)
		wh := fmt.Sprintf("WH-%02d", r.between(1, 12))
		track := fmt.Sprintf("%s%s", pick(r, "JD", "1Z", "CX", "RR", "LX"), r.upperAlnum(r.between(12, 16)))
		for line := 1; line <= r.between(1, 4); line++ {
			qty := r.between(1, 12)
			price := float64(r.between(199, 24999)) / 100
			if cur == "JPY" {
				price = float64(r.between(300, 30000))
			}
			sku := fmt.Sprintf("%s-%04d", pick(r, skus...), r.between(1, 9999))
			fmt.Fprintf(&sb, "SO-%d,%d,%s,%s,%d,%.2f,%.2f,%s,%s,%s,%s\n", order, line, sku, t.Format("2006-01-02"), qty, price, price*float64(qty), cur, wh, carrier, track)
		}
	}
	return []byte(sb.String())
}

func sensorCSV(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("timestamp,sensor_id,temp_c,rh_pct,pressure_hpa,lat,lon,battery_v\n")
	type sensor struct {
		id       string
		lat, lon float64
		temp     float64
	}
	var sensors []sensor
	for i := range 6 {
		sensors = append(sensors, sensor{fmt.Sprintf("env-%03d", 10+i*7), 40 + r.float()*20, -10 + r.float()*40, 8 + r.float()*15})
	}
	t := epoch
	for sb.Len() < 40<<10 {
		t = t.Add(time.Minute)
		for i := range sensors {
			s := &sensors[i]
			s.temp += r.normal() * 0.1
			fmt.Fprintf(&sb, "%s,%s,%.2f,%.1f,%.1f,%.5f,%.5f,%.3f\n", t.Format(time.RFC3339), s.id, s.temp, 40+r.float()*30,
				1000+r.normal()*6, s.lat, s.lon, 3.3+r.float()*0.9)
		}
	}
	return []byte(sb.String())
}

func benchmarkCSV(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("run_id,model,gpu,tp,batch,seq_len,hidden,prompt_tokens,output_tokens,ttft_ms_p50,ttft_ms_p99,itl_ms_p50,itl_ms_p99,tokens_per_s,gpu_mem_gib\n")
	for run := 1; sb.Len() < 26<<10; run++ {
		model := pick(r, models...)
		hidden := map[string]int{"llama-3-8b-instruct": 4096, "llama-3-70b-instruct": 8192, "mistral-7b-instruct": 4096, "qwen2-7b-instruct": 3584,
			"sql-lora": 4096, "food-review": 4096, "gemma-2-9b-it": 3584, "phi-3-mini-4k": 3072}[model]
		batch := pick(r, 1, 2, 4, 8, 16, 32, 64, 128, 256)
		seq := pick(r, 128, 256, 512, 1024, 2048, 4096, 8192)
		ttft := 20 + float64(seq)*0.05*(1+r.float()) + float64(batch)*0.8
		itl := 8 + float64(batch)*0.15 + r.float()*4
		fmt.Fprintf(&sb, "%d,%s,%s,%d,%d,%d,%d,%d,%d,%.1f,%.1f,%.2f,%.2f,%.1f,%.2f\n", run, model, pick(r, "A100-80GB", "H100-80GB", "L4", "A10G"),
			pick(r, 1, 2, 4, 8), batch, seq, hidden, seq*batch, r.between(64, 1024)*batch, ttft, ttft*(1.5+r.float()), itl, itl*(1.8+r.float()),
			float64(batch)*1000/itl, 20+r.float()*58)
	}
	return []byte(sb.String())
}

// ---------------------------------------------------------------- logs

func appLogs(r *rng) []byte {
	var sb strings.Builder
	c := clock{epoch, r}
	pids := []int{r.between(1000, 65000), r.between(1000, 65000), r.between(1000, 65000)}
	for sb.Len() < 50<<10 {
		t := c.tick(900)
		host := pick(r, hosts...)
		switch r.intn(6) {
		case 0:
			status := pick(r, 200, 200, 200, 200, 201, 400, 403, 404, 413, 429, 500, 503)
			fmt.Fprintf(&sb, "%s %-5s router request completed method=%s path=%s status=%d dur=%.1fms bytes_in=%d bytes_out=%d req_id=%s host=%s\n",
				t.Format("2006-01-02T15:04:05.000Z07:00"), pick(r, "INFO", "INFO", "INFO", "WARN"), pick(r, "POST", "POST", "GET"),
				pick(r, paths...), status, r.float()*2000, r.between(200, 60000), r.between(100, 90000), r.hex(32), host)
		case 1:
			fmt.Fprintf(&sb, "%s worker %d: processed batch %d in %.3fs (%d items, %d retries)\n", t.Format("2006/01/02 15:04:05"),
				r.between(1, 32), r.between(1000, 99999), r.float()*5, r.between(1, 512), r.intn(4))
		case 2:
			fmt.Fprintf(&sb, "%s %s vllm[%d]: INFO %s metrics.py:%d] Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Swapped: %d reqs, Pending: %d reqs, GPU KV cache usage: %.1f%%, CPU KV cache usage: %.1f%%.\n",
				t.Format(time.Stamp), pick(r, shortHosts...), pick(r, pids...), t.Format("01-02 15:04:05"), 341, r.float()*5000, r.float()*3000,
				r.between(0, 256), 0, r.between(0, 40), r.float()*100, 0.0)
		case 3:
			fmt.Fprintf(&sb, `{"ts":%.3f,"level":"%s","logger":"scheduler","msg":"%s","batch":%d,"tokens":%d,"latency_ms":%.2f,"queue_depth":%d,"host":"%s","trace_id":"%s"}`+"\n",
				float64(t.UnixMicro())/1e6, pick(r, "info", "debug", "warn"), pick(r, "batch scheduled", "batch done", "kv cache evicted", "prefill chunk"),
				r.between(1, 99999), r.between(16, 32768), r.float()*800, r.between(0, 120), host, r.hex(32))
		case 4:
			fmt.Fprintf(&sb, "I%s %7d %s] \"Reconciled\" pool=\"%s/%s\" replicas=%d ready=%d generation=%d duration=\"%.1fms\"\n",
				t.Format("0102 15:04:05.000000"), pick(r, pids...), pick(r, "controller.go:214", "reconciler.go:88", "pool.go:311"),
				pick(r, "default", "inference", "staging"), pick(r, models...), r.between(1, 16), r.between(0, 16), r.between(1, 900), r.float()*40)
		default:
			fmt.Fprintf(&sb, "%s [pool-%d-thread-%d] %-5s c.e.b.%s - %s\n", t.Format("2006-01-02 15:04:05,000"), r.between(1, 8), r.between(1, 32),
				pick(r, "INFO", "WARN", "DEBUG"), pick(r, "RetryPolicy", "BatchWriter", "HttpClient", "CacheLoader"),
				pick(r,
					fmt.Sprintf("attempt %d/5 failed after %d ms, backing off %d ms", r.between(1, 5), r.between(100, 5000), r.between(500, 8000)),
					fmt.Sprintf("flushed %d rows to partition %d in %d ms", r.between(1, 50000), r.between(0, 63), r.between(1, 900)),
					fmt.Sprintf("connection to %s:%d re-established (pool size %d/%d)", pick(r, hosts...), pick(r, 5432, 6379, 8443, 9092, 27017), r.between(1, 64), 64),
					fmt.Sprintf("cache hit ratio %.3f over %d lookups", r.float(), r.between(1000, 900000))))
		}
	}
	return []byte(sb.String())
}

func accessLogs(r *rng) []byte {
	var sb strings.Builder
	c := clock{epoch.Add(26 * time.Hour), r}
	agents := []string{"python-requests/2.31.0", "openai-python/1.35.3", "curl/8.5.0", "Go-http-client/2.0", "okhttp/4.12.0", "node-fetch/1.0"}
	for sb.Len() < 40<<10 {
		t := c.tick(400)
		status := pick(r, 200, 200, 200, 200, 200, 204, 400, 401, 403, 404, 429, 499, 502)
		rt := r.float() * 3
		size := r.between(0, 250000)
		if status == 204 {
			size = 0
		}
		fmt.Fprintf(&sb, "%s - - [%s] \"%s %s HTTP/%s\" %d %d \"-\" \"%s\" rt=%.3f uct=%.3f urt=%.3f upstream=%s:%d rid=%s\n",
			pick(r, shortHosts...), t.Format("02/Jan/2006:15:04:05 -0700"), pick(r, "POST", "POST", "GET"), pick(r, paths...),
			pick(r, "1.1", "2.0"), status, size, pick(r, agents...), rt, r.float()*0.01, rt*0.97,
			pick(r, hosts...), pick(r, 8000, 8080, 8443, 9000, 9002), r.hex(32))
	}
	return []byte(sb.String())
}

func eventsJSONL(r *rng) []byte {
	var sb strings.Builder
	c := clock{epoch.Add(50 * time.Hour), r}
	for sb.Len() < 36<<10 {
		t := c.tick(5000)
		pt, ct := r.between(8, 12000), r.between(1, 4096)
		ev := obj{
			{"event", pick(r, "inference.completed", "inference.completed", "inference.streamed", "inference.cancelled")},
			{"id", "evt_" + r.ulid()},
			{"ts", t.Format(time.RFC3339Nano)},
			{"model", pick(r, models...)},
			{"route", pick(r, paths[:6]...)},
			{"prompt_tokens", pt},
			{"completion_tokens", ct},
			{"ttft_ms", math.Round(r.float()*90000) / 100},
			{"duration_ms", r.between(40, 60000)},
			{"cost_micro_usd", pt*r.between(1, 3) + ct*r.between(4, 15)},
			{"pool", pick(r, "default/llama", "inference/qwen", "staging/mistral")},
			{"node", pick(r, shortHosts...)},
			{"request_id", r.uuid()},
		}
		sb.Write(marshal(ev, false))
		sb.WriteString("\n")
	}
	return []byte(sb.String())
}

// ---------------------------------------------------------------- numbers

func sequences(r *rng) []byte {
	var sb strings.Builder
	join := func(xs []int, sep string) string {
		s := make([]string, len(xs))
		for i, x := range xs {
			s[i] = strconv.Itoa(x)
		}
		return strings.Join(s, sep)
	}
	sb.WriteString("Number sequences and lists used in maths and programming exercises.\n\n")
	fib := []int{0, 1}
	for len(fib) < 40 {
		fib = append(fib, fib[len(fib)-1]+fib[len(fib)-2])
	}
	fmt.Fprintf(&sb, "Fibonacci F(0)..F(39):\n%s\n\n", join(fib, ", "))
	var primes []int
	for n := 2; len(primes) < 200; n++ {
		isPrime := true
		for _, p := range primes {
			if p*p > n {
				break
			}
			if n%p == 0 {
				isPrime = false
				break
			}
		}
		if isPrime {
			primes = append(primes, n)
		}
	}
	fmt.Fprintf(&sb, "The first 200 primes:\n")
	for i := 0; i < len(primes); i += 20 {
		sb.WriteString(join(primes[i:i+20], " ") + "\n")
	}
	sq := make([]int, 60)
	tri := make([]int, 60)
	for i := range sq {
		sq[i], tri[i] = (i+1)*(i+1), (i+1)*(i+2)/2
	}
	fmt.Fprintf(&sb, "\nSquares 1..60: %s\nTriangular numbers: %s\n", join(sq, " "), join(tri, " "))
	pow := []int{}
	for i := 0; i <= 40; i++ {
		pow = append(pow, 1<<i)
	}
	fmt.Fprintf(&sb, "Powers of two: %s\n\n", join(pow, ", "))
	for sb.Len() < 26<<10 {
		switch r.intn(6) {
		case 0:
			n := r.between(7, 9999)
			traj := []int{n}
			for n != 1 {
				if n%2 == 0 {
					n /= 2
				} else {
					n = 3*n + 1
				}
				traj = append(traj, n)
			}
			if len(traj) > 40 {
				fmt.Fprintf(&sb, "Collatz trajectory of %d (%d steps): %s ... %s\n", traj[0], len(traj)-1, join(traj[:30], " "), join(traj[len(traj)-5:], " "))
			} else {
				fmt.Fprintf(&sb, "Collatz trajectory of %d (%d steps): %s\n", traj[0], len(traj)-1, join(traj, " "))
			}
		case 1:
			k := r.between(8, 24)
			xs := make([]int, k)
			for i := range xs {
				xs[i] = r.magnitude()
			}
			fmt.Fprintf(&sb, "Input: %s\n", join(xs, " "))
			sort.Ints(xs)
			fmt.Fprintf(&sb, "Sorted: %s\n", join(xs, " "))
		case 2:
			a, d, k := r.between(1, 500), r.between(2, 250), r.between(6, 15)
			xs := make([]int, k)
			for i := range xs {
				xs[i] = a + i*d
			}
			fmt.Fprintf(&sb, "Arithmetic progression a=%d, d=%d: %s; sum = %d\n", a, d, join(xs, ", "), k*(2*a+(k-1)*d)/2)
		case 3:
			a, x, b := r.between(2, 40), r.between(-50, 200), r.between(1, 999)
			fmt.Fprintf(&sb, "Solve %dx + %d = %d  ->  x = %d\n", a, b, a*x+b, x)
		case 4:
			k := r.between(5, 12)
			xs := make([]int, k)
			for i := range xs {
				xs[i] = r.between(0, 99999)
			}
			fmt.Fprintf(&sb, "reservoir sample (k=%d): [%s]\n", k, join(xs, ", "))
		default:
			n := r.between(3, 6)
			fmt.Fprintf(&sb, "Test case %d\n%d\n", r.between(1, 50), n)
			for range n {
				fmt.Fprintf(&sb, "%d %d %d\n", r.magnitude(), r.magnitude(), r.magnitude())
			}
		}
	}
	return []byte(sb.String())
}

func hashesIDs(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("Checksums and identifiers from release artifacts, build logs and object stores.\n\n")
	files := []string{"model-00001-of-00004.safetensors", "tokenizer.json", "infergate-linux-amd64.tar.gz", "weights.bin", "dataset-shard-0042.parquet",
		"checkpoint.pt", "vocab.txt", "config.json"}
	for sb.Len() < 26<<10 {
		f := pick(r, files...)
		switch r.intn(7) {
		case 0:
			fmt.Fprintf(&sb, "%s  %s\n", r.hex(64), f)
		case 1:
			fmt.Fprintf(&sb, "sha1 %s  md5 %s  size %d  %s\n", r.hex(40), r.hex(32), r.between(1000, 999999999), f)
		case 2:
			fmt.Fprintf(&sb, "integrity: sha512-%s\n", base64.StdEncoding.EncodeToString(r.bytes(64)))
		case 3:
			fmt.Fprintf(&sb, "commit %s\nMerge: %s %s\n    bump dependencies (#%d)\n", r.hex(40), r.hex(7), r.hex(7), r.between(100, 9999))
		case 4:
			fmt.Fprintf(&sb, "object_id=%s upload_id=%s etag=\"%s-%d\" part_count=%d\n", r.uuid(), r.ulid(), r.hex(32), r.between(2, 40), r.between(2, 40))
		case 5:
			fmt.Fprintf(&sb, "registry.example.com/infergate/payload@sha256:%s\n", r.hex(64))
		default:
			fmt.Fprintf(&sb, "x-amz-checksum-crc32c: %s  content-md5: %s  token: %s\n", base64.StdEncoding.EncodeToString(r.bytes(4)),
				base64.StdEncoding.EncodeToString(r.bytes(16)), base64.RawURLEncoding.EncodeToString(r.bytes(24)))
		}
	}
	return []byte(sb.String())
}

func invoices(r *rng) []byte {
	var sb strings.Builder
	products := []string{"USB-C hub, 7 ports", "Standing desk frame", "Monitor arm, dual", "Ergonomic keyboard", "Noise-cancelling headset",
		"A4 paper, 5 reams", "Whiteboard markers (12)", "Cable ties, 100 pcs", "Laptop stand, aluminium", "Webcam 1080p"}
	type money struct {
		code, sym string
		dec       int
	}
	cur := []money{{"USD", "$", 2}, {"EUR", "€", 2}, {"GBP", "£", 2}, {"JPY", "¥", 0}, {"CHF", "CHF ", 2}}
	c := clock{epoch.AddDate(0, -1, 0), r}
	for n := 1; sb.Len() < 26<<10; n++ {
		t := c.tick(26 * 3600 * 1000)
		m := pick(r, cur...)
		fmt.Fprintf(&sb, "INVOICE INV-%d-%06d   date %s   due %s   PO %s-%d\n", t.Year(), r.between(1, 999999), t.Format("2006-01-02"),
			t.AddDate(0, 0, 30).Format("02 Jan 2006"), pick(r, "PO", "REQ", "CC"), r.between(10000, 99999))
		total := 0.0
		for line := 1; line <= r.between(2, 6); line++ {
			qty := r.between(1, 20)
			price := float64(r.between(150, 89900)) / 100
			if m.dec == 0 {
				price = float64(r.between(200, 90000))
			}
			total += price * float64(qty)
			fmt.Fprintf(&sb, "  %d  %-12s %-28s %3d x %s%s = %s%s\n", line, fmt.Sprintf("SKU-%s", r.upperAlnum(6)), pick(r, products...), qty,
				m.sym, money2(price, m.dec), m.sym, money2(price*float64(qty), m.dec))
		}
		vat := pick(r, 0.0, 7.7, 19.0, 20.0, 21.0)
		fmt.Fprintf(&sb, "  subtotal %s%s  VAT %.1f%% %s%s  total %s %s\n", m.sym, money2(total, m.dec), vat, m.sym, money2(total*vat/100, m.dec), m.code, money2(total*(1+vat/100), m.dec))
		fmt.Fprintf(&sb, "  shipped in %d parcel(s), tracking %s, order #%d, ticket SUP-%d\n\n", r.between(1, 3),
			pick(r, "JD", "CX", "RR", "LX")+r.upperAlnum(4)+r.digits(10), r.between(100000, 9999999), r.between(1000, 99999))
	}
	return []byte(sb.String())
}

// money2 formats an amount with thousands separators.
func money2(v float64, dec int) string {
	s := strconv.FormatFloat(v, 'f', dec, 64)
	intPart, frac := s, ""
	if i := strings.IndexByte(s, '.'); i >= 0 {
		intPart, frac = s[:i], s[i:]
	}
	var b []byte
	for i := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, intPart[i])
	}
	return string(b) + frac
}

func datesTimes(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("Instants written in the formats different systems use.\n\n")
	layouts := []struct{ name, layout string }{
		{"RFC 3339", time.RFC3339},
		{"RFC 3339 nano", time.RFC3339Nano},
		{"RFC 1123", time.RFC1123},
		{"RFC 1123Z", time.RFC1123Z},
		{"RFC 850", time.RFC850},
		{"ANSI C", time.ANSIC},
		{"Kitchen", time.Kitchen},
		{"US", "01/02/2006 03:04 PM"},
		{"European", "02.01.2006 15:04"},
		{"ISO date", "2006-01-02"},
		{"compact", "20060102T150405Z"},
		{"log", "2006/01/02 15:04:05.000000"},
		{"long", "Monday, January 2, 2006 at 15:04"},
		{"short", "Jan 2 '06"},
		{"SQL", "2006-01-02 15:04:05.000"},
		{"day/month", "2/1/2006"},
	}
	t := epoch.AddDate(0, -6, 0)
	for sb.Len() < 26<<10 {
		t = t.Add(time.Duration(r.between(1, 200000)) * time.Second)
		l := pick(r, layouts...)
		year, week := t.ISOWeek()
		switch r.intn(8) {
		case 0:
			fmt.Fprintf(&sb, "unix %d = %s (ms %d)\n", t.Unix(), t.Format(time.RFC3339), t.UnixMilli())
		case 1:
			fmt.Fprintf(&sb, "ISO week %d-W%02d-%d, ordinal %s\n", year, week, (int(t.Weekday())+6)%7+1, t.Format("2006-002"))
		case 2:
			d := time.Duration(r.between(1, 200000)) * time.Second
			h := int(d.Hours())
			fmt.Fprintf(&sb, "duration %s = PT%dH%dM%dS = %d s\n", d, h, int(d.Minutes())%60, int(d.Seconds())%60, int(d.Seconds()))
		default:
			fmt.Fprintf(&sb, "%-14s %s\n", l.name, t.Format(l.layout))
		}
	}
	return []byte(sb.String())
}

func versions(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("# pip freeze\n")
	for _, p := range []string{"numpy==1.26.4", "torch==2.3.1", "transformers==4.41.2", "tokenizers==0.19.1", "safetensors==0.4.3",
		"pydantic==2.7.4", "fastapi==0.111.0", "uvicorn==0.30.1", "grpcio==1.64.1", "protobuf==4.25.3", "sentencepiece==0.2.0",
		"accelerate==0.31.0", "vllm==0.5.0.post1", "triton==2.3.1", "xformers==0.0.26.post1", "einops==0.8.0"} {
		sb.WriteString(p + "\n")
	}
	sb.WriteString("\n# go.sum-style lines\n")
	for range 30 {
		fmt.Fprintf(&sb, "example.com/%s v%d.%d.%d h1:%s=\n", pick(r, "lib/ring", "x/yaml", "tools/lint", "proto/api", "kit/log"),
			r.between(0, 2), r.between(0, 30), r.between(0, 12), base64.StdEncoding.EncodeToString(r.bytes(32))[:43])
	}
	sb.WriteString("\n# assembly and file versions from a Windows build\n")
	for range 40 {
		fmt.Fprintf(&sb, "%s.dll  AssemblyVersion %d.%d.%d.%d  FileVersion %d.%d.%d.%d  ProductVersion %d.%d.%d\n",
			pick(r, "Infer.Client", "Infer.Core", "Infer.Telemetry", "Infer.Tokenizer"), r.between(1, 9), r.between(0, 9), 0, 0,
			r.between(1, 9), r.between(0, 12), r.between(1000, 26000), r.between(0, 999), r.between(1, 9), r.between(0, 12), r.between(0, 30))
	}
	sb.WriteString("\n# firmware and driver versions from an inventory export\n")
	for range 50 {
		fmt.Fprintf(&sb, "node %-14s driver %d.%d.%d  cuda %d.%d  nic firmware %d.%d.%d  vbios %d.00.%02X.00.%02X  bios %d.%02d  build %d\n", pick(r, shortHosts...),
			r.between(470, 560), r.between(10, 99), r.between(1, 20), 12, r.between(0, 6), r.between(14, 28), r.between(20, 41), r.between(1000, 2999),
			r.between(86, 96), r.intn(256), r.intn(256), r.between(1, 3), r.between(0, 99), r.between(10000, 99999))
	}
	sb.WriteString("\n# object identifiers seen in certificates and SNMP walks\n")
	oids := []string{"2.5.4.3", "2.5.4.6", "2.5.4.10", "2.5.4.11", "2.5.29.14", "2.5.29.15", "2.5.29.17", "2.5.29.19", "2.5.29.37",
		"1.2.840.113549.1.1.11", "1.2.840.10045.4.3.2", "1.3.6.1.5.5.7.3.1", "1.3.6.1.5.5.7.3.2", "1.3.6.1.2.1.1.3.0", "1.3.6.1.2.1.2.2.1.10"}
	for range 40 {
		o := pick(r, oids...)
		if strings.HasPrefix(o, "1.3.6.1.2.1") {
			fmt.Fprintf(&sb, "%s.%d = Counter32: %d\n", o, r.between(1, 48), r.between(0, 4000000000))
		} else {
			fmt.Fprintf(&sb, "OID %s (critical=%v)\n", o, r.chance(0.3))
		}
	}
	sb.WriteString("\n# release tags\n")
	for range 60 {
		fmt.Fprintf(&sb, "v%d.%d.%d%s  released %s\n", r.between(0, 3), r.between(0, 40), r.between(0, 15), pick(r, "", "", "-rc.1", "-beta.2", "+build.7"),
			epoch.AddDate(0, 0, -r.between(0, 900)).Format("2006-01-02"))
	}
	return []byte(sb.String())
}

func coordsMeasurements(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("Survey points and measurements from a field notebook transcription.\n\n")
	dms := func(v float64, pos, neg string) string {
		h := pos
		if v < 0 {
			h, v = neg, -v
		}
		d := math.Floor(v)
		m := math.Floor((v - d) * 60)
		s := ((v-d)*60 - m) * 60
		return fmt.Sprintf("%d°%02d'%04.1f\"%s", int(d), int(m), s, h)
	}
	for n := 1; sb.Len() < 22<<10; n++ {
		lat, lon := -60+r.float()*130, -180+r.float()*360
		switch r.intn(5) {
		case 0:
			fmt.Fprintf(&sb, "P%03d  %.6f, %.6f  elev %.1f m\n", n, lat, lon, r.float()*3000)
		case 1:
			fmt.Fprintf(&sb, "P%03d  %s %s\n", n, dms(lat, "N", "S"), dms(lon, "E", "W"))
		case 2:
			fmt.Fprintf(&sb, "beam %d: length %.1f mm ±%.2f mm, mass %.3f kg, deflection %.2f mm under %d N\n", n, 500+r.float()*4000,
				0.05+r.float()*0.2, r.float()*40, r.float()*12, r.between(100, 20000))
		case 3:
			fmt.Fprintf(&sb, "run %d: %.2f km in %d:%02d:%02d, avg %.1f km/h, climb %d m\n", n, r.float()*120, r.between(0, 5), r.intn(60), r.intn(60),
				10+r.float()*25, r.between(0, 2400))
		default:
			fmt.Fprintf(&sb, "sample %d: pH %.2f, conductivity %d µS/cm, %.1f °C, turbidity %.2f NTU, flow %.3f m³/s\n", n, 5+r.float()*4,
				r.between(50, 2000), r.float()*30, r.float()*20, r.float()*4)
		}
	}
	return []byte(sb.String())
}

// ---------------------------------------------------------------- code

func lookupTables(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("/* Generated lookup tables for the audio and checksum routines. Do not edit. */\n#include <stdint.h>\n\n")
	sb.WriteString("/* sin(2*pi*i/1024) in Q15, i = 0..1023 */\nconst int16_t sine_q15[1024] = {\n")
	for i := range 1024 {
		if i%12 == 0 {
			sb.WriteString("   ")
		}
		fmt.Fprintf(&sb, " %6d,", int(math.Round(math.Sin(2*math.Pi*float64(i)/1024)*32767)))
		if i%12 == 11 {
			sb.WriteString("\n")
		}
	}
	sb.WriteString("\n};\n\n/* CRC-32 (IEEE 802.3), reflected polynomial 0xEDB88320 */\nconst uint32_t crc32_table[256] = {\n")
	tab := crc32.MakeTable(crc32.IEEE)
	for i, v := range tab {
		if i%6 == 0 {
			sb.WriteString("   ")
		}
		fmt.Fprintf(&sb, " 0x%08X,", v)
		if i%6 == 5 {
			sb.WriteString("\n")
		}
	}
	sb.WriteString("\n};\n\n/* gamma 2.2, 8-bit in, 8-bit out */\nconst uint8_t gamma22[256] = {\n")
	for i := range 256 {
		if i%16 == 0 {
			sb.WriteString("   ")
		}
		fmt.Fprintf(&sb, " %3d,", int(math.Round(math.Pow(float64(i)/255, 2.2)*255)))
		if i%16 == 15 {
			sb.WriteString("\n")
		}
	}
	sb.WriteString("};\n\n/* int8 weights of the 16x24 keyword-spotting layer, per-row scales below */\nconst int8_t kws_w[16][24] = {\n")
	for range 16 {
		sb.WriteString("    {")
		for j := range 24 {
			if j > 0 {
				sb.WriteString(", ")
			}
			fmt.Fprintf(&sb, "%d", max(-127, min(127, int(r.normal()*40))))
		}
		sb.WriteString("},\n")
	}
	sb.WriteString("};\nconst float kws_scale[16] = {")
	for i := range 16 {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%.6ff", 0.001+r.float()*0.01)
	}
	sb.WriteString("};\n")
	return []byte(sb.String())
}

func sqlInserts(r *rng) []byte {
	var sb strings.Builder
	sb.WriteString("-- seed data for the inventory service (staging)\nBEGIN;\n\n")
	sb.WriteString("INSERT INTO products (id, sku, title, weight_g, price_cents, currency, created_at) VALUES\n")
	titles := []string{"Cable organiser", "Desk lamp", "Notebook A5", "Water bottle 750 ml", "Mouse pad XL", "HDMI cable 2 m", "Phone stand",
		"Label printer tape", "Power strip 6x", "Keyboard wrist rest"}
	for i := 1; i <= 120; i++ {
		sep := ","
		if i == 120 {
			sep = ";"
		}
		fmt.Fprintf(&sb, "  (%d, '%s-%05d', '%s', %d, %d, '%s', '%s')%s\n", 1000+i, pick(r, "ACC", "OFF", "ELC", "HOM"), r.between(1, 99999),
			pick(r, titles...), r.between(20, 9000), r.between(199, 49999), pick(r, "USD", "EUR", "GBP"),
			epoch.AddDate(0, 0, -r.between(0, 700)).Add(time.Duration(r.intn(86400))*time.Second).Format("2006-01-02 15:04:05"), sep)
	}
	sb.WriteString("\nINSERT INTO stock_movements (product_id, warehouse_id, delta, reason, moved_at) VALUES\n")
	for i := 1; i <= 260; i++ {
		sep := ","
		if i == 260 {
			sep = ";"
		}
		fmt.Fprintf(&sb, "  (%d, %d, %d, '%s', '%s')%s\n", r.between(1001, 1120), r.between(1, 12), r.between(-400, 900),
			pick(r, "receipt", "sale", "return", "count", "transfer"), epoch.Add(-time.Duration(r.intn(90*86400))*time.Second).Format(time.RFC3339), sep)
	}
	sb.WriteString("\nCOMMIT;\n")
	return []byte(sb.String())
}

func promMetrics(r *rng) []byte {
	var sb strings.Builder
	buckets := []string{"0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"}
	for sb.Len() < 30<<10 {
		host := pick(r, shortHosts...)
		model := pick(r, models...)
		sb.WriteString("# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency in seconds.\n# TYPE vllm:e2e_request_latency_seconds histogram\n")
		n := 0
		for _, b := range buckets {
			n += r.between(0, 5000)
			fmt.Fprintf(&sb, "vllm:e2e_request_latency_seconds_bucket{instance=\"%s:8000\",model_name=\"%s\",le=\"%s\"} %d\n", host, model, b, n)
		}
		fmt.Fprintf(&sb, "vllm:e2e_request_latency_seconds_sum{instance=\"%s:8000\",model_name=\"%s\"} %.3f\n", host, model, float64(n)*r.float()*2)
		fmt.Fprintf(&sb, "vllm:e2e_request_latency_seconds_count{instance=\"%s:8000\",model_name=\"%s\"} %d\n", host, model, n)
		fmt.Fprintf(&sb, "vllm:num_requests_running{instance=\"%s:8000\",model_name=\"%s\"} %d\n", host, model, r.between(0, 256))
		fmt.Fprintf(&sb, "vllm:gpu_cache_usage_perc{instance=\"%s:8000\",model_name=\"%s\"} %.4f\n", host, model, r.float())
		fmt.Fprintf(&sb, "vllm:prompt_tokens_total{instance=\"%s:8000\",model_name=\"%s\"} %.6e\n", host, model, r.float()*1e9)
		fmt.Fprintf(&sb, "process_resident_memory_bytes{instance=\"%s:9090\"} %d\n", host, r.between(100000000, 2000000000))
		fmt.Fprintf(&sb, "process_start_time_seconds{instance=\"%s:9090\"} %d\n", host, epoch.Unix()-int64(r.intn(800000)))
		fmt.Fprintf(&sb, "infergate_payload_requests_total{outcome=\"%s\",reason=\"%s\"} %d\n\n", pick(r, "forwarded", "rejected"),
			pick(r, "none", "pii", "denied", "prompt-too-large"), r.between(0, 9000000))
	}
	return []byte(sb.String())
}

// ---------------------------------------------------------------- JSON

// obj is a JSON object that keeps its key order.
type obj []kv

type kv struct {
	k string
	v any
}

func (o obj) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, e := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(marshal(e.k, false))
		b.WriteByte(':')
		b.Write(marshal(e.v, false))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// marshal encodes v without HTML escaping, indented or compact.
func marshal(v any, indent bool) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if indent {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(v); err != nil {
		log.Fatal(err)
	}
	out := b.Bytes()
	if !indent {
		out = bytes.TrimSuffix(out, []byte("\n"))
	}
	return out
}

func ints(r *rng, n int, f func() int) []int {
	xs := make([]int, n)
	for i := range xs {
		xs[i] = f()
	}
	return xs
}

func grid(r *rng, n, m int, f func() int) [][]int {
	g := make([][]int, n)
	for i := range g {
		g[i] = ints(r, m, f)
	}
	return g
}

func floats(r *rng, n int, scale float64, decimals int) []float64 {
	xs := make([]float64, n)
	p := math.Pow(10, float64(decimals))
	for i := range xs {
		xs[i] = math.Round(r.normal()*scale*p) / p
	}
	return xs
}

func shape(r *rng) []int {
	dims := []int{1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 2048, 4096, 8192, 14336}
	s := make([]int, r.between(1, 4))
	for i := range s {
		s[i] = pick(r, dims...)
	}
	return s
}

// jsonDoc returns document n: JSON that is not a request.
func jsonDoc(r *rng, n int) []byte {
	var v any
	switch n % 5 {
	case 1: // safetensors-style index
		weights := obj{}
		var offset int
		hidden, inter := pick(r, 2048, 3072, 4096), pick(r, 8192, 11008, 14336)
		for l := range r.between(3, 5) {
			for _, t := range []struct {
				name string
				dims []int
			}{{"self_attn.q_proj.weight", []int{hidden, hidden}}, {"self_attn.k_proj.weight", []int{hidden / 4, hidden}},
				{"self_attn.v_proj.weight", []int{hidden / 4, hidden}}, {"self_attn.o_proj.weight", []int{hidden, hidden}},
				{"mlp.gate_proj.weight", []int{inter, hidden}}, {"mlp.down_proj.weight", []int{hidden, inter}}} {
				size := t.dims[0] * t.dims[1] * 2
				weights = append(weights, kv{fmt.Sprintf("model.layers.%d.%s", l, t.name), obj{{"dtype", "BF16"}, {"shape", t.dims},
					{"data_offsets", []int{offset, offset + size}}}})
				offset += size
			}
		}
		v = obj{{"__metadata__", obj{{"format", "pt"}, {"total_size", strconv.Itoa(offset)}}}, {"tensors", weights}}
	case 2: // tool arguments of shapes and arrays
		calls := []obj{}
		for range r.between(4, 8) {
			s := shape(r)
			calls = append(calls, obj{{"op", pick(r, "reshape", "zeros", "randn", "permute", "broadcast_to")}, {"shape", s},
				{"dtype", pick(r, "float32", "bfloat16", "int64", "int32")},
				{"values", grid(r, r.between(2, 4), r.between(3, 6), r.magnitude)}, {"strides", ints(r, len(s), func() int { return pick(r, 1, 8, 64, 1024, 65536) })}})
		}
		v = obj{{"name", "tensor_ops"}, {"calls", calls}}
	case 3: // histograms
		hists := []obj{}
		for range r.between(3, 6) {
			k := r.between(8, 20)
			edges := make([]float64, k+1)
			for i := range edges {
				edges[i] = math.Round(float64(i)*r.float()*1000) / 100
			}
			sort.Float64s(edges)
			hists = append(hists, obj{{"metric", pick(r, "ttft_ms", "itl_ms", "prompt_tokens", "queue_ms")},
				{"edges", edges}, {"counts", ints(r, k, func() int { return r.between(0, 99999) })}})
		}
		v = obj{{"window", obj{{"start", epoch.Format(time.RFC3339)}, {"end", epoch.Add(time.Hour).Format(time.RFC3339)}}}, {"histograms", hists}}
	case 4: // confusion matrix and classification report
		k := r.between(4, 9)
		labels := []string{"cat", "dog", "bird", "fish", "horse", "frog", "truck", "ship", "plane"}[:k]
		report := obj{}
		for _, l := range labels {
			report = append(report, kv{l, obj{{"precision", math.Round(r.float()*1e4) / 1e4}, {"recall", math.Round(r.float()*1e4) / 1e4},
				{"support", r.between(100, 5000)}}})
		}
		v = obj{{"labels", labels}, {"confusion_matrix", grid(r, k, k, func() int { return r.between(0, 1200) })}, {"report", report},
			{"embedding_sample", floats(r, 48, 0.3, 5)}}
	default: // GeoJSON and benchmark results
		features := []obj{}
		for range r.between(8, 14) {
			ring := [][]float64{}
			lat, lon := -50+r.float()*100, -170+r.float()*340
			for range r.between(4, 7) {
				ring = append(ring, []float64{math.Round((lon+r.float()*0.1)*1e6) / 1e6, math.Round((lat+r.float()*0.1)*1e6) / 1e6})
			}
			ring = append(ring, ring[0])
			features = append(features, obj{{"type", "Feature"}, {"properties", obj{{"plot", r.between(1, 9999)}, {"area_m2", r.between(100, 90000)}}},
				{"geometry", obj{{"type", "Polygon"}, {"coordinates", [][][]float64{ring}}}}})
		}
		v = obj{{"type", "FeatureCollection"}, {"features", features}}
	}
	return marshal(v, true)
}

// ---------------------------------------------------------------- requests

var enumSchemas = []obj{
	{{"name", "generate_image"}, {"description", "Render an image from a text description."}, {"props", obj{
		{"size", obj{{"type", "string"}, {"enum", []string{"256x256", "512x512", "1024x1024", "1024x1792", "1792x1024"}}}},
		{"steps", obj{{"type", "integer"}, {"enum", []int{20, 25, 30, 50}}}},
		{"n", obj{{"type", "integer"}, {"minimum", 1}, {"maximum", 4}}}}}},
	{{"name", "resize_tensor"}, {"description", "Reshape or pad a tensor to one of the supported sizes."}, {"props", obj{
		{"dim", obj{{"type", "integer"}, {"enum", []int{128, 256, 512, 1024, 2048, 4096}}}},
		{"batch", obj{{"type", "integer"}, {"enum", []int{1, 2, 4, 8, 16, 32, 64, 128}}}},
		{"layout", obj{{"type", "string"}, {"enum", []string{"NCHW", "NHWC"}}}}}}},
	{{"name", "transcode_video"}, {"description", "Transcode a video to a target resolution and frame rate."}, {"props", obj{
		{"resolution", obj{{"type", "string"}, {"enum", []string{"640x360", "1280x720", "1920x1080", "2560x1440", "3840x2160"}}}},
		{"fps", obj{{"type", "number"}, {"enum", []float64{23.976, 24, 25, 29.97, 30, 50, 59.94, 60}}}},
		{"bitrate_kbps", obj{{"type", "integer"}, {"enum", []int{800, 1500, 3000, 4500, 8000, 16000}}}}}}},
	{{"name", "resample_audio"}, {"description", "Resample an audio clip."}, {"props", obj{
		{"sample_rate", obj{{"type", "integer"}, {"enum", []int{8000, 11025, 16000, 22050, 44100, 48000, 96000}}}},
		{"bits", obj{{"type", "integer"}, {"enum", []int{8, 16, 24, 32}}}},
		{"channels", obj{{"type", "integer"}, {"enum", []int{1, 2, 6}}}}}}},
	{{"name", "create_volume"}, {"description", "Provision a block volume."}, {"props", obj{
		{"size_gib", obj{{"type", "integer"}, {"enum", []int{32, 64, 128, 256, 512, 1024, 2048, 4096}}}},
		{"iops", obj{{"type", "integer"}, {"enum", []int{3000, 6000, 12000, 16000}}}},
		{"tier", obj{{"type", "string"}, {"enum", []string{"standard", "balanced", "performance"}}}}}}},
	{{"name", "crop_image"}, {"description", "Crop an image to an aspect ratio and size."}, {"props", obj{
		{"aspect", obj{{"type", "string"}, {"enum", []string{"1:1", "4:3", "3:2", "16:9", "21:9", "9:16"}}}},
		{"width", obj{{"type", "integer"}, {"enum", []int{320, 480, 640, 720, 1080, 1440, 2160}}}},
		{"height", obj{{"type", "integer"}, {"enum", []int{240, 360, 480, 720, 1080, 1440}}}}}}},
}

// openAITool renders one schema as an OpenAI function tool.
func openAITool(s obj) obj {
	props := s[2].v.(obj)
	required := []string{props[0].k}
	return obj{{"type", "function"}, {"function", obj{{"name", s[0].v}, {"description", s[1].v},
		{"parameters", obj{{"type", "object"}, {"properties", props}, {"required", required}}}}}}
}

// toolArgs returns arguments for schema s: its enum values picked, and
// a tensor shape and a data sample.
func toolArgs(r *rng, s obj) obj {
	args := obj{}
	for _, p := range s[2].v.(obj) {
		schema := p.v.(obj)
		for _, f := range schema {
			if f.k != "enum" {
				continue
			}
			switch e := f.v.(type) {
			case []int:
				args = append(args, kv{p.k, pick(r, e...)})
			case []float64:
				args = append(args, kv{p.k, pick(r, e...)})
			case []string:
				args = append(args, kv{p.k, pick(r, e...)})
			}
		}
	}
	args = append(args, kv{"shape", shape(r)})
	if r.chance(0.6) {
		args = append(args, kv{"data", grid(r, r.between(2, 4), r.between(3, 6), r.magnitude)})
	} else {
		args = append(args, kv{"values", floats(r, r.between(6, 16), 2, 4)})
	}
	return args
}

func numbersText(r *rng) string {
	n, m := r.between(2, 5), r.between(3, 6)
	var sb strings.Builder
	for i := range n {
		for j := range m {
			if j > 0 {
				sb.WriteString(" ")
			}
			sb.WriteString(strconv.Itoa(r.magnitude()))
		}
		if i < n-1 {
			sb.WriteString("\n")
		}
	}
	return sb.String()
}

// request returns request body n.
func request(r *rng, n int) []byte {
	model := pick(r, models...)
	s := enumSchemas[r.intn(len(enumSchemas))]
	name := s[0].v.(string)
	callID := "call_" + r.alnum(24)
	args := toolArgs(r, s)
	argStr := string(marshal(args, false))
	var v obj
	switch n % 5 {
	case 0: // OpenAI chat with tools, a tool call and its result
		tools := []obj{openAITool(s)}
		if r.chance(0.5) {
			tools = append(tools, openAITool(enumSchemas[r.intn(len(enumSchemas))]))
		}
		v = obj{{"model", model}, {"messages", []obj{
			{{"role", "system"}, {"content", "You are a build assistant. Call tools with the exact sizes the user asks for."}},
			{{"role", "user"}, {"content", fmt.Sprintf("Run %s for the batch in job %d; the input tensor is %s.", name, r.between(1000, 99999), fmtShape(args))}},
			{{"role", "assistant"}, {"content", nil}, {"tool_calls", []obj{{{"id", callID}, {"type", "function"},
				{"function", obj{{"name", name}, {"arguments", argStr}}}}}}},
			{{"role", "tool"}, {"tool_call_id", callID}, {"content", string(marshal(obj{{"ok", true}, {"output_shape", shape(r)},
				{"elapsed_ms", r.between(3, 9000)}, {"checksum", r.hex(16)}}, false))}},
		}}, {"tools", tools}, {"tool_choice", "auto"}, {"temperature", 0.2}, {"max_tokens", pick(r, 256, 512, 1024)}}
	case 1: // Anthropic messages with tool_use and tool_result
		toolID := "toolu_" + r.alnum(24)
		v = obj{{"model", model}, {"max_tokens", pick(r, 1024, 2048, 4096)}, {"system", "Use the tools to inspect arrays; report shapes exactly."},
			{"tools", []obj{{{"name", name}, {"description", s[1].v}, {"input_schema", obj{{"type", "object"}, {"properties", s[2].v}}}}}},
			{"messages", []obj{
				{{"role", "user"}, {"content", fmt.Sprintf("Please run %s on this array:\n%s", name, numbersText(r))}},
				{{"role", "assistant"}, {"content", []obj{{{"type", "text"}, {"text", "Running it now."}},
					{{"type", "tool_use"}, {"id", toolID}, {"name", name}, {"input", args}}}}},
				{{"role", "user"}, {"content", []obj{{{"type", "tool_result"}, {"tool_use_id", toolID},
					{"content", fmt.Sprintf("result shape %s, min %d, max %d, mean %.3f", fmtInts(shape(r)), r.between(0, 99), r.between(100, 9999), r.float()*500)}}}}},
			}}}
	case 2: // responses API with a function call and its output
		v = obj{{"model", model}, {"instructions", "Answer with the tensor statistics only."},
			{"tools", []obj{{{"type", "function"}, {"name", name}, {"description", s[1].v}, {"parameters", obj{{"type", "object"}, {"properties", s[2].v}}}}}},
			{"input", []obj{
				{{"role", "user"}, {"content", fmt.Sprintf("Summarise batch %d:\n%s", r.between(1, 999), numbersText(r))}},
				{{"type", "function_call"}, {"call_id", callID}, {"name", name}, {"arguments", argStr}},
				{{"type", "function_call_output"}, {"call_id", callID}, {"output", string(marshal(obj{{"mean", math.Round(r.float()*1e4) / 100},
					{"std", math.Round(r.float()*1e4) / 100}, {"histogram", ints(r, 10, func() int { return r.between(0, 5000) })}}, false))}},
			}}, {"max_output_tokens", pick(r, 300, 600, 1200)}}
	case 3: // completions with a numpy session as the prompt
		rows, _ := intRows(r, r.between(2, 4), r.between(3, 6), 0, pick(r, 100, 1000, 10000)-1)
		prompt := fmt.Sprintf(">>> x = np.load(\"batch_%04d.npy\")\n>>> x\n%s\n>>> x.shape\n(%d, %d)\n>>> # explain what x.argmax(axis=1) returns here\n",
			r.between(0, 9999), numpyArray("array", rows, false, ""), len(rows), len(rows[0]))
		v = obj{{"model", model}, {"prompt", prompt}, {"max_tokens", pick(r, 64, 128, 256)}, {"temperature", 0}, {"stop", []string{">>>"}}}
	default: // chat with content parts
		parts := []obj{{{"type", "text"}, {"text", "Here is the matrix from the exercise sheet:"}},
			{{"type", "text"}, {"text", numbersText(r)}},
			{{"type", "text"}, {"text", fmt.Sprintf("Compute its rank and the sum of column %d.", r.between(1, 3))}}}
		if r.chance(0.5) {
			parts[1] = obj{{"type", "text"}, {"text", "sku,qty,price\n" + fmt.Sprintf("KBD-%04d,%d,%.2f\nMSE-%04d,%d,%.2f", r.between(1, 9999), r.between(1, 50),
				float64(r.between(100, 9999))/100, r.between(1, 9999), r.between(1, 50), float64(r.between(100, 9999))/100)}}
			parts[0] = obj{{"type", "text"}, {"text", "Current stock of the two SKUs:"}}
			parts[2] = obj{{"type", "text"}, {"text", "What is the total value of this stock?"}}
		}
		v = obj{{"model", model}, {"messages", []obj{{{"role", "user"}, {"content", parts}}}}, {"stream", r.chance(0.5)}}
	}
	// SDKs send compact JSON; a third of the bodies are indented, as a
	// person writing one by hand would.
	return append(marshal(v, n%3 == 0), '\n')
}

func fmtInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

func fmtShape(args obj) string {
	for _, a := range args {
		if a.k == "shape" {
			return fmtInts(a.v.([]int))
		}
	}
	return "[]"
}
