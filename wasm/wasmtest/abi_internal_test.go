package wasmtest

import (
	"bytes"
	"errors"
	"slices"
	"testing"
)

// The SDK's serde (internal/serde.go) encodes {{"a","1"},{"bb",""}} as this exact byte string.
var sdkPairs = []byte("\x02\x00\x00\x00" + "\x01\x00\x00\x00\x01\x00\x00\x00" + "\x02\x00\x00\x00\x00\x00\x00\x00" + "a\x001\x00bb\x00\x00")

func TestSerializePairsMatchesSDK(t *testing.T) {
	pairs := [][2]string{{"a", "1"}, {"bb", ""}}
	if got := serializePairs(pairs); !bytes.Equal(got, sdkPairs) {
		t.Errorf("serialized %q, want %q", got, sdkPairs)
	}
	got, err := deserializePairs(sdkPairs)
	if err != nil || !slices.Equal(got, pairs) {
		t.Errorf("deserialized %q, %v; want %q", got, err, pairs)
	}
	if got := serializePairs(nil); !bytes.Equal(got, []byte{0, 0, 0, 0}) {
		t.Errorf("empty map serialized as %q", got)
	}
}

func TestDeserializePairsRejectsMalformed(t *testing.T) {
	tests := map[string][]byte{
		"short":            {1, 0},
		"count too large":  []byte("\xff\x00\x00\x00\x01\x00\x00\x00"),
		"size overruns":    append(append([]byte(nil), sdkPairs[:12]...), "\x09\x00\x00\x00\x00\x00\x00\x00a\x001\x00bb\x00\x00"...),
		"missing NUL":      []byte("\x01\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00a11\x00"),
		"truncated values": sdkPairs[:len(sdkPairs)-2],
	}
	for name, b := range tests {
		if _, err := deserializePairs(b); !errors.Is(err, errBadPairs) {
			t.Errorf("%s: %v, want errBadPairs", name, err)
		}
	}
}

func TestSetBufferRangeFollowsEnvoy(t *testing.T) {
	const maxInt32 = 1<<31 - 1
	tests := []struct {
		name        string
		start, size uint32
		want        string
		st          status
	}{
		{"replace all (SDK Replace*Body)", 0, maxInt32, "XY", statusOK},
		{"replace all, exact size", 0, 5, "XY", statusOK},
		{"prepend (SDK Prepend*Body)", 0, 0, "XYhello", statusOK},
		{"append (SDK Append*Body)", maxInt32, 0, "helloXY", statusOK},
		{"append at len", 5, 0, "helloXY", statusOK},
		{"prefix range: spec allows, Envoy rejects", 0, 2, "hello", statusBadArgument},
		{"middle range: spec allows, Envoy rejects", 1, 2, "hello", statusBadArgument},
	}
	for _, tt := range tests {
		got, st := setBufferRange([]byte("hello"), tt.start, tt.size, []byte("XY"))
		if string(got) != tt.want || st != tt.st {
			t.Errorf("%s: %q, %d; want %q, %d", tt.name, got, st, tt.want, tt.st)
		}
	}
}

func TestGetBufferRange(t *testing.T) {
	tests := []struct {
		start, max uint32
		want       string
		st         status
	}{
		{0, 5, "hello", statusOK},
		{0, 1<<31 - 1, "hello", statusOK},
		{1, 3, "ell", statusOK},
		{5, 10, "", statusOK},
		{6, 1, "", statusBadArgument},
	}
	for _, tt := range tests {
		got, st := getBufferRange([]byte("hello"), tt.start, tt.max)
		if string(got) != tt.want || st != tt.st {
			t.Errorf("get(%d, %d) = %q, %d; want %q, %d", tt.start, tt.max, got, st, tt.want, tt.st)
		}
	}
}

func TestHeaderMapSemantics(t *testing.T) {
	m := newHeaderMap([][2]string{{"Accept", "a"}, {"x-dup", "1"}, {"X-Dup", "2"}, {"z", "z"}})
	if v, ok := m.get("X-DUP"); !ok || v != "1" {
		t.Errorf("get returned %q, %v; want the first value", v, ok)
	}
	m.replace("x-dup", "3")
	m.add("Accept", "b")
	m.replace("new", "n")
	want := [][2]string{{"accept", "a"}, {"x-dup", "3"}, {"z", "z"}, {"accept", "b"}, {"new", "n"}}
	if !slices.Equal(m, want) {
		t.Errorf("after replace/add: %q, want %q", m, want)
	}
	m.remove("ACCEPT")
	want = [][2]string{{"x-dup", "3"}, {"z", "z"}, {"new", "n"}}
	if !slices.Equal(m, want) {
		t.Errorf("after remove: %q, want %q", m, want)
	}
	if _, ok := m.get("accept"); ok {
		t.Error("removed header still found")
	}
}

