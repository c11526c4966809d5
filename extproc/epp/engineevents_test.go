package epp_test

import (
	"context"
	"encoding/binary"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/infergate/infergate/extproc/epp"
)

// TestAnEngineThatClearsItsCacheIsForgotten: the picker learns a prefix
// on an endpoint; that endpoint's engine then publishes, over ZeroMQ as
// vLLM does, blocks stored and its cache cleared. The picker counts the
// blocks and forgets what it believed the endpoint held. The engine's
// publisher binds and the picker dials it (vLLM's default), or the picker
// binds and the engine dials it, naming itself in the topic (llm-d's).
func TestAnEngineThatClearsItsCacheIsForgotten(t *testing.T) {
	for _, bind := range []bool{false, true} {
		t.Run(map[bool]string{false: "picker dials", true: "engine dials"}[bind], func(t *testing.T) {
			addrs := []string{"127.0.0.2:8000", "127.0.0.3:8000"}
			r := newRig(t, rigOpts{endpoints: specs(addrs...)})
			r.freshMetrics(addrs)
			home := r.do(t, call{body: topicBody("cleared")}).destination(t)
			if counterValue(t, r.reg, "infergate_epp_prefix_index_blocks", "endpoint", home) == 0 {
				t.Fatal("the picker learned nothing of the prefix")
			}
			host, _, _ := net.SplitHostPort(home)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pub := zmq4.NewPub(ctx)
			defer pub.Close()
			var events *epp.EngineEvents
			var err error
			topic, at := "kv-events", ""
			if bind {
				at = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
				events, err = epp.NewEngineEvents(ctx, r.store, r.picker, 0, at, logr.Discard())
				topic = "kv@" + host + "@m"
			} else {
				port := freePort(t, host)
				if err = pub.Listen("tcp://" + net.JoinHostPort(host, strconv.Itoa(port))); err == nil {
					events, err = epp.NewEngineEvents(ctx, r.store, r.picker, port, "", logr.Discard())
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			r.reg.MustRegister(events)
			done := make(chan struct{})
			go func() { _ = events.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			// The engine dials once the picker accepts: zmq4's Dial waits for
			// the handshake.
			if bind {
				if err := pub.Dial("tcp://" + at); err != nil {
					t.Fatal(err)
				}
			}

			stored := []any{"BlockStored", []any{uint64(11), uint64(12), uint64(13)}, nil, make([]uint32, 48), 16, nil, "GPU"}
			// A subscriber that just connected misses what was sent before
			// (ZeroMQ's slow joiner): the engine keeps publishing, as a busy
			// one does.
			deadline := time.Now().Add(10 * time.Second)
			for seq := uint64(0); counterValue(t, r.reg, "infergate_epp_engine_kv_blocks", "endpoint", home) != 3; seq++ {
				if time.Now().After(deadline) {
					t.Fatal("the stored blocks were never counted")
				}
				publish(t, pub, topic, seq, []any{[]any{"AllBlocksCleared"}, stored})
				time.Sleep(50 * time.Millisecond)
			}
			if n := counterValue(t, r.reg, "infergate_epp_prefix_index_blocks", "endpoint", home); n != 0 {
				t.Fatalf("the engine cleared its cache; the picker still believes it holds %v blocks", n)
			}
			if counterValue(t, r.reg, "infergate_epp_engine_kv_clears_total", "endpoint", home) < 1 {
				t.Fatal("the clear was not counted")
			}
		})
	}
}

// publish sends one KV event batch as vLLM's ZeroMQ publisher frames it:
// topic, sequence number, msgpack [ts, events, rank].
func publish(t *testing.T, pub zmq4.Socket, topic string, seq uint64, events []any) {
	t.Helper()
	payload, err := msgpack.Marshal([]any{float64(time.Now().UnixNano()) / 1e9, events, 0})
	if err != nil {
		t.Fatal(err)
	}
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	if err := pub.Send(zmq4.NewMsgFrom([]byte(topic), s[:], payload)); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T, host string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
