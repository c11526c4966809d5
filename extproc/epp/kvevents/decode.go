// Package kvevents receives the KV-cache events that model servers (vLLM,
// llm-d-inference-sim) publish over ZeroMQ: which blocks each one stored,
// removed, or that it cleared them all. It subscribes, decodes, validates
// and counts; what the events mean for scheduling is for its caller.
//
// A message is three frames: a topic, an 8-byte big-endian sequence number
// and a msgpack EventBatch, [ts, [event...], data_parallel_rank?]. An event
// is a tagged array, ["BlockStored", block_hashes, parent_block_hash,
// token_ids, block_size, lora_id, medium, lora_name, ...], or, since
// vllm-project/vllm#42892, a map with the tag under "type" and the fields
// under their names.
package kvevents

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Decode limits. A payload over one is rejected, as ErrTooLarge, before
// anything is allocated for it.
const (
	MaxEvents      = 4096    // events in a batch
	MaxHashes      = 65536   // block hashes in an event
	MaxBatchHashes = 1 << 20 // block hashes in a batch, 8 MiB decoded
	MaxTokens      = 1 << 20 // token ids in an event
	maxMapEntries  = 64      // fields of a map-format event
	maxNameBytes   = 1024    // a LoRA name or a medium
	maxBlockSize   = 1 << 20 // tokens in a block
	maxDPRank      = 1 << 16
	maxBatchFields = 64 // the batch array, trailing fields included
)

var (
	// ErrTooLarge is wrapped by the errors of payloads over a decode limit
	// or the subscriber's message size.
	ErrTooLarge = errors.New("over a decode limit")
	// errTruncated is a payload that ends inside a value.
	errTruncated = errors.New("truncated")
)

// Kind is the type of an event.
type Kind uint8

const (
	// BlockStored reports blocks newly held, in order, each the child of
	// the one before it, the first the child of Parent (for
	// llm-d-inference-sim, the last block of the request already held).
	BlockStored Kind = iota + 1
	// BlockRemoved reports blocks evicted.
	BlockRemoved
	// AllBlocksCleared reports that every block was dropped.
	AllBlocksCleared
)

