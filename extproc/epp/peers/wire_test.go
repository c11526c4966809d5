package peers

import (
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/scheduling"
)

func TestBatchRoundTripAndLimit(t *testing.T) {
	ds := []scheduling.Shared{
		{Endpoint: "a:1", Hashes: []uint64{1, 2, 3}, PromptBytes: 200, Held: 2},
		{Endpoint: "b:2", From: "a:1", PromptBytes: 9},
		{Endpoint: "c:3", Cold: true, Hashes: make([]uint64, 300)},
	}
	now := time.Unix(1700000000, 123)
	b, rest := encodeBatch(ds, now, 1<<20)
	if len(rest) != 0 || countOf(b) != 3 {
		t.Fatalf("all three fit: rest %d, count %d", len(rest), countOf(b))
	}
	sent, got, err := decodeBatch(b)
	if err != nil || !sent.Equal(now) || len(got) != 3 {
		t.Fatalf("decode: %v, sent %v, %d decisions", err, sent, len(got))
	}
	for i := range ds {
		if !equal(got[i], ds[i]) {
			t.Fatalf("decision %d: %+v, want %+v", i, got[i], ds[i])
		}
	}
	// A limit smaller than the third decision sends it in a batch of its own.
	b, rest = encodeBatch(ds, now, 200)
	if countOf(b) != 2 || len(rest) != 1 {
		t.Fatalf("limit 200: count %d, rest %d", countOf(b), len(rest))
	}
	if b, rest = encodeBatch(rest, now, 200); countOf(b) != 1 || len(rest) != 0 {
		t.Fatal("a decision larger than the limit must still go, alone")
	}
}

func TestMalformedBatches(t *testing.T) {
	good, _ := encodeBatch([]scheduling.Shared{{Endpoint: "a:1", Hashes: []uint64{7}}}, time.Now(), 1<<20)
	for name, b := range map[string][]byte{
		"empty":         nil,
		"version":       append([]byte{9}, good[1:]...),
		"truncated":     good[:len(good)-3],
		"trailing":      append(append([]byte{}, good...), 0),
		"huge count":    append(append([]byte{}, good[:9]...), 0xff, 0xff, 0xff, 0xff, 0x0f),
		"huge hash len": append(append([]byte{}, good[:9]...), 1, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03),
	} {
		if _, _, err := decodeBatch(b); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	good, _ := encodeBatch([]scheduling.Shared{{Endpoint: "a:1", From: "b:2", Hashes: []uint64{7, 8}, Cold: true}}, time.Now(), 1<<20)
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, ds, err := decodeBatch(b)
		if err != nil {
			return
		}
		re, _ := encodeBatch(ds, time.Unix(0, 0), 1<<30)
		if _, again, err := decodeBatch(re); err != nil || len(again) != len(ds) {
			t.Fatalf("re-encoded batch: %v, %d of %d", err, len(again), len(ds))
		}
	})
}
