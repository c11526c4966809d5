package epp

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/infergate/infergate/extproc/epp/peers"
	"github.com/infergate/infergate/extproc/epp/scheduling"
)

// quiet is a replica that has learned nothing.
type quiet struct{}

func (quiet) PeerPicked(scheduling.Shared)  {}
func (quiet) AppendState(dst []byte) []byte { return dst }
func (quiet) MergeState([]byte) error       { return nil }

// TestReplicasShareTheHeadroom: with flow control, each of n replicas
// releases at most its share of the pool's headroom, so n of them do not
// overfill the pool between two scrapes.
func TestReplicasShareTheHeadroom(t *testing.T) {
	if got := replicaShare(5, nil); got != 5 {
		t.Fatalf("alone: %d of 5", got)
	}
	var nodes []*peers.Node
	for i := range 3 {
		var join []string
		if i > 0 {
			join = []string{nodes[0].Addr()}
		}
		n, err := peers.Start(context.Background(), peers.Config{Bind: "127.0.0.1:0", Join: join}, quiet{}, logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Stop)
		nodes = append(nodes, n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for nodes[0].Peers() != 2 {
		if time.Now().After(deadline) {
			t.Fatal("three replicas did not meet")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, tc := range []struct{ headroom, want int }{{0, 0}, {1, 1}, {3, 1}, {5, 2}, {9, 3}} {
		if got := replicaShare(tc.headroom, nodes[0]); got != tc.want {
			t.Errorf("headroom %d over 3 replicas: %d each, want %d", tc.headroom, got, tc.want)
		}
	}
}
