package peers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/infergate/infergate/extproc/epp/scheduling"
)

// A batch is what one flush sends a peer:
//
//	version (1 byte) | sent at, Unix ns (8 bytes LE) | count (uvarint) | decisions
//
// and a decision:
//
//	endpoint, from (uvarint length + bytes each) | prompt bytes, held (uvarint)
//	| cold (1 byte) | hash count (uvarint) | hashes (8 bytes LE each)
//
// A replica refuses a batch of another version: replicas of two versions
// in one rollout keep routing, each on its own learning, until the
// rollout ends.
const batchVersion = 1

// encodeBatch encodes decisions until the batch would pass limit bytes (at
// least one decision goes in each batch) and returns the rest.
func encodeBatch(ds []scheduling.Shared, now time.Time, limit int) ([]byte, []scheduling.Shared) {
	b := make([]byte, 0, 256)
	b = append(b, batchVersion)
	b = binary.LittleEndian.AppendUint64(b, uint64(now.UnixNano()))
	n := 0
	body := make([]byte, 0, 256)
	for _, d := range ds {
		if n > 0 && len(b)+len(body)+decisionSize(d) > limit {
			break
		}
		body = appendDecision(body, d)
		n++
	}
	b = binary.AppendUvarint(b, uint64(n))
	return append(b, body...), ds[n:]
}

func decisionSize(d scheduling.Shared) int {
	return len(d.Endpoint) + len(d.From) + 8*len(d.Hashes) + 5*binary.MaxVarintLen64
}

func appendDecision(b []byte, d scheduling.Shared) []byte {
	b = binary.AppendUvarint(b, uint64(len(d.Endpoint)))
	b = append(b, d.Endpoint...)
	b = binary.AppendUvarint(b, uint64(len(d.From)))
	b = append(b, d.From...)
	b = binary.AppendUvarint(b, uint64(max(d.PromptBytes, 0)))
	b = binary.AppendUvarint(b, uint64(max(d.Held, 0)))
	cold := byte(0)
	if d.Cold {
		cold = 1
	}
	b = append(b, cold)
	b = binary.AppendUvarint(b, uint64(len(d.Hashes)))
	for _, h := range d.Hashes {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// countOf is the number of decisions in an encoded batch.
func countOf(b []byte) int {
	if len(b) < 9 {
		return 0
	}
	n, k := binary.Uvarint(b[9:])
	if k <= 0 {
		return 0
	}
	return int(n)
}

var errTruncated = errors.New("truncated")

// decodeBatch decodes a batch, every length checked against what is left.
func decodeBatch(b []byte) (time.Time, []scheduling.Shared, error) {
	if len(b) < 9 {
		return time.Time{}, nil, errTruncated
	}
	if b[0] != batchVersion {
		return time.Time{}, nil, fmt.Errorf("batch version %d, want %d", b[0], batchVersion)
	}
	sent := time.Unix(0, int64(binary.LittleEndian.Uint64(b[1:9])))
	r := reader{b: b[9:]}
	n := r.uvarint()
	// A decision takes at least 6 bytes: two empty strings, two numbers,
	// the flag and a hash count.
	if r.err == nil && n > uint64(len(r.b)/6) {
		return sent, nil, fmt.Errorf("%d decisions in %d bytes", n, len(r.b))
	}
	out := make([]scheduling.Shared, 0, n)
	for i := uint64(0); i < n && r.err == nil; i++ {
		var d scheduling.Shared
		d.Endpoint = r.string()
		d.From = r.string()
		d.PromptBytes = r.int()
		d.Held = r.int()
		d.Cold = r.byte() == 1
		d.Hashes = r.hashes()
		out = append(out, d)
	}
	if r.err != nil {
		return sent, nil, fmt.Errorf("decision %d: %w", len(out), r.err)
	}
	if len(r.b) != 0 {
		return sent, nil, fmt.Errorf("%d bytes after the last decision", len(r.b))
	}
	return sent, out, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.err = errTruncated
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *reader) int() int {
	v := r.uvarint()
	if v > 1<<40 {
		r.err = fmt.Errorf("number %d out of range", v)
		return 0
	}
	return int(v)
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) == 0 {
		if r.err == nil {
			r.err = errTruncated
		}
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) string() string {
	n := r.uvarint()
	if r.err == nil && n > uint64(len(r.b)) {
		r.err = errTruncated
	}
	if r.err != nil {
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *reader) hashes() []uint64 {
	n := r.uvarint()
	if r.err == nil && n > uint64(len(r.b)/8) {
		r.err = errTruncated
	}
	if r.err != nil || n == 0 {
		return nil
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(r.b[8*i:])
	}
	r.b = r.b[8*n:]
	return out
}