// kindOf is the kind of a wire tag, vLLM's class name; 0 if unknown.
func kindOf(tag []byte) Kind {
	switch string(tag) {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return 0
}

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is one KV-cache event; the fields its Kind does not carry are zero.
type Event struct {
	Kind Kind
	// Hashes are the blocks stored or removed. Integer hashes are kept as
	// their 64 bits; bytes hashes (vLLM's sha256 ones) are folded to their
	// last 8 bytes, big-endian, as llm-d does, so that ids agree with it.
	Hashes []uint64
	// Parent is the block Hashes[0] follows, if HasParent. A nil parent and
	// a parent of 0 are both "none": llm-d-inference-sim sends 0 for none in
	// the array format, and llm-d reads nil as 0 (its EmptyBlockHash).
	Parent    uint64
	HasParent bool
	// Tokens is the number of token ids of the stored blocks; the ids
	// themselves are not kept.
	Tokens    int
	BlockSize int
	// LoraID and LoraName name the adapter the blocks were computed with,
	// nil and "" for the base model.
	LoraID   *int
	LoraName string
	// Medium is where the blocks live ("GPU", "CPU", ...), "" if unsaid.
	Medium string
}

// Batch is one published message.
type Batch struct {
	// Source is the publisher: the target dialled, or for a publisher that
	// connected to a bound subscriber, the pod named by an llm-d topic
	// (kv@<pod>@<model>), else its IP address.
	Source string
	Topic  string
	Seq    uint64
	// Time is when the publisher sent the batch, by its clock.
	Time time.Time
	// DPRank is the data-parallel rank of the engine, 0 if unsaid. Each
	// rank numbers its batches separately.
	DPRank int
	Events []Event
	// Unknown counts the events skipped for a type this package does not
	// know, which a newer engine may send.
	Unknown int
	// Missed counts the batches lost before this one, from the gap in
	// sequence numbers; the caller's view of the source may be missing
	// their events.
	Missed uint64
	// Restarted is set on the first batch of a publisher that restarted:
	// it holds nothing the caller learnt from the source before (a
	// restarted engine starts with an empty cache and says nothing of it).
	Restarted bool
}

// Decode decodes an EventBatch payload, in either event format. An event
// of an unknown type is skipped and counted in Unknown; any other fault
// fails the whole batch, with an error saying where (event 3:
// block_hashes: element 5: ...), wrapping ErrTooLarge if a limit was hit.
func Decode(payload []byte) (Batch, error) {
	var b Batch
	if err := newReader(payload).batch(&b); err != nil {
		return Batch{}, err
	}
	return b, nil
}

func (rd *reader) batch(b *Batch) error {
	n, err := rd.arrayLen(maxBatchFields)
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	if n < 2 {
		return fmt.Errorf("batch: %d fields, want [ts, events, dp_rank?]", n)
	}
	if b.Time, err = rd.timestamp(); err != nil {
		return fmt.Errorf("batch: ts: %w", err)
	}
	if err := rd.events(b); err != nil {
		return err
	}
	if n >= 3 {
		null, err := rd.isNil()
		if err == nil && !null {
			b.DPRank, err = rd.intIn(0, maxDPRank)
		}
		if err != nil {
			return fmt.Errorf("batch: data_parallel_rank: %w", err)
		}
	}
	for i := 3; i < n; i++ {
		if err := rd.skip(1); err != nil {
			return fmt.Errorf("batch: field %d: %w", i, err)
		}
	}
	if rd.left() > 0 {
		return fmt.Errorf("batch: %d bytes after it", rd.left())
	}
	return nil
}

// timestamp reads the batch's ts, seconds since the epoch as a float.
func (rd *reader) timestamp() (time.Time, error) {
	c, err := rd.peek()
	if err != nil {
		return time.Time{}, err
	}
	if !isInt(c) && c != msgpcode.Float && c != msgpcode.Double {
		return time.Time{}, fmt.Errorf("want a number, got %s", describe(c))
	}
	ts, err := rd.d.DecodeFloat64()
	if err != nil {
		return time.Time{}, truncated(err)
	}
	// The bound keeps the conversion to nanoseconds exact enough and
	// within int64; no clock says year 5138.
	if math.IsNaN(ts) || ts < 0 || ts > 1e11 {
		return time.Time{}, fmt.Errorf("%v out of range", ts)
	}
	sec, frac := math.Modf(ts)
	return time.Unix(int64(sec), int64(frac*1e9)), nil
}

func (rd *reader) events(b *Batch) error {
	n, err := rd.arrayLen(MaxEvents)
	if err != nil {
		return fmt.Errorf("batch: events: %w", err)
	}
	b.Events = make([]Event, 0, n)
	for i := range n {
		c, err := rd.peek()
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		var e Event
		switch {
		case isArray(c):
			err = rd.arrayEvent(&e)
		case isMap(c):
			err = rd.mapEvent(&e)
		default:
			err = fmt.Errorf("want an array or a map, got %s", describe(c))
		}
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if e.Kind == 0 {
			b.Unknown++
			continue
		}
		b.Events = append(b.Events, e)
	}
	return nil
}

// arrayEvent reads an array-format event: the tag, then the fields in
// vLLM's declaration order. Trailing fields with defaults may be left out
// (msgspec's omit_defaults) and newer engines append fields: both are fine.
// An unknown tag leaves e.Kind zero.
func (rd *reader) arrayEvent(e *Event) error {
	n, err := rd.arrayLen(noLimit)
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("empty array, no type")
	}
	tag, err := rd.str(noLimit)
	if err != nil {
		return fmt.Errorf("type: %w", err)
	}
	e.Kind = kindOf(tag)
	var fields []fieldReader
	switch e.Kind {
	case BlockStored:
		if n < 5 {
			return fmt.Errorf("BlockStored: %d fields, want at least 5", n)
		}
		fields = storedFields[:]
	case BlockRemoved:
		if n < 2 {
			return fmt.Errorf("BlockRemoved: %d fields, want at least 2", n)
		}
		fields = removedFields[:]
	}
	read := min(n-1, len(fields))
	for i := range read {
		if err := fields[i].read(rd, e); err != nil {
			return fmt.Errorf("%s: %w", fields[i].name, err)
		}
	}
	return rd.skipFields(n - 1 - read)
}

func (rd *reader) skipFields(n int) error {
	for range n {
		if err := rd.skip(1); err != nil {
			return err
		}
	}
	return nil
}

// mapEvent reads a map-format event. Its type is found first, wherever it
// is among the keys, so that the fields are read knowing it and an unknown
// type is skipped whole, whatever its fields hold.
func (rd *reader) mapEvent(e *Event) error {
	n, err := rd.mapLen(maxMapEntries)
	if err != nil {
		return err
	}
	entries := rd.pos()
	found := false
	for range n {
		key, err := rd.key()
		if err != nil {
			return err
		}
		if string(key) != "type" {
			if err := rd.skip(1); err != nil {
				return fmt.Errorf("%s: %w", keyName(key), err)
			}
			continue
		}
		tag, err := rd.str(noLimit)
		if err != nil {
			return fmt.Errorf("type: %w", err)
		}
		e.Kind = kindOf(tag)
		found = true
	}
	if !found {
		return errors.New(`no "type"`)
	}
	if e.Kind == 0 {
		return nil // skipped whole by the scan above
	}
	rd.seek(entries)
	seen := 0 // the required fields read, as bits of their index
	for range n {
		key, err := rd.key()
		if err != nil {
			return err
		}
		i := fieldIndex(e.Kind, string(key))
		if i < 0 {
			if err := rd.skip(1); err != nil {
				return fmt.Errorf("%s: %w", keyName(key), err)
			}
			continue
		}
		f := fieldsOf(e.Kind)[i]
		if err := f.read(rd, e); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
		seen |= 1 << i
	}
	for i, f := range fieldsOf(e.Kind) {
		if f.required && seen&(1<<i) == 0 {
			return fmt.Errorf("%s: no %q", e.Kind, f.name)
		}
	}
	return nil
}

