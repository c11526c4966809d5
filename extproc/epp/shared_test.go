package epp_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// freshMetrics gives every endpoint of r metrics that count as fresh.
func (r *rig) freshMetrics(addrs []string) {
	for _, a := range addrs {
		r.store.Get(a).SetMetrics(&datastore.Metrics{UpdatedAt: time.Now()})
	}
}

func topicBody(topic string) []byte {
	return []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question"}]}`,
		strings.Repeat(topic+" is the subject of this long shared system prompt. ", 40)))
}

// TestReplicasRouteAsOne: two replicas behind a round robin route a
// prefix where the other sent it, spread new prefixes as one picker
// would, and a third that joins later is given what they learned.
func TestReplicasRouteAsOne(t *testing.T) {
	addrs := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
	a := newRig(t, rigOpts{endpoints: specs(addrs...), withPeers: true})
	b := newRig(t, rigOpts{endpoints: specs(addrs...), withPeers: true, join: []string{a.peers.Addr()}})
	a.freshMetrics(addrs)
	b.freshMetrics(addrs)
	waitPeers(t, a, 1)

	// Six new prefixes, alternately through each replica: spread two an
	// endpoint, as one picker spreads them, only if each replica knows of
	// the other's cold picks.
	home := map[string]string{}
	spread := map[string]int{}
	replicas := []*rig{a, b}
	for i := range 6 {
		topic := fmt.Sprintf("topic-%d", i)
		home[topic] = replicas[i%2].do(t, call{body: topicBody(topic)}).destination(t)
		spread[home[topic]]++
		waitLearned(t, replicas[(i+1)%2], float64(i/2+1))
	}
	for _, e := range addrs {
		if spread[e] != 2 {
			t.Fatalf("six new prefixes through two replicas landed %v, want two on each endpoint", spread)
		}
	}
	// Each prefix through the replica that did not route it first.
	for i := range 6 {
		topic := fmt.Sprintf("topic-%d", i)
		if got := replicas[(i+1)%2].do(t, call{body: topicBody(topic)}).destination(t); got != home[topic] {
			t.Fatalf("%s through the other replica went to %s; its prefix is on %s", topic, got, home[topic])
		}
	}
	if v := counterValue(t, b.reg, "infergate_epp_peer_decisions_total", "index", "differed"); v != 0 {
		t.Fatalf("b's index differed from a's %v times; the replicas' views must agree here", v)
	}

	// A replica that joins now is given the index on joining: it sends
	// every prefix home before any decision reaches it.
	c := newRig(t, rigOpts{endpoints: specs(addrs...), withPeers: true, join: []string{b.peers.Addr()}})
	c.freshMetrics(addrs)
	if v := counterValue(t, c.reg, "infergate_epp_peer_state_merges_total", "result", "ok"); v < 1 {
		t.Fatalf("the joining replica merged %v states", v)
	}
	for topic, want := range home {
		if got := c.do(t, call{body: topicBody(topic)}).destination(t); got != want {
			t.Fatalf("the new replica sent %s to %s; its prefix is on %s", topic, got, want)
		}
	}
}

func waitPeers(t *testing.T, r *rig, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.peers.Peers() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d peers after 10s, want %d", r.peers.Peers(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitLearned waits for r to have learned n decisions from its peers.
func waitLearned(t *testing.T, r *rig, n float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := counterValue(t, r.reg, "infergate_epp_peer_decisions_received_total", "", "")
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("learned %v decisions from peers after 10s, want %v", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
