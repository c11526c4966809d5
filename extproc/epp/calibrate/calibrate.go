// Package calibrate learns, per model server, what the picker cannot see
// from prompts alone: how many prompt bytes make one of the server's
// tokens, and how close the picker's prefix index comes to the server's
// own prefix-cache hits. It compares what the picker routed to a server
// between two scrapes with the server's cumulative counters
// (vllm:prompt_tokens_total, vllm:prefix_cache_queries_total and _hits).
//
// Tokenizers differ from about 2 bytes per token (code, CJK, numbers) to 6
// or more (long English words). The index is sized in the server's KV
// blocks, so a fixed guess makes it forget prefixes long before (or after)
// the server evicts them, and requests for a prefix the index forgot may
// go to a server that never held it.
package calibrate

import (
	"sync"
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/inference/wire"
)

const (
	// MinTokens is how many of a server's prompt tokens must be matched
	// with routed bytes before its ratio is trusted; until then the
	// default holds. 16,384 tokens is eight 2,048-token prompts.
	MinTokens = 16384
	// window bounds the memory of the sums: once the tokens counted pass
	// it, both sums are halved, so the estimate follows a change of model
	// or traffic within a few windows.
	window = 1 << 20
	// minRatio and maxRatio bound a learned ratio to what tokenizers
	// give: outside, the counters and the routed bytes do not describe
	// the same requests (another router sends to the server too, or the
	// server restarted between scrapes).
	minRatio, maxRatio = 1.0, 16.0
)

// Learner holds the per-server sums; safe for concurrent use.
type Learner struct {
	mu      sync.Mutex
	servers map[string]*server
}

// New returns an empty Learner.
func New() *Learner { return &Learner{servers: map[string]*server{}} }

// server is what is known of one server.
type server struct {
	// Since the last scrape taken: prompt bytes routed, and of those the
	// bytes the index expected the server to hold.
	routed, predicted float64
	last              datastore.TokenCounters
	lastAt            time.Time
	seen              bool
	// Windowed sums: routed bytes and the server's prompt tokens; the
	// index's predicted hit bytes and the prompt bytes they are of; the
	// server's prefix-cache hits and queries (tokens).
	bytes, tokens      float64
	predHit, predTotal float64
	hits, queries      float64
	used               time.Time
}

// Routed records a request sent to addr: its prompt bytes, and how many of
// them the prefix index expected the server to hold already. A negative
// count takes back a request that another server served instead.
func (l *Learner) Routed(addr string, promptBytes, predictedHitBytes int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.server(addr)
	s.routed = max(s.routed+float64(promptBytes), 0)
	s.predicted = max(s.predicted+float64(predictedHitBytes), 0)
}

func (l *Learner) server(addr string) *server {
	s := l.servers[addr]
	if s == nil {
		s = &server{}
		l.servers[addr] = s
	}
	s.used = time.Now()
	return s
}

// Estimate is what is known of one server.
type Estimate struct {
	// BytesPerToken is the learned ratio, 0 until MinTokens were matched.
	BytesPerToken float64
	// Counted says the server reports its prompt tokens at all.
	Counted bool
	// PredictedHitRate is the share of the prompt bytes routed to the
	// server that the index expected it to hold; ServerHitRate the share
	// of prompt tokens the server found in its prefix cache; each -1 until
	// MinTokens were counted (or, for the server's, when it reports no
	// prefix-cache counters).
	PredictedHitRate, ServerHitRate float64
}

// Observe takes a scrape of addr's counters made at at; the same scrape
// seen again changes nothing. It reports the estimate and whether this
// call took a new scrape.
func (l *Learner) Observe(addr string, c datastore.TokenCounters, at time.Time) (Estimate, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.server(addr)
	if s.seen && !at.After(s.lastAt) {
		return s.estimate(c), false
	}
	prev, first := s.last, !s.seen
	s.last, s.lastAt, s.seen = c, at, true
	routed, predicted := s.routed, s.predicted
	s.routed, s.predicted = 0, 0
	// The first scrape is the baseline: bytes routed before it are in
	// counters already.
	if first {
		return s.estimate(c), true
	}
	if c.Prompt >= 0 && prev.Prompt >= 0 {
		if dt := c.Prompt - prev.Prompt; dt >= 0 {
			s.bytes += routed
			s.tokens += dt
			if s.tokens > window {
				s.bytes, s.tokens = s.bytes/2, s.tokens/2
			}
		}
		// A counter that went down is a restarted server: this scrape is
		// its new baseline.
	}
	s.predHit += predicted
	s.predTotal += routed
	if s.predTotal > window*wire.DefaultBytesPerToken {
		s.predHit, s.predTotal = s.predHit/2, s.predTotal/2
	}
	if c.PrefixQueries >= 0 && prev.PrefixQueries >= 0 && c.PrefixHits >= 0 && prev.PrefixHits >= 0 {
		dq, dh := c.PrefixQueries-prev.PrefixQueries, c.PrefixHits-prev.PrefixHits
		if dq >= 0 && dh >= 0 && dh <= dq {
			s.queries += dq
			s.hits += dh
			if s.queries > window {
				s.queries, s.hits = s.queries/2, s.hits/2
			}
		}
	}
	return s.estimate(c), true
}

func (s *server) estimate(c datastore.TokenCounters) Estimate {
	e := Estimate{Counted: c.Prompt >= 0, PredictedHitRate: -1, ServerHitRate: -1}
	if s.tokens >= MinTokens && s.bytes > 0 {
		e.BytesPerToken = min(max(s.bytes/s.tokens, minRatio), maxRatio)
	}
	if s.predTotal >= MinTokens*wire.DefaultBytesPerToken {
		e.PredictedHitRate = s.predHit / s.predTotal
	}
	if s.queries >= MinTokens {
		e.ServerHitRate = s.hits / s.queries
	}
	return e
}

// Estimates reports every server's estimate, by address.
func (l *Learner) Estimates() map[string]Estimate {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]Estimate, len(l.servers))
	for addr, s := range l.servers {
		out[addr] = s.estimate(s.last)
	}
	return out
}

// Prune forgets servers not routed to or observed since cutoff (gone from
// the pool).
func (l *Learner) Prune(cutoff time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for addr, s := range l.servers {
		if s.used.Before(cutoff) {
			delete(l.servers, addr)
		}
	}
}
