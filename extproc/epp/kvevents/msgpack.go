package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxDepth bounds the nesting of values skipped unread (extra fields,
// unknown events), so that a payload of nested arrays cannot recurse deep.
const maxDepth = 32

// reader reads msgpack values from one payload with the library's
// low-level Decoder, checking every declared length against the bytes left
// before anything is allocated or read: the Decoder itself trusts headers
// (DecodeBytes allocates the declared length up front), and its nil
// handling is loose (DecodeUint64 and DecodeString take nil as 0 and ""), so
// the type of each value is checked on its code first.
type reader struct {
	buf    []byte
	r      bytes.Reader
	d      *msgpack.Decoder
	hashes int // hashes read so far, against MaxBatchHashes
}

func newReader(buf []byte) *reader {
	rd := &reader{buf: buf}
	rd.r.Reset(buf)
	// A bytes.Reader is an io.ByteScanner, so the Decoder reads from it
	// directly, without a buffer of its own: the reader's position is the
	// Decoder's, which seek and pos rely on.
	rd.d = msgpack.NewDecoder(&rd.r)
	return rd
}

func (rd *reader) left() int { return rd.r.Len() }

func (rd *reader) pos() int { return len(rd.buf) - rd.r.Len() }

// seek moves to absolute offset p of the payload.
func (rd *reader) seek(p int) {
	_, _ = rd.r.Seek(int64(p), io.SeekStart) // p is within the payload: never fails
}

// advance skips n bytes the caller has checked are there.
func (rd *reader) advance(n int) { rd.seek(rd.pos() + n) }

func (rd *reader) peek() (byte, error) {
	c, err := rd.d.PeekCode()
	if err != nil {
		return 0, truncated(err)
	}
	return c, nil
}

// truncated names the end of the payload as such, whichever form the
// Decoder reports it in.
func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errTruncated
	}
	return err
}

// isNil consumes a nil if one is next.
func (rd *reader) isNil() (bool, error) {
	c, err := rd.peek()
	if err != nil || c != msgpcode.Nil {
		return false, err
	}
	rd.advance(1)
	return true, nil
}

// noLimit, as a limit, leaves only the bytes left as the bound.
const noLimit = -1

// length checks a declared count of elements, each at least one byte,
// against limit and the bytes left.
func (rd *reader) length(n, limit int, what string) error {
	if limit != noLimit && n > limit {
		return fmt.Errorf("%w: %d %s, at most %d", ErrTooLarge, n, what, limit)
	}
	if n > rd.left() {
		return fmt.Errorf("%w: %d %s declared, %d bytes left", errTruncated, n, what, rd.left())
	}
	return nil
}

// arrayLen reads an array header of at most limit elements.
func (rd *reader) arrayLen(limit int) (int, error) {
	c, err := rd.peek()
	if err != nil {
		return 0, err
	}
	if !isArray(c) {
		return 0, fmt.Errorf("want an array, got %s", describe(c))
	}
	n, err := rd.d.DecodeArrayLen()
	if err != nil {
		return 0, truncated(err)
	}
	return n, rd.length(n, limit, "elements")
}

// mapLen reads a map header of at most limit entries.
func (rd *reader) mapLen(limit int) (int, error) {
	c, err := rd.peek()
	if err != nil {
		return 0, err
	}
	if !isMap(c) {
		return 0, fmt.Errorf("want a map, got %s", describe(c))
	}
	n, err := rd.d.DecodeMapLen()
	if err != nil {
		return 0, truncated(err)
	}
	// Each entry is a key and a value, two bytes at least.
	if err := rd.length(n, limit, "entries"); err != nil {
		return 0, err
	}
	if 2*n > rd.left() {
		return 0, fmt.Errorf("%w: %d entries declared, %d bytes left", errTruncated, n, rd.left())
	}
	return n, nil
}

// raw reads a str or bin value of at most limit bytes, as a view of the
// payload: no copy is made.
func (rd *reader) raw(c byte, limit int) ([]byte, error) {
	n, err := rd.d.DecodeBytesLen() // the header of str and bin alike
	if err != nil {
		return nil, truncated(err)
	}
	if limit != noLimit && n > limit {
		return nil, fmt.Errorf("%w: %d bytes of %s, at most %d", ErrTooLarge, n, describe(c), limit)
	}
	if n > rd.left() {
		return nil, fmt.Errorf("%w: %d bytes declared, %d left", errTruncated, n, rd.left())
	}
	p := rd.pos()
	rd.advance(n)
	return rd.buf[p : p+n : p+n], nil
}

// str reads a string of at most limit bytes, as a view of the payload.
func (rd *reader) str(limit int) ([]byte, error) {
	c, err := rd.peek()
	if err != nil {
		return nil, err
	}
	if !msgpcode.IsString(c) {
		return nil, fmt.Errorf("want a string, got %s", describe(c))
	}
	return rd.raw(c, limit)
}

