package epp

import (
	"encoding/binary"
	"fmt"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/epp/scheduling"
)

// stateHolder is a plugin whose learned state replicas exchange, by name.
type stateHolder struct {
	name string
	scheduling.StateHolder
}

// addPending accounts, until the next scrape shows it, for the KV a
// request will take on e, estimating its tokens from its prompt's bytes
// (the whole body would let padding in any other field make idle servers
// look saturated and shed sheddable traffic) with the server's own
// tokenizer ratio, learned by the prefix producer.
func addPending(e *datastore.Endpoint, promptBytes int) {
	e.AddPending(int(float64(promptBytes) / e.BytesPerToken()))
}

// SetPeers makes the picker tell s every decision; call it before serving.
func (p *Picker) SetPeers(s Sharer) { p.opts.Peers = s }

// PeerPicked learns a decision another replica made: the plugins that
// learn from picks, and the endpoint's pending KV until its next scrape,
// so that every replica's load estimate counts every replica's traffic.
func (p *Picker) PeerPicked(d scheduling.Shared) {
	for _, o := range p.peers {
		o.PeerPicked(d)
	}
	if d.From != "" {
		return
	}
	if e := p.opts.Store.Get(d.Endpoint); e != nil {
		addPending(e, d.PromptBytes)
	}
}

// AppendState appends what this replica learned (the plugins' states, by
// plugin name) for a replica that joins.
func (p *Picker) AppendState(dst []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(p.holders)))
	for _, h := range p.holders {
		dst = binary.AppendUvarint(dst, uint64(len(h.name)))
		dst = append(dst, h.name...)
		state := h.AppendState(nil)
		dst = binary.AppendUvarint(dst, uint64(len(state)))
		dst = append(dst, state...)
	}
	return dst
}

// MergeState merges a peer's state into the plugins of the same name; a
// plugin this replica does not run (another configuration) is skipped.
func (p *Picker) MergeState(b []byte) error {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return fmt.Errorf("picker state: truncated")
	}
	b = b[k:]
	for range n {
		name, rest, err := chunk(b)
		if err != nil {
			return fmt.Errorf("picker state: plugin name: %w", err)
		}
		state, rest, err := chunk(rest)
		if err != nil {
			return fmt.Errorf("picker state: plugin %s: %w", name, err)
		}
		b = rest
		for _, h := range p.holders {
			if h.name == string(name) {
				if err := h.MergeState(state); err != nil {
					return fmt.Errorf("picker state: plugin %s: %w", name, err)
				}
			}
		}
	}
	return nil
}

// chunk reads a length-prefixed byte string.
func chunk(b []byte) (data, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, fmt.Errorf("truncated")
	}
	return b[k : k+int(n)], b[k+int(n):], nil
}
