package datalayer

import (
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// logState rate-limits the failure logs of one endpoint: a scrape fails up
// to 20 times a second, and a dead pod must not flood the log.
type logState struct {
	failing    bool
	failures   int // in the current run of failures
	suppressed int // failures not logged since the last line
	lastLogged time.Time
}

// logFailure logs the first failure of a run, then at most one line per
// LogEvery, telling how many failures it did not log.
func (s *Scraper) logFailure(e *datastore.Endpoint, err error) {
	now := time.Now()
	s.mu.Lock()
	st := s.logs[e]
	if st == nil {
		st = &logState{}
		s.logs[e] = st
	}
	st.failures++
	if st.failing && now.Sub(st.lastLogged) < s.opts.LogEvery {
		st.suppressed++
		s.mu.Unlock()
		return
	}
	suppressed := st.suppressed
	st.failing, st.suppressed, st.lastLogged = true, 0, now
	s.mu.Unlock()
	s.opts.Logger.Error(err, "Scraping endpoint metrics failed",
		"endpoint", e.Name, "address", e.Address, "engine", e.Engine, "suppressed", suppressed)
}

// logRecovery logs once when a failing endpoint scrapes again.
func (s *Scraper) logRecovery(e *datastore.Endpoint) {
	s.mu.Lock()
	st := s.logs[e]
	if st == nil || !st.failing {
		s.mu.Unlock()
		return
	}
	failures := st.failures
	delete(s.logs, e)
	s.mu.Unlock()
	s.opts.Logger.Info("Scraping endpoint metrics recovered",
		"endpoint", e.Name, "address", e.Address, "failures", failures)
}

// forget drops the log state of an endpoint whose loop stopped.
func (s *Scraper) forget(e *datastore.Endpoint) {
	s.mu.Lock()
	delete(s.logs, e)
	s.mu.Unlock()
}
