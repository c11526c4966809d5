package datalayer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// Failure reasons, the label of infergate_epp_scrape_failures_total.
const (
	ReasonConnect       = "connect"        // dial or connection error
	ReasonTimeout       = "timeout"        // no full answer within Timeout
	ReasonStatus        = "status"         // answer other than 200
	ReasonParse         = "parse"          // not Prometheus text, or too large
	ReasonMissingSeries = "missing_series" // waiting, running or KV usage absent
)

// ScrapeError is a failed scrape of a reachable or unreachable server.
type ScrapeError struct {
	Reason string // one of the Reason constants
	Err    error
}

func (e *ScrapeError) Error() string { return e.Reason + ": " + e.Err.Error() }
func (e *ScrapeError) Unwrap() error { return e.Err }

// acceptText asks for the classic text format, the one parsed here.
const acceptText = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

var errTooLarge = errors.New("metrics page too large")

// ScrapeOnce scrapes e once and publishes the outcome: new metrics, or the
// failure (the previous metrics stay; readers judge staleness from
// UpdatedAt). It returns the failure, a *ScrapeError when the server is to
// blame. When ctx ends during the scrape nothing is published: the endpoint
// was removed or the picker is stopping.
func (s *Scraper) ScrapeOnce(ctx context.Context, e *datastore.Endpoint) error {
	start := time.Now()
	m, err := s.scrape(ctx, e)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("scrape %s: %w", e.Address, ctx.Err())
		}
		err = fmt.Errorf("scrape %s: %w", e.Address, err)
		e.SetScrapeError(err.Error())
		if se, ok := errors.AsType[*ScrapeError](err); ok {
			s.failures.WithLabelValues(se.Reason).Inc()
		}
		s.logFailure(e, err)
		return err
	}
	// The start is when the values were at most this old.
	m.UpdatedAt = start
	e.SetMetrics(m)
	s.duration.Observe(time.Since(start).Seconds())
	s.logRecovery(e)
	return nil
}

// scrape fetches and maps e's metrics, within Timeout.
func (s *Scraper) scrape(ctx context.Context, e *datastore.Endpoint) (*datastore.Metrics, error) {
	mp, ok := mappingFor(e.Engine)
	if !ok {
		// The store validates engines, so this is a programming error;
		// not counted as the server's failure.
		return nil, fmt.Errorf("unknown engine %q", e.Engine)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()

	u := url.URL{Scheme: s.opts.Scheme, Host: e.Address, Path: s.opts.Path}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Accept", acceptText)
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, transportError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Drain a little so that the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, &ScrapeError{Reason: ReasonStatus, Err: fmt.Errorf("GET %s: %s", u.Redacted(), resp.Status)}
	}

	body := &bodyReader{r: resp.Body, max: s.maxBody}
	parser := expfmt.NewTextParser(model.UTF8Validation) // vLLM and SGLang names have colons
	fams, err := parser.TextToMetricFamilies(newFamilyFilter(body, mp.wants))
	switch {
	case errors.Is(body.err, errTooLarge):
		return nil, &ScrapeError{Reason: ReasonParse, Err: fmt.Errorf("%w: over %d bytes", errTooLarge, s.maxBody)}
	case body.err != nil:
		// The parser saw the reader fail, not bad text.
		return nil, transportError(fmt.Errorf("read body: %w", body.err))
	case err != nil:
		return nil, &ScrapeError{Reason: ReasonParse, Err: err}
	}
	return mp.extract(fams)
}

// transportError classifies a failed request or body read.
func transportError(err error) *ScrapeError {
	if ne, ok := errors.AsType[net.Error](err); errors.Is(err, context.DeadlineExceeded) || ok && ne.Timeout() {
		return &ScrapeError{Reason: ReasonTimeout, Err: err}
	}
	return &ScrapeError{Reason: ReasonConnect, Err: err}
}

// bodyReader bounds the body and remembers a read failure, so that a
// broken connection is not mistaken for bad text.
type bodyReader struct {
	r      io.Reader
	n, max int64
	err    error // first error other than io.EOF
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.n += int64(n); b.n > b.max {
		err = errTooLarge
	}
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}
