package wasmtest

import (
	"bytes"
	"io"
)

// maxLogLines bounds the in-memory log so that a soak test of a chatty plugin does not turn into a
// host-side leak; the oldest lines are dropped first.
const maxLogLines = 10000

type logSink struct {
	w     io.Writer
	lines []string
}

func (l *logSink) add(level, msg string) {
	line := level + ": " + msg
	if l.w != nil {
		// A failing writer must not fail the guest call that logged.
		_, _ = io.WriteString(l.w, line+"\n")
	}
	l.lines = append(l.lines, line)
	if len(l.lines) >= 2*maxLogLines {
		n := copy(l.lines, l.lines[len(l.lines)-maxLogLines:])
		clear(l.lines[n:])
		l.lines = l.lines[:n]
	}
}

func (l *logSink) snapshot() []string {
	lines := l.lines
	if len(lines) > maxLogLines {
		lines = lines[len(lines)-maxLogLines:]
	}
	return append([]string(nil), lines...)
}

// lineWriter turns the guest's WASI stdout or stderr into log lines. Go's runtime prints a panic in
// many small writes; joining them per line keeps one message per line.
type lineWriter struct {
	sink    *logSink
	level   string
	partial []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.sink.add(w.level, string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	if len(w.partial) == 0 {
		w.partial = nil
	}
	return len(p), nil
}

func (w *lineWriter) flush() {
	if len(w.partial) > 0 {
		w.sink.add(w.level, string(w.partial))
		w.partial = nil
	}
}