// key reads a map key, which must be a string.
func (rd *reader) key() ([]byte, error) {
	k, err := rd.str(noLimit)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	return k, nil
}

// keyName is a map key for an error: quoted, as it comes from the wire, and
// cut short if long.
func keyName(key []byte) string {
	if len(key) > 64 {
		return fmt.Sprintf("%q...", key[:64])
	}
	return fmt.Sprintf("%q", key)
}

// fieldReader reads one event field, by name in the map format and by
// position (its index + 1, after the tag) in the array format.
type fieldReader struct {
	name     string
	required bool
	read     func(*reader, *Event) error
}

// vLLM's BlockStored and BlockRemoved, in declaration order.
var (
	storedFields = [...]fieldReader{
		{"block_hashes", true, readHashes},
		{"parent_block_hash", false, readParent},
		{"token_ids", true, readTokens},
		{"block_size", true, readBlockSize},
		{"lora_id", false, readLoraID},
		{"medium", false, readMedium},
		{"lora_name", false, readLoraName},
	}
	removedFields = [...]fieldReader{
		{"block_hashes", true, readHashes},
		{"medium", false, readMedium},
	}
	clearedFields = [...]fieldReader{
		{"medium", false, readMedium},
	}
)

// fieldsOf is kind's fields in the map format. AllBlocksCleared has none in
// the array format, where a medium vLLM may append would sit at an unknown
// position.
func fieldsOf(k Kind) []fieldReader {
	switch k {
	case BlockStored:
		return storedFields[:]
	case BlockRemoved:
		return removedFields[:]
	case AllBlocksCleared:
		return clearedFields[:]
	}
	return nil
}

func fieldIndex(k Kind, name string) int {
	for i, f := range fieldsOf(k) {
		if f.name == name {
			return i
		}
	}
	return -1
}

func readHashes(rd *reader, e *Event) error {
	n, err := rd.arrayLen(MaxHashes)
	if err != nil {
		return err
	}
	// A hash may take one byte on the wire and takes eight decoded: the
	// batch's total is bounded too.
	if rd.hashes += n; rd.hashes > MaxBatchHashes {
		return fmt.Errorf("%w: more than %d hashes in the batch", ErrTooLarge, MaxBatchHashes)
	}
	e.Hashes = make([]uint64, n)
	for i := range e.Hashes {
		if e.Hashes[i], err = rd.hash(); err != nil {
			return fmt.Errorf("element %d: %w", i, err)
		}
	}
	return nil
}

func readParent(rd *reader, e *Event) error {
	if null, err := rd.isNil(); null || err != nil {
		return err
	}
	h, err := rd.hash()
	e.Parent, e.HasParent = h, h != 0
	return err
}

// readTokens counts the token ids, checking that they are integers. They
// are most of a payload, so they are sized from their codes here rather
// than read one by one through the Decoder, several times slower.
func readTokens(rd *reader, e *Event) error {
	n, err := rd.arrayLen(MaxTokens)
	if err != nil {
		return err
	}
	p := rd.pos()
	for i := range n {
		if p >= len(rd.buf) {
			return fmt.Errorf("element %d: %w", i, errTruncated)
		}
		size := intSize(rd.buf[p])
		if size == 0 {
			return fmt.Errorf("element %d: want an integer, got %s", i, describe(rd.buf[p]))
		}
		if p += size; p > len(rd.buf) {
			return fmt.Errorf("element %d: %w", i, errTruncated)
		}
	}
	rd.seek(p)
	e.Tokens = n
	return nil
}

func readBlockSize(rd *reader, e *Event) (err error) {
	e.BlockSize, err = rd.intIn(1, maxBlockSize)
	return err
}

func readLoraID(rd *reader, e *Event) error {
	if null, err := rd.isNil(); null || err != nil {
		return err
	}
	id, err := rd.intIn(math.MinInt32, math.MaxInt32)
	if err != nil {
		return err
	}
	e.LoraID = &id
	return nil
}

func readMedium(rd *reader, e *Event) (err error) {
	e.Medium, err = rd.optStr(maxNameBytes)
	return err
}

func readLoraName(rd *reader, e *Event) (err error) {
	e.LoraName, err = rd.optStr(maxNameBytes)
	return err
}