// optStr reads a string or nil (as "").
func (rd *reader) optStr(limit int) (string, error) {
	if null, err := rd.isNil(); null || err != nil {
		return "", err
	}
	b, err := rd.str(limit)
	return string(b), err
}

// int reads an integer, of any msgpack width.
func (rd *reader) int() (int64, error) {
	c, err := rd.peek()
	if err != nil {
		return 0, err
	}
	if !isInt(c) {
		return 0, fmt.Errorf("want an integer, got %s", describe(c))
	}
	v, err := rd.d.DecodeInt64()
	return v, truncated(err)
}

// intIn reads an integer in [lo, hi].
func (rd *reader) intIn(lo, hi int64) (int, error) {
	v, err := rd.int()
	if err != nil {
		return 0, err
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("%d out of range [%d, %d]", v, lo, hi)
	}
	return int(v), nil
}

// hash reads a block hash. vLLM sends an int (its builtin hash, which may
// be negative, so msgpack carries it as int64 or uint64) or, with a sha256
// hash algorithm, bytes. Bytes become their last 8 bytes read big-endian,
// left-padded with zeros when shorter, and ints their two's complement bits:
// what llm-d-router's engineadapter.getHashAsUint64 does, so that ids agree
// with llm-d's.
func (rd *reader) hash() (uint64, error) {
	c, err := rd.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case isInt(c):
		v, err := rd.d.DecodeUint64()
		return v, truncated(err)
	case msgpcode.IsBin(c):
		b, err := rd.raw(c, noLimit)
		if err != nil {
			return 0, err
		}
		if len(b) == 0 {
			return 0, errors.New("empty bytes")
		}
		if len(b) > 8 {
			b = b[len(b)-8:]
		}
		var pad [8]byte
		copy(pad[8-len(b):], b)
		return binary.BigEndian.Uint64(pad[:]), nil
	default:
		return 0, fmt.Errorf("want an integer or bytes, got %s", describe(c))
	}
}

// skip skips one value of any type.
func (rd *reader) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("values nested deeper than %d", maxDepth)
	}
	c, err := rd.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := rd.arrayLen(noLimit)
		if err != nil {
			return err
		}
		for range n {
			if err := rd.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := rd.mapLen(noLimit)
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := rd.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		_, err := rd.raw(c, noLimit)
		return err
	case msgpcode.IsExt(c):
		return rd.skipExt(c)
	case c == 0xc1: // the one code msgpack never uses
		return fmt.Errorf("invalid msgpack code 0xc1")
	default:
		// nil, bool, int, float: the Decoder knows their fixed sizes and
		// allocates nothing for them.
		return truncated(rd.d.Skip())
	}
}

// skipExt skips an extension value. Its header is read here, not by the
// Decoder, whose Skip allocates the declared length before finding the
// payload short.
func (rd *reader) skipExt(c byte) error {
	p := rd.pos()
	var hdr, n int
	switch c {
	case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
		hdr, n = 2, 1<<(c-msgpcode.FixExt1)
	case msgpcode.Ext8:
		if rd.left() >= 2 {
			hdr, n = 3, int(rd.buf[p+1])
		}
	case msgpcode.Ext16:
		if rd.left() >= 3 {
			hdr, n = 4, int(binary.BigEndian.Uint16(rd.buf[p+1:]))
		}
	case msgpcode.Ext32:
		if rd.left() >= 5 {
			hdr, n = 6, int(binary.BigEndian.Uint32(rd.buf[p+1:]))
		}
	}
	if hdr == 0 || hdr+n > rd.left() {
		return fmt.Errorf("%w: extension value", errTruncated)
	}
	rd.advance(hdr + n)
	return nil
}

// intSize is the size of an integer that code c starts, 0 if c starts
// something else.
func intSize(c byte) int {
	switch {
	case msgpcode.IsFixedNum(c):
		return 1
	case c == msgpcode.Uint8 || c == msgpcode.Int8:
		return 2
	case c == msgpcode.Uint16 || c == msgpcode.Int16:
		return 3
	case c == msgpcode.Uint32 || c == msgpcode.Int32:
		return 5
	case c == msgpcode.Uint64 || c == msgpcode.Int64:
		return 9
	}
	return 0
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

// describe names the type of the value that code c starts, for errors.
func describe(c byte) string {
	switch {
	case isInt(c):
		return "integer"
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.False || c == msgpcode.True:
		return "bool"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "float"
	case msgpcode.IsString(c):
		return "string"
	case msgpcode.IsBin(c):
		return "bytes"
	case isArray(c):
		return "array"
	case isMap(c):
		return "map"
	case msgpcode.IsExt(c):
		return "extension"
	default:
		return fmt.Sprintf("invalid code %#x", c)
	}
}