func TestSharedDataCAS(t *testing.T) {
	var d sharedData
	if st := d.set("k", []byte("v1"), 42); st != statusOK {
		t.Fatalf("first set with a cas for a missing key: %d, want Ok (Envoy ignores it)", st)
	}
	v, _ := d.get("k")
	if st := d.set("k", []byte("v2"), v.cas+1); st != statusCasMismatch {
		t.Errorf("stale cas: %d, want CasMismatch", st)
	}
	if st := d.set("k", []byte("v2"), v.cas); st != statusOK {
		t.Errorf("current cas: %d, want Ok", st)
	}
	if st := d.set("k", []byte("v3"), 0); st != statusOK {
		t.Errorf("cas 0: %d, want Ok (unconditional)", st)
	}
	if got, _ := d.get("k"); string(got.data) != "v3" || got.cas == v.cas || got.cas == 0 {
		t.Errorf("value %q cas %d after writes (first cas %d)", got.data, got.cas, v.cas)
	}
}

func TestMetricsReturnCodes(t *testing.T) {
	var m metrics
	c, _ := m.define(metricCounter, "c")
	g, _ := m.define(metricGauge, "g")
	hist, _ := m.define(metricHistogram, "h")
	if again, _ := m.define(metricCounter, "c"); again != c {
		t.Errorf("redefining a counter gave id %d, want %d", again, c)
	}
	checks := []struct {
		name string
		got  status
		want status
	}{
		{"counter +2", m.increment(c, 2), statusOK},
		{"counter +0", m.increment(c, 0), statusBadArgument},
		{"counter -1", m.increment(c, -1), statusBadArgument},
		{"gauge -3", m.increment(g, -3), statusOK},
		{"histogram increment", m.increment(hist, 1), statusBadArgument},
		{"histogram record", m.record(hist, 7), statusOK},
		{"unknown id", m.increment(999, 1), statusNotFound},
		{"bad type", func() status { _, st := m.define(7, "x"); return st }(), statusBadArgument},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
	if v, st := m.get(c); v != 2 || st != statusOK {
		t.Errorf("counter = %d, %d", v, st)
	}
	if v, st := m.get(g); int64(v) != -3 || st != statusOK {
		t.Errorf("gauge = %d, %d", int64(v), st)
	}
	if _, st := m.get(hist); st != statusBadArgument {
		t.Errorf("histogram get: %d, want BadArgument", st)
	}
}

func TestChunks(t *testing.T) {
	body := []byte("abcdefg")
	tests := []struct {
		size int
		want []string
	}{
		{0, []string{"abcdefg"}},
		{3, []string{"abc", "def", "g"}},
		{7, []string{"abcdefg"}},
		{100, []string{"abcdefg"}},
	}
	for _, tt := range tests {
		var got []string
		for i, c := range chunks(body, tt.size) {
			got = append(got, string(c.data))
			if c.last != (i == len(tt.want)-1) {
				t.Errorf("size %d: chunk %d last=%v", tt.size, i, c.last)
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("size %d: %q, want %q", tt.size, got, tt.want)
		}
	}
	if chunks(nil, 3) != nil {
		t.Error("an empty body has chunks")
	}
}

func TestLogSinkKeepsNewestLines(t *testing.T) {
	var l logSink
	for i := range 3 * maxLogLines {
		l.add("info", string(rune('a'+i%26)))
	}
	got := l.snapshot()
	if len(got) != maxLogLines || got[len(got)-1] != "info: "+string(rune('a'+(3*maxLogLines-1)%26)) {
		t.Errorf("%d lines kept, last %q", len(got), got[len(got)-1])
	}
	var w lineWriter
	w.sink, w.level = &l, "error"
	w.Write([]byte("panic: x"))
	w.Write([]byte("yz\ngoroutine 1"))
	w.flush()
	got = l.snapshot()
	if !slices.Equal(got[len(got)-2:], []string{"error: panic: xyz", "error: goroutine 1"}) {
		t.Errorf("stderr lines %q", got[len(got)-2:])
	}
}
