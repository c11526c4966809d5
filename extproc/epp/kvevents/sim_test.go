package kvevents

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// captured is one message of testdata/llm-d-inference-sim (see its README).
type captured struct {
	Topic    string `json:"topic"`
	SeqFrame string `json:"seq_frame"`
	Seq      uint64 `json:"seq"`
	Payload  string `json:"payload"`
	Frames   int    `json:"frames"`

	frames [][]byte
}

// Flags the capture was made with.
const (
	simBlockSize = 8
	simCacheSize = 12 // --kv-cache-size, in blocks
)

func readCapture(t *testing.T, format string) []captured {
	t.Helper()
	dir := filepath.Join("testdata", "llm-d-inference-sim", format)
	b, err := os.ReadFile(filepath.Join(dir, "messages.json"))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []captured
	if err := json.Unmarshal(b, &msgs); err != nil {
		t.Fatal(err)
	}
	for i := range msgs {
		m := &msgs[i]
		seq, err := hex.DecodeString(m.SeqFrame)
		if err != nil {
			t.Fatal(err)
		}
		payload, err := os.ReadFile(filepath.Join(dir, m.Payload))
		if err != nil {
			t.Fatal(err)
		}
		m.frames = [][]byte{[]byte(m.Topic), seq, payload}
	}
	return msgs
}

// The simulator's events, in both formats, decode to what its cache did: a
// cache of at most --kv-cache-size blocks, where every block removed was
// held, every parent was held when its children were stored, and
// AllBlocksCleared empties it.
func TestCapturedSimulatorEvents(t *testing.T) {
	perFormat := map[string][][]string{}
	for _, format := range []string{"array", "map"} {
		t.Run(format, func(t *testing.T) {
			msgs := readCapture(t, format)
			if len(msgs) != 7 {
				t.Fatalf("%d messages, want 7", len(msgs))
			}
			held := map[uint64]bool{}
			counts := map[Kind]int{}
			var stored, removed, parents, lora int
			for i, m := range msgs {
				if m.Frames != 3 || len(m.frames[1]) != 8 || m.Seq != uint64(i+1) {
					t.Errorf("message %d: %d frames, seq %d (%x)", i, m.Frames, m.Seq, m.frames[1])
				}
				if !strings.HasPrefix(m.Topic, "kv@127.0.0.1:") || !strings.HasSuffix(m.Topic, "@test-model") {
					t.Errorf("message %d: topic %q", i, m.Topic)
				}
				b, err := Decode(m.frames[2])
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				if b.Unknown != 0 || b.DPRank != 0 || b.Time.Year() < 2025 {
					t.Errorf("message %d: %d unknown, rank %d, time %v", i, b.Unknown, b.DPRank, b.Time)
				}
				var keys []string
				for j, e := range b.Events {
					counts[e.Kind]++
					where := fmt.Sprintf("message %d event %d (%v)", i, j, e.Kind)
					// Which of the blocks unused since the same instant is
					// evicted differs from run to run: removals are compared
					// by number only.
					if e.Kind == BlockRemoved {
						keys = append(keys, fmt.Sprint(e.Kind, len(e.Hashes)))
					} else {
						keys = append(keys, fmt.Sprint(e.Kind, e.Hashes, e.Parent, e.Tokens, e.LoraName))
					}
					switch e.Kind {
					case BlockStored:
						if e.BlockSize != simBlockSize || e.Tokens != len(e.Hashes)*simBlockSize || len(e.Hashes) == 0 || e.Medium != "GPU" {
							t.Errorf("%s: block size %d, %d tokens for %d hashes, medium %q", where, e.BlockSize, e.Tokens, len(e.Hashes), e.Medium)
						}
						if e.HasParent {
							parents++
							if !held[e.Parent] {
								t.Errorf("%s: parent %x is not held", where, e.Parent)
							}
						}
						if (e.LoraID != nil) != (e.LoraName != "") {
							t.Errorf("%s: LoRA id %v, name %q", where, e.LoraID, e.LoraName)
						}
						if e.LoraID != nil {
							lora++
							if *e.LoraID != 1 || e.LoraName != "sql-lora" {
								t.Errorf("%s: LoRA %d %q", where, *e.LoraID, e.LoraName)
							}
						}
						for _, h := range e.Hashes {
							if held[h] {
								t.Errorf("%s: %x stored twice", where, h)
							}
							held[h] = true
						}
						stored += len(e.Hashes)
					case BlockRemoved:
						if e.Medium != "GPU" {
							t.Errorf("%s: medium %q", where, e.Medium)
						}
						for _, h := range e.Hashes {
							if !held[h] {
								t.Errorf("%s: %x removed, not held", where, h)
							}
							delete(held, h)
						}
						removed += len(e.Hashes)
					case AllBlocksCleared:
						clear(held)
					}
					if len(held) > simCacheSize {
						t.Errorf("%s: %d blocks held, the cache has %d", where, len(held), simCacheSize)
					}
				}
				slices.Sort(keys)
				perFormat[format] = append(perFormat[format], keys)
			}
			want := map[Kind]int{BlockStored: 8, BlockRemoved: 9, AllBlocksCleared: 1}
			if !maps.Equal(counts, want) || stored != 25 || removed != 9 || parents != 2 || lora != 1 {
				t.Errorf("events %v (want %v), %d blocks stored, %d removed, %d with a parent, %d of a LoRA",
					counts, want, stored, removed, parents, lora)
			}
			if len(held) != 4 { // the last request's, after the clear
				t.Errorf("%d blocks held at the end, want 4", len(held))
			}
		})
	}
	if !slices.EqualFunc(perFormat["array"], perFormat["map"], slices.Equal) {
		t.Errorf("the formats differ:\narray %v\nmap   %v", perFormat["array"], perFormat["map"])
	}
}
