// Package scheduling picks endpoints for a request: each profile filters the
// candidates, scores the survivors with weighted scorers and lets a picker
// choose; a profile handler decides which profiles run and which result is
// primary. Plugin type names and semantics follow the inference-extension
// scheduler so existing EndpointPickerConfig files keep their meaning.
package scheduling

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/go-logr/logr"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/inference"
)

// Request is what scheduling knows of an inference request.
type Request struct {
	ID string
	// Model is the model named in the body (a base model or a LoRA adapter);
	// empty for body-less requests.
	Model   string
	Headers map[string]string
	// Body is the raw request body (nil for body-less requests); plugins
	// that need the prompt call Prompt, which parses it once.
	Body []byte
	// Parsed is Body already validated, when the caller has it: Prompt
	// reads it instead of scanning Body again.
	Parsed *inference.Body
	prompt *string
	// promptLen is the prompt's length once ForgetPrompt has let go of
	// its text.
	promptLen int
	forgotten bool
	// attrs are few (a producer or two each store one), so a slice
	// searched in order costs less than a map made for every request.
	attrs []attr
	// Priority comes from the request's objective; < 0 may be shed.
	Priority   int
	FairnessID string
}

// Prompt returns the request's prompt text, parsing the body on first use
// so that profiles that never look at it never pay for it.
func (r *Request) Prompt() string {
	if r.forgotten {
		return ""
	}
	if r.prompt == nil {
		p := ""
		if r.Parsed != nil {
			p = r.Parsed.Prompt()
		} else if parsed, err := inference.ParseRequest(r.Body); err == nil {
			p = parsed.Prompt
		}
		r.prompt = &p
	}
	return *r.prompt
}

// PromptLen is the length of the prompt text, also after ForgetPrompt.
func (r *Request) PromptLen() int {
	if r.forgotten {
		return r.promptLen
	}
	return len(r.Prompt())
}

// ForgetPrompt lets go of the prompt's text once the request is decided,
// keeping its length for what is told after (Served): the request lives
// as long as its response streams, minutes, and its prompt, nearly the
// size of its body, would stay in memory outside the buffer budget all
// that time. Prompt is empty after it.
func (r *Request) ForgetPrompt() {
	if r.prompt != nil {
		r.promptLen, r.prompt, r.forgotten = len(*r.prompt), nil, true
	}
}

// Attr returns what a plugin stored for this request under key (producers
// leave their results here for filters and scorers), or nil.
func (r *Request) Attr(key string) any {
	for _, a := range r.attrs {
		if a.key == key {
			return a.value
		}
	}
	return nil
}

// SetAttr stores a per-request value for other plugins.
func (r *Request) SetAttr(key string, v any) {
	for i := range r.attrs {
		if r.attrs[i].key == key {
			r.attrs[i].value = v
			return
		}
	}
	r.attrs = append(r.attrs, attr{key, v})
}

// attr is one value a plugin stored for a request.
type attr struct {
	key   string
	value any
}

// Endpoint is a candidate as one scheduling cycle sees it.
type Endpoint struct {
	*datastore.Endpoint
	// Metrics are the endpoint's fresh metrics, nil when unknown or stale.
	Metrics *datastore.Metrics
}

// Plugin is anything configurable in a profile.
type Plugin interface {
	// Type is the plugin's type name, e.g. "queue-scorer".
	Type() string
	// Name is the instance name from the config (defaults to the type).
	Name() string
}

// Filter narrows the candidates. An empty result ends the profile.
type Filter interface {
	Plugin
	Filter(ctx context.Context, req *Request, eps []Endpoint) []Endpoint
}

// Scorer rates each candidate; scores[i] belongs to eps[i] and is clamped
// to [0,1] by the framework.
type Scorer interface {
	Plugin
	Score(ctx context.Context, req *Request, eps []Endpoint, scores []float64)
}

// Picker chooses from scored candidates, best first.
type Picker interface {
	Plugin
	Pick(ctx context.Context, scored []Scored) []Scored
}

// Producer computes per-request data (e.g. prefix matches) once, before
// any profile runs, for the filters and scorers that consume it.
type Producer interface {
	Plugin
	Produce(ctx context.Context, req *Request, eps []Endpoint)
}

// PickObserver is told the outcome of each successful scheduling decision.
type PickObserver interface {
	Picked(ctx context.Context, req *Request, res *Result)
}

// ServedObserver learns from the endpoint that actually served a request,
// as the proxy reports it on the response path; it may differ from the
// pick after a retry or failover.
type ServedObserver interface {
	Served(ctx context.Context, req *Request, picked []string, served string)
}

// Shared is a routing decision as the picker's replicas tell each other,
// so that each learns from every replica's traffic what it would have
// learned had it routed it all.
type Shared struct {
	// Endpoint took the request's prompt; From, when set, is the endpoint
	// it was picked for and did not take (the proxy served it elsewhere).
	Endpoint, From string
	// Hashes are the prompt's blocks as the prefix producer hashed them.
	Hashes []uint64
	// PromptBytes is the prompt's length; Held how many of its blocks the
	// sender believed Endpoint held; Cold that no candidate held any.
	PromptBytes int
	Held        int
	Cold        bool
}

