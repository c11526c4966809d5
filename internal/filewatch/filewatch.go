// Package filewatch polls a file and calls back when it changes. Polling
// (not inotify) because Kubernetes updates mounted ConfigMaps by swapping a
// symlink, which inotify watches on the file miss; a stat per second is free.
package filewatch

import (
	"context"
	"os"
	"time"
)

// Stamp identifies a version of a file.
type Stamp struct {
	modTime time.Time
	size    int64
}

// StampOf returns the file's current stamp.
func StampOf(path string) (Stamp, error) {
	st, err := os.Stat(path)
	if err != nil {
		return Stamp{}, err
	}
	return Stamp{st.ModTime(), st.Size()}, nil
}

// Watch checks path every interval until ctx ends and calls changed when
// its stamp differs from since (the stamp of the version already loaded)
// and has stayed the same for one more interval: a writer that truncates
// and rewrites in place is not read half-way (a half-written policy could
// parse and drop guardrails). The stamp moves on even if changed fails,
// so one broken edit is reported once, not every tick.
func Watch(ctx context.Context, path string, since Stamp, every time.Duration, changed func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	var pending Stamp
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := StampOf(path)
		switch {
		case err != nil || st == since:
			pending = Stamp{}
		case st != pending:
			pending = st // changed since the last look: let it settle
		default:
			since, pending = st, Stamp{}
			changed()
		}
	}
}
