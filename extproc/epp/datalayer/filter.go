package datalayer

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// familyFilter passes the parser only the lines of the metric families a
// mapping reads: their # HELP and # TYPE lines and their samples. A vLLM
// page is ~100 KiB, mostly histograms the picker never reads, and parsing
// all of it was most of a scrape's CPU. A line that does not start with a
// metric name passes, so that text which is not the exposition format
// still fails to parse.
type familyFilter struct {
	r    *bufio.Reader
	want func(name []byte) bool
	line []byte // the rest of a kept line not yet read
	// keeping and skipping: the line being read is longer than r's buffer
	// and so far kept, or skipped.
	keeping, skipping bool
	err               error
}

func newFamilyFilter(r io.Reader, want func([]byte) bool) *familyFilter {
	return &familyFilter{r: bufio.NewReaderSize(r, 16<<10), want: want}
}

func (f *familyFilter) Read(p []byte) (int, error) {
	for len(f.line) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		frag, err := f.r.ReadSlice('\n')
		full := errors.Is(err, bufio.ErrBufferFull)
		if err != nil && !full {
			f.err = err
		}
		switch {
		case f.skipping || f.keeping:
			// The rest of a long line takes its start's fate.
		default:
			f.keeping = f.keep(frag)
			f.skipping = !f.keeping
		}
		if f.keeping {
			f.line = frag
		}
		if !full {
			f.keeping, f.skipping = false, false
		}
	}
	n := copy(p, f.line)
	f.line = f.line[n:]
	return n, nil
}

// keep reports whether a line (or a long line's start) is for the parser.
func (f *familyFilter) keep(line []byte) bool {
	if rest, ok := bytes.CutPrefix(line, []byte("#")); ok {
		rest = bytes.TrimLeft(rest, " \t")
		for _, kw := range [][]byte{[]byte("HELP"), []byte("TYPE")} {
			if r, ok := bytes.CutPrefix(rest, kw); ok && len(r) > 0 && (r[0] == ' ' || r[0] == '\t') {
				name, ok := metricName(bytes.TrimLeft(r, " \t"))
				return !ok || f.want(name)
			}
		}
		return false // another comment
	}
	if len(bytes.TrimSpace(line)) == 0 {
		return false
	}
	name, ok := metricName(line)
	return !ok || f.want(name)
}

// metricName is the metric name that starts b, if b starts with one
// followed by a label set, a space or the line's end. It is b's own bytes:
// a scrape reads every line, and a string for each would be garbage.
func metricName(b []byte) ([]byte, bool) {
	i := 0
	for i < len(b) && (b[i] == '_' || b[i] == ':' || b[i] >= 'a' && b[i] <= 'z' || b[i] >= 'A' && b[i] <= 'Z' || i > 0 && b[i] >= '0' && b[i] <= '9') {
		i++
	}
	if i == 0 || i < len(b) && b[i] != '{' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		return nil, false
	}
	return b[:i], true
}
