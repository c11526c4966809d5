package kvevents

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// mp encodes v; msgpack.RawMessage values inside go out as they are.
func mp(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

type raw = msgpack.RawMessage

const ts = 1700000000.25

// batchOf is an EventBatch of events, vLLM's way: ts, events, rank.
func batchOf(tb testing.TB, events ...any) []byte {
	tb.Helper()
	if events == nil {
		events = []any{} // not nil, which encodes as nil
	}
	return mp(tb, []any{ts, events, 0})
}

func ptr[T any](v T) *T { return &v }

// sha is a 32-byte hash whose last 8 bytes are 0x0102030405060708.
var sha = append(bytes.Repeat([]byte{0xee}, 24), 1, 2, 3, 4, 5, 6, 7, 8)

// stored is the event array-format tests start from.
func stored() []any {
	return []any{"BlockStored", []any{uint64(11), uint64(12)}, uint64(10), []any{1, 2, 3, 4, 5, 6, 7, 8}, 4, nil, "GPU", nil, nil}
}

func with(ev []any, i int, v any) []any {
	out := append([]any(nil), ev...)
	out[i] = v
	return out
}

var storedWant = Event{Kind: BlockStored, Hashes: []uint64{11, 12}, Parent: 10, HasParent: true, Tokens: 8, BlockSize: 4, Medium: "GPU"}

func withEvent(e Event, f func(*Event)) Event {
	e.Hashes = append([]uint64(nil), e.Hashes...)
	f(&e)
	return e
}

// validCases are payloads that decode, in both formats; FuzzDecode starts
// from them.
func validCases(tb testing.TB) []struct {
	name    string
	payload []byte
	want    Batch
} {
	at := time.Unix(1700000000, 250000000)
	one := func(events []Event) Batch { return Batch{Time: at, Events: events} }
	return []struct {
		name    string
		payload []byte
		want    Batch
	}{
		{"array stored", batchOf(tb, stored()), one([]Event{storedWant})},
		{"array stored, nil parent", batchOf(tb, with(stored(), 2, nil)),
			one([]Event{withEvent(storedWant, func(e *Event) { e.Parent, e.HasParent = 0, false })})},
		{"array stored, parent 0 is none", batchOf(tb, with(stored(), 2, uint64(0))),
			one([]Event{withEvent(storedWant, func(e *Event) { e.Parent, e.HasParent = 0, false })})},
		{"array stored, int64 hashes", batchOf(tb, with(with(stored(), 1, []any{int64(-1), int64(5)}), 2, int64(-2))),
			one([]Event{withEvent(storedWant, func(e *Event) { e.Hashes, e.Parent = []uint64{math.MaxUint64, 5}, math.MaxUint64-1 })})},
		{"array stored, small ints", batchOf(tb, with(with(stored(), 1, []any{int8(-3), uint8(200), int16(300)}), 2, int32(-7))),
			one([]Event{withEvent(storedWant, func(e *Event) {
				e.Hashes, e.Parent = []uint64{math.MaxUint64 - 2, 200, 300}, uint64(math.MaxUint64-6)
			})})},
		{"array stored, bytes hashes", batchOf(tb, with(with(stored(), 1, []any{sha, []byte{1, 2, 3}}), 2, sha)),
			one([]Event{withEvent(storedWant, func(e *Event) { e.Hashes, e.Parent = []uint64{0x0102030405060708, 0x010203}, 0x0102030405060708 })})},
		{"array stored, LoRA", batchOf(tb, with(with(stored(), 5, 7), 7, "sql-lora")),
			one([]Event{withEvent(storedWant, func(e *Event) { e.LoraID, e.LoraName = ptr(7), "sql-lora" })})},
		{"array stored, 5 fields (older vLLM)", batchOf(tb, stored()[:5]),
			one([]Event{withEvent(storedWant, func(e *Event) { e.Medium = "" })})},
		{"array stored, trailing fields of newer vLLM", batchOf(tb, append(stored(), 0, "full_attention", nil, map[string]any{"x": []any{1, "y"}}, true, 1.5)),
			one([]Event{storedWant})},
		{"array stored, extra_keys", batchOf(tb, with(stored(), 8, []any{[]any{"mm-hash", 3}, nil})),
			one([]Event{storedWant})},
		{"array removed", batchOf(tb, []any{"BlockRemoved", []any{uint64(11)}, "CPU"}),
			one([]Event{{Kind: BlockRemoved, Hashes: []uint64{11}, Medium: "CPU"}})},
		{"array removed, no medium", batchOf(tb, []any{"BlockRemoved", []any{sha}}),
			one([]Event{{Kind: BlockRemoved, Hashes: []uint64{0x0102030405060708}}})},
		{"array removed, trailing fields", batchOf(tb, []any{"BlockRemoved", []any{uint64(11)}, nil, 0, "more"}),
			one([]Event{{Kind: BlockRemoved, Hashes: []uint64{11}}})},
		{"array cleared", batchOf(tb, []any{"AllBlocksCleared"}),
			one([]Event{{Kind: AllBlocksCleared}})},
		{"array cleared, trailing fields", batchOf(tb, []any{"AllBlocksCleared", "GPU", 1}),
			one([]Event{{Kind: AllBlocksCleared}})},
		{"map stored", batchOf(tb, map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(11), uint64(12)},
			"parent_block_hash": uint64(10), "token_ids": []any{1, 2, 3, 4, 5, 6, 7, 8}, "block_size": 4, "medium": "GPU"}),
			one([]Event{storedWant})},
		{"map stored, nil parent, LoRA, extra keys", batchOf(tb, map[string]any{"type": "BlockStored", "block_hashes": []any{sha},
			"parent_block_hash": nil, "token_ids": []any{1, 2, 3, 4}, "block_size": 4, "lora_id": 2, "lora_name": "x",
			"medium": nil, "extra_keys": []any{nil}, "group_idx": 0, "kv_cache_spec_kind": "full_attention", "new_field": map[string]any{"a": 1}}),
			one([]Event{{Kind: BlockStored, Hashes: []uint64{0x0102030405060708}, Tokens: 4, BlockSize: 4, LoraID: ptr(2), LoraName: "x"}})},
		{"map stored, type last", mp(tb, []any{ts, []any{raw("\x84\xacblock_hashes\x91\x05\xa9token_ids\x90\xaablock_size\x10\xa4type\xabBlockStored")}}),
			one([]Event{{Kind: BlockStored, Hashes: []uint64{5}, BlockSize: 16}})},
		{"map removed", batchOf(tb, map[string]any{"type": "BlockRemoved", "block_hashes": []any{uint64(11)}, "medium": "GPU", "group_idx": 1}),
			one([]Event{{Kind: BlockRemoved, Hashes: []uint64{11}, Medium: "GPU"}})},
		{"map cleared", batchOf(tb, map[string]any{"type": "AllBlocksCleared"}),
			one([]Event{{Kind: AllBlocksCleared}})},
		{"map cleared, medium", batchOf(tb, map[string]any{"type": "AllBlocksCleared", "medium": "CPU"}),
			one([]Event{{Kind: AllBlocksCleared, Medium: "CPU"}})},
		{"unknown types skipped", batchOf(tb, []any{"BlockMoved", 1, []any{2}}, stored(), map[string]any{"type": "Future", "block_hashes": "not hashes"}),
			Batch{Time: at, Events: []Event{storedWant}, Unknown: 2}},
		{"formats mixed", batchOf(tb, stored(), map[string]any{"type": "AllBlocksCleared"}),
			one([]Event{storedWant, {Kind: AllBlocksCleared}})},
		{"no events", batchOf(tb), one([]Event{})},
		{"no rank", mp(tb, []any{ts, []any{stored()}}), one([]Event{storedWant})},
		{"nil rank", mp(tb, []any{ts, []any{}, nil}), one([]Event{})},
		{"rank 3, trailing batch fields", mp(tb, []any{ts, []any{}, 3, "later", []any{1}}),
			Batch{Time: at, Events: []Event{}, DPRank: 3}},
		{"integer ts", mp(tb, []any{1700000000, []any{}}), Batch{Time: time.Unix(1700000000, 0), Events: []Event{}}},
		{"float32 ts", mp(tb, []any{float32(2), []any{}}), Batch{Time: time.Unix(2, 0), Events: []Event{}}},
		{"extension values skipped", batchOf(tb, append(stored(), raw("\xd4\x01\x02"), raw("\xc7\x03\x05abc"), raw("\xd8\x01"+strings.Repeat("x", 16)))),
			one([]Event{storedWant})},
	}
}