// PeerObserver learns from the decisions of the picker's other replicas.
type PeerObserver interface {
	PeerPicked(d Shared)
}

// StateHolder gives its learned state to a replica that joins, and merges
// a peer's into its own without losing what it learned itself.
type StateHolder interface {
	AppendState(dst []byte) []byte
	MergeState(b []byte) error
}

// CacheClearer forgets what it believed an endpoint's KV cache held, when
// the endpoint's engine says it cleared it or restarted.
type CacheClearer interface {
	EngineCleared(addr string)
}

// Logging is implemented by plugins that log; the picker gives them its
// logger when it is built.
type Logging interface {
	SetLogger(log logr.Logger)
}

// ProfileHandler chooses the profiles to run and the primary result.
type ProfileHandler interface {
	Plugin
	// Profiles returns the profiles to run next given the results so far;
	// none means scheduling is done.
	Profiles(ctx context.Context, req *Request, all map[string]*Profile, done map[string]*ProfileResult) []*Profile
	// Primary names the profile whose targets answer the request.
	Primary(done map[string]*ProfileResult) (string, error)
}

// Scored is a candidate with its weighted total score.
type Scored struct {
	Endpoint
	Score float64
}

// WeightedScorer is a scorer with its profile weight.
type WeightedScorer struct {
	Scorer
	Weight float64
}

// Profile is one filter → score → pick pipeline.
type Profile struct {
	Name    string
	Filters []Filter
	Scorers []WeightedScorer
	Picker  Picker
}

// ProfileResult is what one profile chose, best first.
type ProfileResult struct {
	Targets []Scored
	// Candidates are all scored endpoints (in no particular order), kept so
	// a decision can be explained (--emit-endpoint-scores).
	Candidates []Scored
}

// Result is the outcome of one scheduling decision.
type Result struct {
	Primary  string
	Profiles map[string]*ProfileResult
}

// Targets returns the primary profile's targets.
func (r *Result) Targets() []Scored { return r.Profiles[r.Primary].Targets }

// ErrNoCandidates means filters left nothing to pick from.
var ErrNoCandidates = errors.New("no candidate endpoints left after filtering")

// Scheduler runs producers, then profiles, over candidates.
type Scheduler struct {
	Producers []Producer
	Handler   ProfileHandler
	Profiles  map[string]*Profile
}

// Plugins lists every plugin instance the scheduler uses, once each.
func (s *Scheduler) Plugins() []Plugin {
	seen := map[Plugin]bool{}
	var out []Plugin
	add := func(p Plugin) {
		if p != nil && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, p := range s.Producers {
		add(p)
	}
	add(s.Handler)
	for _, name := range slices.Sorted(maps.Keys(s.Profiles)) {
		prof := s.Profiles[name]
		for _, f := range prof.Filters {
			add(f)
		}
		for _, ws := range prof.Scorers {
			add(ws.Scorer)
		}
		add(prof.Picker)
	}
	return out
}

// Schedule picks endpoints for req among eps.
func (s *Scheduler) Schedule(ctx context.Context, req *Request, eps []Endpoint) (*Result, error) {
	if len(eps) == 0 {
		return nil, ErrNoCandidates
	}
	for _, p := range s.Producers {
		p.Produce(ctx, req, eps)
	}
	done := map[string]*ProfileResult{}
	for {
		next := s.Handler.Profiles(ctx, req, s.Profiles, done)
		if len(next) == 0 {
			break
		}
		for _, p := range next {
			r, err := p.Run(ctx, req, eps)
			if err != nil {
				return nil, fmt.Errorf("profile %s: %w", p.Name, err)
			}
			done[p.Name] = r
		}
	}
	primary, err := s.Handler.Primary(done)
	if err != nil {
		return nil, err
	}
	return &Result{Primary: primary, Profiles: done}, nil
}

// Run executes one profile.
func (p *Profile) Run(ctx context.Context, req *Request, eps []Endpoint) (*ProfileResult, error) {
	for _, f := range p.Filters {
		eps = f.Filter(ctx, req, eps)
		if len(eps) == 0 {
			return nil, fmt.Errorf("filter %s: %w", f.Name(), ErrNoCandidates)
		}
	}
	scored := make([]Scored, len(eps))
	for i := range eps {
		scored[i] = Scored{Endpoint: eps[i]}
	}
	buf := make([]float64, len(eps))
	for _, ws := range p.Scorers {
		clear(buf)
		ws.Score(ctx, req, eps, buf)
		for i, v := range buf {
			scored[i].Score += ws.Weight * clamp01(v)
		}
	}
	// Pickers may reorder scored in place; Candidates is documented as
	// unordered, so it can share the slice with the targets.
	targets := p.Picker.Pick(ctx, scored)
	if len(targets) == 0 {
		return nil, fmt.Errorf("picker %s: %w", p.Picker.Name(), ErrNoCandidates)
	}
	return &ProfileResult{Targets: targets, Candidates: scored}, nil
}

func clamp01(v float64) float64 {
	switch {
	case v != v: // NaN: a broken scorer must not win or poison the sum
		return 0
	case v < 0:
		return 0
	case v > 1:
		return 1
	}
	return v
}
