package wasmtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// headerMap is an ordered header list with Envoy's HeaderMap semantics for the calls the ABI exposes.
// Keys are stored lowercased, as Envoy's codecs and LowerCaseString do.
type headerMap [][2]string

func newHeaderMap(pairs [][2]string) headerMap {
	m := make(headerMap, 0, len(pairs))
	for _, p := range pairs {
		m = append(m, [2]string{strings.ToLower(p[0]), p[1]})
	}
	return m
}

func (m headerMap) clone() [][2]string {
	if m == nil {
		return nil
	}
	return append([][2]string(nil), m...)
}

// get returns the first value only: Envoy does the same (with a TODO about joining duplicates).
func (m headerMap) get(key string) (string, bool) {
	key = strings.ToLower(key)
	for _, p := range m {
		if p[0] == key {
			return p[1], true
		}
	}
	return "", false
}

func (m *headerMap) add(key, value string) {
	*m = append(*m, [2]string{strings.ToLower(key), value})
}

// replace leaves exactly one entry for key (Envoy's setCopy), keeping the first one's position so
// that tests comparing order are not surprised by a move.
func (m *headerMap) replace(key, value string) {
	key = strings.ToLower(key)
	out := (*m)[:0]
	found := false
	for _, p := range *m {
		if p[0] != key {
			out = append(out, p)
			continue
		}
		if !found {
			out = append(out, [2]string{key, value})
			found = true
		}
	}
	if !found {
		out = append(out, [2]string{key, value})
	}
	*m = out
}

func (m *headerMap) remove(key string) {
	key = strings.ToLower(key)
	out := (*m)[:0]
	for _, p := range *m {
		if p[0] != key {
			out = append(out, p)
		}
	}
	*m = out
}

// serializePairs encodes pairs in the ABI's map format: a little-endian u32 count, then a u32 key
// size and u32 value size per pair, then each key and value followed by a NUL byte.
func serializePairs(pairs [][2]string) []byte {
	size := 4
	for _, p := range pairs {
		size += 8 + len(p[0]) + len(p[1]) + 2
	}
	b := make([]byte, 4, size)
	binary.LittleEndian.PutUint32(b, uint32(len(pairs)))
	for _, p := range pairs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[1])))
	}
	for _, p := range pairs {
		b = append(b, p[0]...)
		b = append(b, 0)
		b = append(b, p[1]...)
		b = append(b, 0)
	}
	return b
}

var errBadPairs = errors.New("malformed serialized header map")

// deserializePairs decodes serializePairs' format. Envoy silently treats a malformed map as empty;
// rejecting it makes a plugin's serialisation bug visible in tests instead.
func deserializePairs(b []byte) ([][2]string, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: %d bytes", errBadPairs, len(b))
	}
	n := uint64(binary.LittleEndian.Uint32(b))
	if 4+8*n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d pairs do not fit in %d bytes", errBadPairs, n, len(b))
	}
	sizes := b[4 : 4+8*n]
	data := b[4+8*n:]
	pairs := make([][2]string, 0, n)
	next := func(size uint32) (string, error) {
		if uint64(size)+1 > uint64(len(data)) || data[size] != 0 {
			return "", fmt.Errorf("%w: string of %d bytes overruns or lacks its NUL", errBadPairs, size)
		}
		s := string(data[:size])
		data = data[size+1:]
		return s, nil
	}
	for i := uint64(0); i < n; i++ {
		k, err := next(binary.LittleEndian.Uint32(sizes[8*i:]))
		if err != nil {
			return nil, err
		}
		v, err := next(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		if err != nil {
			return nil, err
		}
		pairs = append(pairs, [2]string{k, v})
	}
	return pairs, nil
}