func TestDecode(t *testing.T) {
	for _, tc := range validCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.payload)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !got.Time.Equal(tc.want.Time) {
				t.Errorf("time %v, want %v", got.Time, tc.want.Time)
			}
			got.Time, tc.want.Time = time.Time{}, time.Time{}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// header builds msgpack headers the encoder would not write for these
// tests: lengths with nothing behind them.
func header(code byte, n uint32) string {
	switch code {
	case 0xdc, 0xde, 0xda, 0xc5: // 16-bit lengths
		return string([]byte{code, byte(n >> 8), byte(n)})
	default: // 32-bit
		return string([]byte{code, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
	}
}

func TestDecodeMalformed(t *testing.T) {
	tsRaw := string(mp(t, ts))
	ev := func(e ...any) []byte { return batchOf(t, e...) }
	cases := []struct {
		name    string
		payload []byte
		want    string // in the error
		tooBig  bool   // wraps ErrTooLarge
	}{
		{"empty", nil, "batch: truncated", false},
		{"not an array", mp(t, map[string]any{"ts": ts}), "batch: want an array, got map", false},
		{"one field", mp(t, []any{ts}), "batch: 1 fields", false},
		{"ts a string", mp(t, []any{"now", []any{}}), "batch: ts: want a number, got string", false},
		{"ts NaN", mp(t, []any{math.NaN(), []any{}}), "batch: ts: NaN out of range", false},
		{"ts negative", mp(t, []any{-1.0, []any{}}), "out of range", false},
		{"ts huge", mp(t, []any{1e300, []any{}}), "out of range", false},
		{"events a map", mp(t, []any{ts, map[string]any{}}), "batch: events: want an array, got map", false},
		{"events nil", mp(t, []any{ts, nil}), "batch: events: want an array, got nil", false},
		{"too many events", []byte("\x92" + tsRaw + header(0xdd, MaxEvents+1)), "batch: events: over a decode limit: 4097 elements, at most 4096", true},
		{"events declared, absent", []byte("\x92" + tsRaw + header(0xdc, 4000)), "batch: events: truncated: 4000 elements declared", false},
		{"batch of 2^32-1 fields", []byte(header(0xdd, math.MaxUint32)), "batch: over a decode limit", true},
		{"event an integer", ev(5), "event 0: want an array or a map, got integer", false},
		{"event empty", ev([]any{}), "event 0: empty array, no type", false},
		{"tag an integer", ev([]any{1, 2}), "event 0: type: want a string, got integer", false},
		{"tag nil", ev([]any{nil}), "event 0: type: want a string, got nil", false},
		{"stored short", ev([]any{"BlockStored", []any{uint64(1)}, nil, []any{}}), "event 0: BlockStored: 4 fields, want at least 5", false},
		{"removed short", ev([]any{"BlockRemoved"}), "BlockRemoved: 1 fields, want at least 2", false},
		{"hashes a string", ev(with(stored(), 1, "abc")), "event 0: block_hashes: want an array, got string", false},
		{"hashes nil", ev(with(stored(), 1, nil)), "block_hashes: want an array, got nil", false},
		{"hash a string", ev(stored(), with(stored(), 1, []any{uint64(1), "x"})), "event 1: block_hashes: element 1: want an integer or bytes, got string", false},
		{"hash nil", ev(with(stored(), 1, []any{nil})), "block_hashes: element 0: want an integer or bytes, got nil", false},
		{"hash a float", ev(with(stored(), 1, []any{1.5})), "element 0: want an integer or bytes, got float", false},
		{"hash empty bytes", ev(with(stored(), 1, []any{[]byte{}})), "block_hashes: element 0: empty bytes", false},
		{"too many hashes", []byte("\x92" + tsRaw + "\x91\x95\xabBlockStored" + header(0xdd, MaxHashes+1)), "event 0: block_hashes: over a decode limit: 65537 elements, at most 65536", true},
		{"parent a string", ev(with(stored(), 2, "p")), "event 0: parent_block_hash: want an integer or bytes, got string", false},
		{"tokens nil", ev(with(stored(), 3, nil)), "token_ids: want an array, got nil", false},
		{"token a string", ev(with(stored(), 3, []any{1, "two"})), "event 0: token_ids: element 1: want an integer, got string", false},
		{"too many tokens", []byte("\x92" + tsRaw + "\x91\x95\xabBlockStored\x90\xc0" + header(0xdd, MaxTokens+1)), "token_ids: over a decode limit", true},
		{"block size 0", ev(with(stored(), 4, 0)), "event 0: block_size: 0 out of range", false},
		{"block size negative", ev(with(stored(), 4, -16)), "block_size: -16 out of range", false},
		{"block size huge", ev(with(stored(), 4, uint64(math.MaxUint64))), "block_size: -1 out of range", false},
		{"block size a string", ev(with(stored(), 4, "16")), "block_size: want an integer, got string", false},
		{"lora id a string", ev(with(stored(), 5, "7")), "lora_id: want an integer, got string", false},
		{"lora id too big", ev(with(stored(), 5, int64(1)<<40)), "lora_id: 1099511627776 out of range", false},
		{"medium an integer", ev(with(stored(), 6, 1)), "event 0: medium: want a string, got integer", false},
		{"medium bytes", ev([]any{"BlockRemoved", []any{}, []byte("GPU")}), "medium: want a string, got bytes", false},
		{"lora name too long", ev(with(stored(), 7, strings.Repeat("n", 2000))), "lora_name: over a decode limit: 2000 bytes of string, at most 1024", true},
		{"medium 4 GiB declared", []byte("\x92" + tsRaw + "\x91\x93\xacBlockRemoved\x90" + header(0xdb, math.MaxUint32)), "medium: over a decode limit", true},
		{"skipped string 4 GiB declared", []byte("\x92" + tsRaw + "\x91\x92\xb0AllBlocksCleared" + header(0xdb, math.MaxUint32)), "event 0: truncated", false},
		{"skipped bytes 4 GiB declared", []byte("\x92" + tsRaw + "\x91\x92\xa3Foo" + header(0xc6, math.MaxUint32)), "truncated", false},
		{"skipped extension 4 GiB declared", []byte("\x92" + tsRaw + "\x91\x92\xa3Foo" + "\xc9\xff\xff\xff\xff\x01"), "event 0: truncated: extension value", false},
		{"skipped map 4G entries declared", []byte("\x92" + tsRaw + "\x91\x92\xa3Foo" + header(0xdf, math.MaxUint32)), "truncated", false},
		{"invalid code 0xc1", []byte("\x92" + tsRaw + "\x91\x92\xa3Foo\xc1"), "invalid msgpack code 0xc1", false},
		{"deep nesting", []byte("\x92" + tsRaw + "\x91\x92\xa3Foo" + strings.Repeat("\x91", 100) + "\x00"), "nested deeper than 32", false},
		{"map no type", ev(map[string]any{"block_hashes": []any{}}), `event 0: no "type"`, false},
		{"map type an integer", ev(map[string]any{"type": 1}), "event 0: type: want a string, got integer", false},
		{"map key an integer", []byte("\x92" + tsRaw + "\x91\x81\x01\x02"), "event 0: key: want a string, got integer", false},
		{"map stored without hashes", ev(map[string]any{"type": "BlockStored", "token_ids": []any{}, "block_size": 4}), `event 0: BlockStored: no "block_hashes"`, false},
		{"map stored without block size", ev(map[string]any{"type": "BlockStored", "block_hashes": []any{}, "token_ids": []any{}}), `BlockStored: no "block_size"`, false},
		{"map removed hash bad", ev(map[string]any{"type": "BlockRemoved", "block_hashes": []any{true}}), "event 0: block_hashes: element 0: want an integer or bytes, got bool", false},
		{"map of 100 entries", []byte("\x92" + tsRaw + "\x91" + header(0xde, 100)), "event 0: over a decode limit: 100 entries, at most 64", true},
		{"rank negative", mp(t, []any{ts, []any{}, -1}), "batch: data_parallel_rank: -1 out of range", false},
		{"rank a string", mp(t, []any{ts, []any{}, "0"}), "data_parallel_rank: want an integer, got string", false},
		{"rank huge", mp(t, []any{ts, []any{}, 1 << 20}), "data_parallel_rank: 1048576 out of range", false},
		{"trailing bytes", append(batchOf(t), 0), "batch: 1 bytes after it", false},
		{"truncated event", batchOf(t, stored())[:40], "event 0: block_hashes: element 1: truncated", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.payload)
			if err == nil {
				t.Fatal("Decode succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to hold %q", err, tc.want)
			}
			if got := errors.Is(err, ErrTooLarge); got != tc.tooBig {
				t.Errorf("errors.Is(err, ErrTooLarge) = %v, want %v (%v)", got, tc.tooBig, err)
			}
		})
	}
}

