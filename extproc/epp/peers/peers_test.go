package peers

import (
	"bytes"
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/infergate/infergate/extproc/epp/scheduling"
)

// recorder is a Local that keeps what its peers told it.
type recorder struct {
	mu     sync.Mutex
	got    []scheduling.Shared
	state  []byte
	merged [][]byte
}

func (r *recorder) PeerPicked(d scheduling.Shared) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, d)
}

func (r *recorder) AppendState(dst []byte) []byte { return append(dst, r.state...) }

func (r *recorder) MergeState(b []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.merged = append(r.merged, bytes.Clone(b))
	return nil
}

func (r *recorder) decisions() []scheduling.Shared {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func (r *recorder) merges() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.merged)
}

func start(t *testing.T, local Local, join ...string) *Node {
	t.Helper()
	n, err := Start(context.Background(), Config{Bind: "127.0.0.1:0", Join: join, RejoinInterval: 200 * time.Millisecond}, local, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func decision(i int, blocks int) scheduling.Shared {
	d := scheduling.Shared{Endpoint: "10.0.0.1:8000", PromptBytes: 64 * blocks, Held: i % 3, Cold: i%5 == 0}
	for b := range blocks {
		d.Hashes = append(d.Hashes, uint64(i)<<32|uint64(b))
	}
	return d
}

func TestDecisionsReachEveryPeerInOrder(t *testing.T) {
	ra, rb, rc := &recorder{}, &recorder{}, &recorder{}
	a := start(t, ra)
	b := start(t, rb, a.Addr())
	start(t, rc, b.Addr()) // joins through b, learns of a by gossip
	waitFor(t, "three members", func() bool { return a.Peers() == 2 })

	var want []scheduling.Shared
	for i := range 300 {
		// Small decisions go over UDP in shared batches, a 2,048-block
		// prompt (16 KiB of hashes) over TCP.
		blocks := 4
		if i%50 == 0 {
			blocks = 2048
		}
		d := decision(i, blocks)
		want = append(want, d)
		a.Share(d)
		if i%10 == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	for name, r := range map[string]*recorder{"b": rb, "c": rc} {
		waitFor(t, name+" learns all 300", func() bool { return len(r.decisions()) >= 300 })
		got := r.decisions()
		if len(got) != 300 {
			t.Fatalf("%s learned %d decisions, want 300", name, len(got))
		}
		// UDP and TCP batches may overtake each other; each decision
		// arrives once and whole.
		slices.SortFunc(got, func(x, y scheduling.Shared) int { return int(x.Hashes[0]>>32) - int(y.Hashes[0]>>32) })
		for i := range want {
			if !equal(got[i], want[i]) {
				t.Fatalf("%s: decision %d = %+v, want %+v", name, i, got[i], want[i])
			}
		}
	}
	if len(ra.decisions()) != 0 {
		t.Fatal("a replica learned its own decisions back")
	}
}

func equal(x, y scheduling.Shared) bool {
	return x.Endpoint == y.Endpoint && x.From == y.From && x.PromptBytes == y.PromptBytes &&
		x.Held == y.Held && x.Cold == y.Cold && slices.Equal(x.Hashes, y.Hashes)
}

func TestAJoiningReplicaIsGivenTheOthersState(t *testing.T) {
	ra := &recorder{state: []byte("what a learned")}
	a := start(t, ra)
	rb := &recorder{state: []byte("b, new")}
	start(t, rb, a.Addr())
	if m := rb.merges(); len(m) != 1 || string(m[0]) != "what a learned" {
		t.Fatalf("the joining replica merged %q, want a's state once", m)
	}
	waitFor(t, "a merges b's state", func() bool { return len(ra.merges()) > 0 })
	if m := ra.merges(); len(m) != 1 || string(m[0]) != "b, new" {
		t.Fatalf("the replica joined merged %q, want b's state once", m)
	}
}

func TestADeadPeerBlocksNothing(t *testing.T) {
	ra, rb, rc := &recorder{}, &recorder{}, &recorder{}
	a := start(t, ra)
	start(t, rb, a.Addr())
	c, err := Start(context.Background(), Config{Bind: "127.0.0.1:0", Join: []string{a.Addr()}}, rc, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "three members", func() bool { return a.Peers() == 2 })
	// c dies without leaving: a learns of it only from its probes.
	if err := c.ml.Shutdown(); err != nil {
		t.Fatal(err)
	}
	c.cancel()
	<-c.done
	began := time.Now()
	for i := range 2000 {
		a.Share(decision(i, 64))
	}
	if d := time.Since(began); d > time.Second {
		t.Fatalf("2,000 Shares took %s with a peer dead: Share must not wait on the network", d)
	}
	waitFor(t, "b learns everything while c is dead", func() bool { return len(rb.decisions()) == 2000 })
	waitFor(t, "a sees c gone", func() bool { return a.Peers() == 1 })
}

func TestAReplicaStartedFirstJoinsOnceAPeerAnswers(t *testing.T) {
	// b starts before anything answers at a's address: it routes alone
	// and keeps trying, as a replica does while a headless Service's name
	// resolves to nobody yet or a partition lasts.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	rb := &recorder{}
	b := start(t, rb, addr)
	if b.Peers() != 0 {
		t.Fatal("b has a peer before any started")
	}
	ra := &recorder{state: []byte("a")}
	n, err := Start(context.Background(), Config{Bind: addr}, ra, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	waitFor(t, "b joins on its own", func() bool { return b.Peers() == 1 })
	if m := rb.merges(); len(m) == 0 || string(m[0]) != "a" {
		t.Fatalf("b merged %q after joining, want a's state", m)
	}
}
