package scheduling

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/inference/wire"
)

// SharedOf is the decision to tell the other replicas: req's prompt went
// to endpoint, as the prefix producer saw it.
func SharedOf(req *Request, endpoint string) Shared {
	d := Shared{Endpoint: endpoint}
	if req.Body != nil {
		d.PromptBytes = req.PromptLen()
	}
	if m := prefixMatchOf(req); m != nil {
		d.Hashes, d.Held, d.Cold = m.Hashes, m.Blocks[endpoint], m.Cold()
	}
	return d
}

// peerCounts counts the peers' decisions by whether this replica's index
// already agreed with the sender's on how much of the prompt the endpoint
// held: how alike the replicas' views are.
type peerCounts struct {
	agreed, differed atomic.Uint64
}

var peerDecisionsDesc = prometheus.NewDesc("infergate_epp_peer_decisions_total",
	"Routing decisions learned from the picker's other replicas, by whether this replica's prefix index held as much of the prompt on the chosen endpoint as the sender's did (index=agreed) or not (index=differed).",
	[]string{"index"}, nil)

// PeerPicked learns what a peer replica routed, as Picked and Served
// learn this replica's own decisions.
func (p *prefixProducer) PeerPicked(d Shared) {
	if d.Endpoint == "" {
		return
	}
	if d.PromptBytes > 0 {
		if d.From != "" {
			p.learner.Routed(d.From, -d.PromptBytes, 0)
		}
		p.learner.Routed(d.Endpoint, d.PromptBytes, d.Held*p.blockTokens*wire.DefaultBytesPerToken)
	}
	if len(d.Hashes) == 0 {
		return
	}
	if d.From == "" {
		if p.index.Match(d.Endpoint, d.Hashes) == d.Held {
			p.peers.agreed.Add(1)
		} else {
			p.peers.differed.Add(1)
		}
	}
	p.index.Add(d.Endpoint, d.Hashes)
}

// stateVersion prefixes the producer's state; a replica refuses state of
// another version rather than misread it.
const stateVersion = 1

// maxStateBlocks bounds the blocks given to a joining replica (8 bytes
// each): memberlist refuses a state over 20 MiB.
const maxStateBlocks = 2 << 20

// AppendState appends the prefix index: per endpoint its capacity and its
// blocks, most recently used first, so that a replica that merges it
// keeps the order in which they would be evicted.
func (p *prefixProducer) AppendState(dst []byte) []byte {
	addrs := p.index.Stats()
	per := maxStateBlocks
	if len(addrs) > 0 {
		per = maxStateBlocks / len(addrs)
	}
	dst = append(dst, stateVersion)
	dst = binary.AppendUvarint(dst, uint64(len(addrs)))
	for addr := range addrs {
		hashes := p.index.Recent(addr, per)
		dst = binary.AppendUvarint(dst, uint64(len(addr)))
		dst = append(dst, addr...)
		dst = binary.AppendUvarint(dst, uint64(p.index.Capacity(addr)))
		dst = binary.AppendUvarint(dst, uint64(len(hashes)))
		for _, h := range hashes {
			dst = binary.LittleEndian.AppendUint64(dst, h)
		}
	}
	return dst
}

// MergeState adds a peer's index behind what this one learned itself: an
// endpoint this replica has not sized yet takes the peer's capacity until
// its own scrape sizes it.
func (p *prefixProducer) MergeState(b []byte) error {
	r := stateReader{b: b}
	if v := r.byte(); r.err == nil && v != stateVersion {
		return fmt.Errorf("prefix state version %d, want %d", v, stateVersion)
	}
	n := r.count(2) // at least an address length and a capacity each
	for i := 0; i < n && r.err == nil; i++ {
		addr := r.string()
		capacity := r.uvarint()
		hashes := r.hashes()
		if r.err != nil {
			break
		}
		if addr == "" {
			return errors.New("prefix state: an endpoint without an address")
		}
		if p.index.Capacity(addr) == 0 && capacity > 0 {
			p.index.SetCapacity(addr, int(min(capacity, maxStateBlocks)))
		}
		p.index.AddOlder(addr, hashes)
	}
	if r.err != nil {
		return fmt.Errorf("prefix state: %w", r.err)
	}
	return nil
}

// stateReader decodes state, every length checked against what is left.
type stateReader struct {
	b   []byte
	err error
}

var errShort = errors.New("truncated")

func (r *stateReader) byte() byte {
	if r.err != nil || len(r.b) == 0 {
		r.fail(errShort)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *stateReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(errShort)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a count of items at least minBytes long each.
func (r *stateReader) count(minBytes int) int {
	n := r.uvarint()
	if r.err == nil && n > uint64(len(r.b)/minBytes) {
		r.fail(fmt.Errorf("%d items in %d bytes", n, len(r.b)))
		return 0
	}
	return int(n)
}

func (r *stateReader) string() string {
	n := r.count(1)
	if r.err != nil {
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *stateReader) hashes() []uint64 {
	n := r.count(8)
	if r.err != nil {
		return nil
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(r.b[i*8:])
	}
	r.b = r.b[n*8:]
	return out
}

func (r *stateReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// PeerPicked keeps the order of cold picks the peers made too, so that new
// prefixes keep partitioning the pool whichever replica sees them first.
func (s *noHitLRUScorer) PeerPicked(d Shared) {
	if d.Cold && d.From == "" && d.Endpoint != "" {
		s.coldPick(d.Endpoint, len(d.Hashes), 0)
	}
}

// EngineCleared forgets the endpoint's blocks: its engine's cache is empty.
func (p *prefixProducer) EngineCleared(addr string) { p.index.Clear(addr) }