// Every strict prefix of a valid payload fails to decode.
func TestDecodeTruncated(t *testing.T) {
	for _, tc := range validCases(t) {
		for n := range len(tc.payload) {
			if _, err := Decode(tc.payload[:n]); err == nil {
				t.Errorf("%s: a prefix of %d bytes of %d decoded", tc.name, n, len(tc.payload))
			}
		}
	}
}

// A payload of the largest allowed sizes decodes, and allocates for what it
// holds, not more.
func TestDecodeLimits(t *testing.T) {
	// Written by hand: encoding a million-element []any takes long under
	// the race detector.
	var hashes, tokens bytes.Buffer
	hashes.WriteString(header(0xdd, MaxHashes))
	for i := range MaxHashes {
		hashes.Write([]byte{0xcf, 0, 0, 0, 0, 0, 0, byte(i >> 8), byte(i)})
	}
	tokens.WriteString(header(0xdd, MaxTokens))
	tokens.Write(bytes.Repeat([]byte{1}, MaxTokens))
	p := batchOf(t, []any{"BlockStored", raw(hashes.Bytes()), nil, raw(tokens.Bytes()), 16}, []any{"BlockRemoved", raw(hashes.Bytes())})
	b, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 2 || len(b.Events[0].Hashes) != MaxHashes || b.Events[0].Tokens != MaxTokens || b.Events[1].Hashes[MaxHashes-1] != MaxHashes-1 {
		t.Errorf("decoded %d events", len(b.Events))
	}
	events := make([]any, MaxEvents)
	for i := range events {
		events[i] = raw("\x91\xb0AllBlocksCleared")
	}
	if b, err := Decode(batchOf(t, events...)); err != nil || len(b.Events) != MaxEvents {
		t.Errorf("%d events: %v", len(b.Events), err)
	}
	// Hashes of one byte each, in more events than the batch may hold.
	small := raw(header(0xdd, MaxHashes) + strings.Repeat("\x00", MaxHashes))
	removals := make([]any, MaxBatchHashes/MaxHashes+1)
	for i := range removals {
		removals[i] = []any{"BlockRemoved", small}
	}
	if _, err := Decode(batchOf(t, removals...)); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "event 16: block_hashes: over a decode limit: more than 1048576 hashes in the batch") {
		t.Errorf("%d hashes in a batch: %v", len(removals)*MaxHashes, err)
	}
	allocs := testing.AllocsPerRun(2, func() { _, _ = Decode(p) })
	if allocs > 10 {
		t.Errorf("%v allocations to decode two events", allocs)
	}
}

