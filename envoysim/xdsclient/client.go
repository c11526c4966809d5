package xdsclient

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/go-logr/logr"
)

// Client is an ADS client for one node. Create it with New, add
// subscriptions with Subscribe, and keep it connected with Run.
type Client struct {
	cfg     Config
	handler Handler
	log     logr.Logger
	node    *corev3.Node
	running atomic.Bool

	mu   sync.Mutex
	subs map[string]*subscription
	// order holds type URLs in first-Subscribe order: after a reconnect the
	// requests go out in that order, as Envoy's mux re-sends them.
	order []string
	// stream is the stream in use; nil while disconnected.
	stream *adsStream
	// changed is closed and replaced whenever a response has been handled,
	// so WaitVersion can sleep without polling.
	changed chan struct{}
}

// subscription is one type's client-side xDS state. Guarded by Client.mu.
type subscription struct {
	wildcard bool
	names    []string // sorted, without duplicates; nil when wildcard

	version string // version_info of the last ACKed response
	// nonce of the last response of this type on the current stream; a
	// request with an older nonce is ignored by servers as stale.
	nonce           string
	lastError       string // empty when the last response was ACKed
	rejectedVersion string // version_info of the last NACKed response
	acks, nacks     int
	// repeats counts consecutive NACKs of the same version, to pace them.
	repeats int
}

// TypeStatus is one type's xDS state, for tests and diagnostics.
type TypeStatus struct {
	// Names are the subscribed resource_names, sorted; nil with Wildcard.
	Names    []string
	Wildcard bool
	// Version is the version_info of the last ACKed response ("" if none).
	Version string
	// Nonce is the nonce of the last response handled on the current
	// stream; it resets on reconnect.
	Nonce string
	// LastError is the error_detail.message of the last NACK, empty when
	// the last response was ACKed.
	LastError string
	// RejectedVersion is the version_info of the last NACKed response.
	RejectedVersion string
	// ACKs and NACKs count the responses accepted and rejected since New.
	ACKs, NACKs int
}

// NACKError is returned by WaitVersion when the awaited version was rejected.
type NACKError struct {
	TypeURL, Version, Message string
}

func (e *NACKError) Error() string {
	return fmt.Sprintf("xdsclient: %s version %q NACKed: %s", e.TypeURL, e.Version, e.Message)
}

// New returns a client for cfg that hands updates to h. It does not connect.
func New(cfg Config, h Handler) (*Client, error) {
	if h == nil {
		return nil, errors.New("xdsclient: nil Handler")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Client{
		cfg:     cfg,
		handler: h,
		log:     cfg.Logger.WithValues("xdsServer", cfg.Server),
		node: &corev3.Node{
			Id:            cfg.NodeID,
			Cluster:       cfg.NodeCluster,
			Metadata:      cfg.NodeMetadata,
			UserAgentName: UserAgentName,
		},
		subs:    map[string]*subscription{},
		changed: make(chan struct{}),
	}, nil
}

// Subscribe sets the resource names of typeURL. For LDS and CDS nil or
// empty names mean wildcard (every resource the server has for the node);
// for other types they mean none. When the set changed and a stream is up,
// a DiscoveryRequest with the new resource_names and the type's last ACKed
// version_info and response_nonce is queued. It never blocks: it may be
// called before Run, from any goroutine, and from inside Handler.Apply.
func (c *Client) Subscribe(typeURL string, names []string) {
	if typeURL == "" {
		c.log.Error(nil, "Subscribe with an empty type URL ignored")
		return
	}
	wildcard := len(names) == 0 && allowsWildcard(typeURL)
	var set []string
	if !wildcard {
		set = slices.Compact(slices.Sorted(slices.Values(names)))
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	sub, ok := c.subs[typeURL]
	if !ok {
		sub = &subscription{}
		c.subs[typeURL] = sub
		c.order = append(c.order, typeURL)
	} else if sub.wildcard == wildcard && slices.Equal(sub.names, set) {
		return
	}
	sub.wildcard, sub.names = wildcard, set
	if c.stream != nil {
		c.stream.enqueue(typeURL)
	}
}

// allowsWildcard reports whether empty resource_names mean "all" for a type.
// The xDS protocol gives LDS and CDS (and SRDS, which the stand-in does not
// use) that legacy wildcard meaning; for the rest Envoy never sends an empty
// list before a named one, and go-control-plane would read a first empty
// request as wildcard too.
func allowsWildcard(typeURL string) bool {
	return typeURL == ListenerType || typeURL == ClusterType
}

// Status returns every subscribed type's state, keyed by type URL.
func (c *Client) Status() map[string]TypeStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]TypeStatus, len(c.subs))
	for t, s := range c.subs {
		out[t] = s.status()
	}
	return out
}

func (s *subscription) status() TypeStatus {
	return TypeStatus{
		Names:           slices.Clone(s.names),
		Wildcard:        s.wildcard,
		Version:         s.version,
		Nonce:           s.nonce,
		LastError:       s.lastError,
		RejectedVersion: s.rejectedVersion,
		ACKs:            s.acks,
		NACKs:           s.nacks,
	}
}

// WaitVersion blocks until typeURL has ACKed version. It returns a
// *NACKError as soon as the type's last response carried that version and
// was NACKed, and ctx's error (with the type's state) when ctx ends first.
func (c *Client) WaitVersion(ctx context.Context, typeURL, version string) error {
	for {
		c.mu.Lock()
		changed := c.changed
		var st TypeStatus
		if s := c.subs[typeURL]; s != nil {
			st = s.status()
		}
		c.mu.Unlock()

		switch {
		case st.ACKs > 0 && st.Version == version:
			return nil
		case st.LastError != "" && st.RejectedVersion == version:
			return &NACKError{TypeURL: typeURL, Version: version, Message: st.LastError}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("xdsclient: waiting for %s version %q (ACKed %q, last NACK %q): %w",
				typeURL, version, st.Version, st.LastError, context.Cause(ctx))
		}
	}
}

// notifyLocked wakes WaitVersion callers. Callers hold c.mu.
func (c *Client) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}