// FuzzDecode checks that no payload panics Decode, and that what decodes
// keeps within the limits. The seeds are the valid cases and the payloads
// captured from llm-d-inference-sim.
func FuzzDecode(f *testing.F) {
	for _, tc := range validCases(f) {
		f.Add(tc.payload)
	}
	captured, err := filepath.Glob("testdata/llm-d-inference-sim/*/*.msgpack")
	if err != nil || len(captured) == 0 {
		f.Fatalf("no captured payloads: %v", err)
	}
	for _, name := range captured {
		p, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload)
		if err != nil {
			if b2, err2 := Decode(payload); err2 == nil || err2.Error() != err.Error() || len(b2.Events) != len(b.Events) {
				t.Fatalf("Decode is not deterministic: %v, then %v", err, err2)
			}
			return
		}
		if len(b.Events)+b.Unknown > MaxEvents {
			t.Fatalf("%d events", len(b.Events)+b.Unknown)
		}
		for i, e := range b.Events {
			if e.Kind < BlockStored || e.Kind > AllBlocksCleared {
				t.Fatalf("event %d: kind %v", i, e.Kind)
			}
			if len(e.Hashes) > MaxHashes || e.Tokens > MaxTokens || len(e.LoraName) > maxNameBytes || len(e.Medium) > maxNameBytes {
				t.Fatalf("event %d over a limit: %d hashes, %d tokens", i, len(e.Hashes), e.Tokens)
			}
			if e.Kind == BlockStored && (e.BlockSize < 1 || e.BlockSize > maxBlockSize) {
				t.Fatalf("event %d: block size %d", i, e.BlockSize)
			}
			if e.HasParent != (e.Parent != 0) {
				t.Fatalf("event %d: parent %d, HasParent %v", i, e.Parent, e.HasParent)
			}
		}
		if b.DPRank < 0 || b.DPRank > maxDPRank || b.Time.Before(time.Unix(0, 0)) {
			t.Fatalf("rank %d, time %v", b.DPRank, b.Time)
		}
	})
}
