package epp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/extproc/epp"
	"github.com/infergate/infergate/extproc/epp/config"
	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/epp/flowcontrol"
	"github.com/infergate/infergate/extproc/epp/peers"
	"github.com/infergate/infergate/extproc/epp/scheduling"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/wire"
)

// rig is a running picker over real gRPC on loopback.
type rig struct {
	store  *datastore.Store
	srv    *server.Server
	conn   *grpc.ClientConn
	reg    *prometheus.Registry
	peers  *peers.Node
	picker *epp.Picker
}

type rigOpts struct {
	configText  string
	endpoints   []datastore.Spec
	objectives  []datastore.Objective
	rewrites    []datastore.ModelRewrite
	bodyLimit   int64
	emitScores  bool
	conformance bool
	queueTTL    time.Duration // > 0 turns flow control on
	// withPeers runs the picker as a replica meeting others on loopback,
	// joining join.
	withPeers bool
	join      []string
}

func newRig(t testing.TB, o rigOpts) *rig {
	t.Helper()
	if o.configText == "" {
		o.configText = config.DefaultConfig
	}
	loaded, err := config.Load([]byte(o.configText))
	if err != nil {
		t.Fatal(err)
	}
	store := datastore.New()
	if o.endpoints != nil {
		if err := store.Replace(o.endpoints); err != nil {
			t.Fatal(err)
		}
	}
	store.SetObjectives(o.objectives)
	store.SetModelRewrites(o.rewrites)
	reg := prometheus.NewRegistry()
	detector := flowcontrol.UtilizationDetector{QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8, MetricsStaleness: time.Minute}
	var queue *flowcontrol.Queue
	if o.queueTTL > 0 {
		queue = flowcontrol.NewQueue(flowcontrol.QueueOptions{
			Capacity: func() (int, int64) { return detector.Capacity(time.Now(), store.Endpoints()) },
			TTL:      o.queueTTL,
			Poll:     time.Millisecond,
		})
		qctx, qcancel := context.WithCancel(context.Background())
		t.Cleanup(qcancel)
		go queue.Run(qctx)
	}
	p, err := epp.New(epp.Options{
		Store:      store,
		Scheduler:  loaded.Scheduler,
		Saturation: detector,
		Queue:      queue,
		// Scorers treat metrics as fresh for the whole test.
		MetricsStaleness: time.Minute,
		EmitScores:       o.emitScores,
		ConformanceTest:  o.conformance,
		Registerer:       reg,
		Logger:           logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var node *peers.Node
	if o.withPeers {
		if node, err = peers.Start(context.Background(), peers.Config{Bind: "127.0.0.1:0", Join: o.join}, p, logr.Discard()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(node.Stop)
		reg.MustRegister(node)
		p.SetPeers(node)
	}
	srv, err := server.New(p, server.Options{GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", Limits: server.Limits{MaxRequestBodyBytes: o.bodyLimit, RequestIdleTimeout: 30 * time.Second} /* the flag's default */, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(done) }()
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); cancel(); <-done })
	return &rig{store: store, srv: srv, conn: conn, reg: reg, peers: node, picker: p}
}

func specs(addrs ...string) []datastore.Spec {
	out := make([]datastore.Spec, len(addrs))
	for i, a := range addrs {
		out[i] = datastore.Spec{Address: a}
	}
	return out
}

// call is one request as a proxy sends it.
type call struct {
	headers       map[string]string
	body          []byte // nil: headers carry end_of_stream
	chunk         int    // body chunk size, default whole body
	hint          *structpb.Value
	hintOnHeaders bool
}

// answer is what the picker sent back for the request path.
type answer struct {
	headers   *extprocv3.HeadersResponse
	metadata  *structpb.Struct
	body      []byte
	immediate *extprocv3.ImmediateResponse
	stream    extprocv3.ExternalProcessor_ProcessClient
}

func (r *rig) do(t testing.TB, c call) *answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	st, err := extprocv3.NewExternalProcessorClient(r.conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")}}}
	for k, v := range c.headers {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	var md *corev3.Metadata
	if c.hint != nil {
		md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			wire.SubsetHintNamespace: {Fields: map[string]*structpb.Value{wire.SubsetKey: c.hint}},
		}}
	}
	hdrs := &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: c.body == nil}},
	}
	if c.hintOnHeaders || c.body == nil {
		hdrs.MetadataContext = md
	}
	// send reports false once the picker closed the stream (after an
	// immediate response Envoy stops sending too).
	send := func(m *extprocv3.ProcessingRequest) bool {
		err := st.Send(m)
		if errors.Is(err, io.EOF) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return true
	}
	send(hdrs)
	if c.body != nil {
		size := c.chunk
		if size <= 0 {
			size = max(len(c.body), 1)
		}
		for off := 0; off < len(c.body) || off == 0; off += size {
			end := min(off+size, len(c.body))
			m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: c.body[off:end], EndOfStream: end == len(c.body)}}}
			if end == len(c.body) && !c.hintOnHeaders {
				m.MetadataContext = md
			}
			if !send(m) || end == len(c.body) {
				break
			}
		}
	}
	a := &answer{stream: st}
	for {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		switch x := resp.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			a.immediate = x.ImmediateResponse
			return a
		case *extprocv3.ProcessingResponse_RequestHeaders:
			a.headers = x.RequestHeaders
			a.metadata = resp.GetDynamicMetadata()
			if c.body == nil {
				return a
			}
		case *extprocv3.ProcessingResponse_RequestBody:
			sr := x.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				t.Fatal("body answered without streamed_response")
			}
			a.body = append(a.body, sr.GetBody()...)
			if sr.GetEndOfStream() {
				return a
			}
		default:
			t.Fatalf("unexpected response %T", x)
		}
	}
}

func (a *answer) header(t *testing.T, name string) (string, bool) {
	t.Helper()
	for _, h := range a.headers.GetResponse().GetHeaderMutation().GetSetHeaders() {
		if strings.EqualFold(h.GetHeader().GetKey(), name) {
			return string(h.GetHeader().GetRawValue()), true
		}
	}
	return "", false
}

func (a *answer) lb(key string) string {
	return a.metadata.GetFields()[wire.LBNamespace].GetStructValue().GetFields()[key].GetStringValue()
}

// destination checks the header and the metadata agree and returns them.
func (a *answer) destination(t *testing.T) string {
	t.Helper()
	if a.immediate != nil {
		t.Fatalf("immediate response %d (%s) instead of a pick", a.immediate.GetStatus().GetCode(), a.immediate.GetBody())
	}
	h, ok := a.header(t, wire.DestinationEndpointKey)
	if !ok {
		t.Fatal("no destination header")
	}
	if md := a.lb(wire.DestinationEndpointKey); md != h {
		t.Fatalf("header %q and envoy.lb metadata %q differ", h, md)
	}
	if !a.headers.GetResponse().GetClearRouteCache() {
		t.Fatal("clear_route_cache not set with the pick")
	}
	return h
}

func (a *answer) wantImmediate(t *testing.T, status int, reason string) {
	t.Helper()
	if a.immediate == nil {
		t.Fatalf("want immediate %d, got a pick", status)
	}
	if got := int(a.immediate.GetStatus().GetCode()); got != status {
		t.Fatalf("status %d, want %d (%s)", got, status, a.immediate.GetBody())
	}
	var got string
	for _, h := range a.immediate.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == wire.DropReasonHeader {
			got = string(h.GetHeader().GetRawValue())
		}
	}
	if got != reason {
		t.Fatalf("drop reason %q, want %q", got, reason)
	}
}

var completion = []byte(`{"model":"m","prompt":"hello"}`)

func TestPickGoesOutAsHeaderAndMetadata(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000", "10.0.0.2:8000")})
	a := r.do(t, call{body: completion})
	dest := a.destination(t)
	if dest != "10.0.0.1:8000" && dest != "10.0.0.2:8000" {
		t.Fatalf("destination %q is not a pool endpoint", dest)
	}
	if string(a.body) != string(completion) {
		t.Fatalf("body changed: %q", a.body)
	}
}

// queueWithFallbacks is a profile that ranks by waiting queue and answers
// the best n endpoints.
func queueWithFallbacks(n int) string {
	return fmt.Sprintf(`apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: %d}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
`, n)
}

func TestFallbackListIsDistinctAndBestFirst(t *testing.T) {
	cfg := queueWithFallbacks(3)
	r := newRig(t, rigOpts{configText: cfg, endpoints: specs("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000")})
	queues := map[string]int{"10.0.0.1:8000": 9, "10.0.0.2:8000": 0, "10.0.0.3:8000": 3, "10.0.0.4:8000": 6}
	for addr, q := range queues {
		r.store.Get(addr).SetMetrics(&datastore.Metrics{WaitingQueueSize: q, UpdatedAt: time.Now()})
	}
	dest := r.do(t, call{body: completion}).destination(t)
	if dest != "10.0.0.2:8000,10.0.0.3:8000,10.0.0.4:8000" {
		t.Fatalf("destination %q, want the three least-queued, best first", dest)
	}
}

func TestSubsetHint(t *testing.T) {
	pool := specs("10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "[fd00::1]:8000")
	list := func(s ...string) *structpb.Value {
		vals := make([]any, len(s))
		for i, v := range s {
			vals[i] = v
		}
		lv, _ := structpb.NewList(vals)
		return structpb.NewListValue(lv)
	}
	str := structpb.NewStringValue
	cases := []struct {
		name      string
		hint      *structpb.Value
		onHeaders bool
		bodyless  bool
		allowed   []string // empty: want 503
	}{
		{"list exact ip:port", list("10.0.0.1:8001"), false, false, []string{"10.0.0.1:8001"}},
		{"comma string exact", str("10.0.0.2:8000, 10.0.0.1:8001"), false, false, []string{"10.0.0.2:8000", "10.0.0.1:8001"}},
		{"ip only matches every port", list("10.0.0.1"), false, false, []string{"10.0.0.1:8000", "10.0.0.1:8001"}},
		{"ipv6 spelled differently", str("[fd00:0::1]:8000"), false, false, []string{"[fd00::1]:8000"}},
		{"hint on the headers message", list("10.0.0.2:8000"), true, false, []string{"10.0.0.2:8000"}},
		{"body-less request", list("10.0.0.1:8001"), true, true, []string{"10.0.0.1:8001"}},
		{"empty list", list(), false, false, nil},
		{"empty string", str(""), false, false, nil},
		{"nothing eligible", list("10.9.9.9:8000"), false, false, nil},
		{"port mismatch", list("10.0.0.2:9999"), false, false, nil},
		{"body-less nothing eligible", list("10.9.9.9:1"), true, true, nil},
	}
	r := newRig(t, rigOpts{endpoints: pool})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := call{body: completion, hint: tc.hint, hintOnHeaders: tc.onHeaders}
			if tc.bodyless {
				c.body = nil
			}
			for range 20 { // random tie-breaks must stay inside the subset
				a := r.do(t, c)
				if len(tc.allowed) == 0 {
					a.wantImmediate(t, 503, epp.ReasonNoEndpoints)
					return
				}
				dest := a.destination(t)
				ok := false
				for _, al := range tc.allowed {
					ok = ok || dest == al
				}
				if !ok {
					t.Fatalf("destination %q outside the subset %v", dest, tc.allowed)
				}
			}
		})
	}
}

func TestHeaderTestingFilterSteersThePick(t *testing.T) {
	const steered = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-based-testing-filter
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: header-based-testing-filter
  - pluginRef: random-picker
`
	r := newRig(t, rigOpts{configText: steered, endpoints: specs("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")})
	for range 20 {
		a := r.do(t, call{body: completion, headers: map[string]string{wire.EndpointSelectionHeader: "10.0.0.2:8000"}})
		if got := a.destination(t); got != "10.0.0.2:8000" {
			t.Fatalf("destination %q, want the steered 10.0.0.2:8000", got)
		}
	}
	// Without the header every endpoint stays a candidate, as in the
	// upstream suite's picker (its status probes name none).
	seen := map[string]bool{}
	for range 60 {
		seen[r.do(t, call{body: completion}).destination(t)] = true
	}
	if len(seen) != 3 {
		t.Fatalf("without the header the picks went to %v, want all three endpoints", seen)
	}
	r.do(t, call{body: completion, headers: map[string]string{wire.EndpointSelectionHeader: "10.0.0.9:8000"}}).wantImmediate(t, 503, epp.ReasonNoEndpoints)
}

func TestNoReadyEndpointIs503(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: []datastore.Spec{}})
	r.do(t, call{body: completion}).wantImmediate(t, 503, epp.ReasonNoEndpoints)
	r.do(t, call{}).wantImmediate(t, 503, epp.ReasonNoEndpoints)
}

func TestSheddableRequestGets429UnderSaturation(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000"), objectives: []datastore.Objective{{Name: "batch", Priority: -1}, {Name: "chat", Priority: 10}}})
	r.store.Get("10.0.0.1:8000").SetMetrics(&datastore.Metrics{WaitingQueueSize: 50, UpdatedAt: time.Now()})
	r.do(t, call{body: completion, headers: map[string]string{wire.ObjectiveHeader: "batch"}}).wantImmediate(t, 429, epp.ReasonSaturated)
	r.do(t, call{body: completion, headers: map[string]string{wire.LegacyObjectiveHeader: "batch"}}).wantImmediate(t, 429, epp.ReasonSaturated)
	// Non-sheddable work still gets a pick when saturated.
	r.do(t, call{body: completion, headers: map[string]string{wire.ObjectiveHeader: "chat"}}).destination(t)
	r.do(t, call{body: completion}).destination(t)
	// Once the pool has room, sheddable work goes through.
	r.store.Get("10.0.0.1:8000").SetMetrics(&datastore.Metrics{UpdatedAt: time.Now()})
	r.do(t, call{body: completion, headers: map[string]string{wire.ObjectiveHeader: "batch"}}).destination(t)
}

// The picker reads objectives from the store for every request: a source
// that changes them (a reloaded pool file, an InferenceObjective edit)
// changes the next request's fate.
func TestObjectivesAreReadFromTheStore(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000")})
	r.store.Get("10.0.0.1:8000").SetMetrics(&datastore.Metrics{WaitingQueueSize: 50, UpdatedAt: time.Now()})
	batch := call{body: completion, headers: map[string]string{wire.ObjectiveHeader: "batch"}}
	r.do(t, batch).destination(t) // unknown objective: priority 0
	r.store.SetObjectives([]datastore.Objective{{Name: "batch", Priority: -1}})
	r.do(t, batch).wantImmediate(t, 429, epp.ReasonSaturated)
	r.store.SetObjectives([]datastore.Objective{{Name: "batch", Priority: 1}})
	r.do(t, batch).destination(t)
}

func TestModelRewritesAreReadFromTheStore(t *testing.T) {
	body := []byte(`{"model":"sql-lora","prompt":"hello"}`)
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000"), rewrites: []datastore.ModelRewrite{
		{Models: []string{"sql-lora"}, Targets: []datastore.RewriteTarget{{Model: "sql-lora-v2", Weight: 1}}},
		{Models: []string{"base"}, Targets: []datastore.RewriteTarget{{Model: "base", Weight: 1}}},
	}})
	if a := r.do(t, call{body: body}); string(a.body) != `{"model":"sql-lora-v2","prompt":"hello"}` {
		t.Fatalf("rewritten body %q", a.body)
	}
	for _, b := range [][]byte{completion, []byte(`{"model":"base","prompt":"hello"}`)} {
		if a := r.do(t, call{body: b}); string(a.body) != string(b) {
			t.Errorf("body %s, which no rule changes, came back %q", b, a.body)
		}
	}
	r.store.SetModelRewrites(nil)
	if a := r.do(t, call{body: body}); string(a.body) != string(body) {
		t.Fatalf("body %q after the rules were removed", a.body)
	}
}

func TestPaddingOutsideThePromptDoesNotFillThePool(t *testing.T) {
	// A 1-token prompt padded with 1 MB in a field the model never reads
	// must count as 1 token of pending KV, or a few such requests make an
	// idle pool look saturated and shed everyone's sheddable traffic.
	const kvTokens = 16 * 1024 // BlockSize 16 × 1024 blocks
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000"), bodyLimit: 4 << 20, objectives: []datastore.Objective{{Name: "batch", Priority: -1}}})
	ep := r.store.Get("10.0.0.1:8000")
	ep.SetMetrics(&datastore.Metrics{BlockSize: 16, NumGPUBlocks: 1024, UpdatedAt: time.Now()})
	padded := []byte(fmt.Sprintf(`{"model":"m","prompt":"hi","user":%q}`, strings.Repeat("x", 1<<20)))
	for range 3 {
		r.do(t, call{body: padded, chunk: 64 << 10}).destination(t)
	}
	if got := ep.Pending(); got > 3 {
		t.Fatalf("pending KV %d tokens after three 1-token prompts", got)
	}
	r.do(t, call{body: completion, headers: map[string]string{wire.ObjectiveHeader: "batch"}}).destination(t)

	// The prompt itself still counts: a long prompt is real KV.
	long := []byte(fmt.Sprintf(`{"model":"m","prompt":%q}`, strings.Repeat("word ", kvTokens)))
	r.do(t, call{body: long, chunk: 64 << 10}).destination(t)
	if got := ep.Pending(); got < kvTokens/2 {
		t.Fatalf("pending KV %d tokens after a %d-byte prompt", got, len(long))
	}
	r.do(t, call{body: completion, headers: map[string]string{wire.ObjectiveHeader: "batch"}}).wantImmediate(t, 429, epp.ReasonSaturated)
}

func TestShedRequestsAreToldToComeBackSpreadOut(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000"), objectives: []datastore.Objective{{Name: "batch", Priority: -1}}})
	r.store.Get("10.0.0.1:8000").SetMetrics(&datastore.Metrics{WaitingQueueSize: 50, UpdatedAt: time.Now()})
	seen := map[int]bool{}
	for range 20 {
		a := r.do(t, call{body: completion, headers: map[string]string{wire.ObjectiveHeader: "batch"}})
		a.wantImmediate(t, 429, epp.ReasonSaturated)
		h := map[string]string{}
		for _, hv := range a.immediate.GetHeaders().GetSetHeaders() {
			h[hv.GetHeader().GetKey()] = string(hv.GetHeader().GetRawValue())
		}
		ms, err := strconv.Atoi(h["retry-after-ms"])
		if err != nil || ms < int(epp.RetryAfterMin.Milliseconds()) || ms >= int(epp.RetryAfterMax.Milliseconds()) {
			t.Fatalf("retry-after-ms %q outside [%v, %v)", h["retry-after-ms"], epp.RetryAfterMin, epp.RetryAfterMax)
		}
		if want := strconv.Itoa((ms + 999) / 1000); h["retry-after"] != want {
			t.Fatalf("retry-after %q with retry-after-ms %d, want %s", h["retry-after"], ms, want)
		}
		seen[ms] = true
	}
	if len(seen) < 10 {
		t.Fatalf("20 refusals named only %d distinct pauses: clients would come back together", len(seen))
	}
}

func TestSheddableRequestIsRefusedBeforeItsBody(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000"), objectives: []datastore.Objective{{Name: "batch", Priority: -1}}})
	r.store.Get("10.0.0.1:8000").SetMetrics(&datastore.Metrics{WaitingQueueSize: 50, UpdatedAt: time.Now()})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := extprocv3.NewExternalProcessorClient(r.conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Headers that announce a body which never comes: only an answer from
	// the headers alone can arrive.
	err = st.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: wire.ObjectiveHeader, RawValue: []byte("batch")},
		}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("no answer to the headers: %v", err)
	}
	a := &answer{immediate: resp.GetImmediateResponse()}
	a.wantImmediate(t, 429, epp.ReasonSaturated)
	if got := counterValue(t, r.reg, "infergate_epp_decisions_total", "outcome", "shed"); got != 1 {
		t.Fatalf("shed decisions %v, want 1", got)
	}
}

func TestBodylessRequestIsPickedAtOnce(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000")})
	a := r.do(t, call{headers: map[string]string{":method": "GET"}})
	if a.destination(t) != "10.0.0.1:8000" {
		t.Fatal("wrong pick")
	}
}

func TestLargeBodyInManyChunksLeavesUnchanged(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000"), bodyLimit: 4 << 20})
	prompt := strings.Repeat("lorem ipsum ", 250_000) // ~3 MB
	body := []byte(fmt.Sprintf(`{"model":"m","prompt":%q}`, prompt))
	a := r.do(t, call{body: body, chunk: 16 << 10})
	a.destination(t)
	if len(a.body) != len(body) || string(a.body) != string(body) {
		t.Fatalf("body of %d bytes came back as %d bytes", len(body), len(a.body))
	}
	over := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000"), bodyLimit: 1 << 20})
	over.do(t, call{body: body, chunk: 16 << 10}).wantImmediate(t, 413, "request-too-large")
}

func TestBadBodies(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000")})
	for name, body := range map[string]string{"malformed": `{"model":`, "missing model": `{"prompt":"x"}`} {
		t.Run(name, func(t *testing.T) {
			a := r.do(t, call{body: []byte(body)})
			a.wantImmediate(t, 400, epp.ReasonBadRequest)
			if !strings.Contains(string(a.immediate.GetBody()), "model") && !strings.Contains(string(a.immediate.GetBody()), "JSON") {
				t.Errorf("error body gives no reason: %s", a.immediate.GetBody())
			}
		})
	}
}

func TestClientSuppliedDestinationIsOverwritten(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000")})
	for _, body := range [][]byte{completion, nil} {
		a := r.do(t, call{body: body, headers: map[string]string{wire.DestinationEndpointKey: "6.6.6.6:22"}})
		if a.destination(t) != "10.0.0.1:8000" {
			t.Fatal("client header survived")
		}
		var overwrite bool
		for _, h := range a.headers.GetResponse().GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == wire.DestinationEndpointKey {
				overwrite = h.GetAppendAction() == corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
			}
		}
		if !overwrite {
			t.Fatal("destination header is not set with OVERWRITE_IF_EXISTS_OR_ADD; a client value could be appended to")
		}
	}
}

// respondHeaders sends the upstream's response headers with the served
// endpoint (none when md is nil) and returns the picker's answer.
func respondHeaders(t *testing.T, a *answer, md *corev3.Metadata) *extprocv3.HeadersResponse {
	t.Helper()
	msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}, EndOfStream: true,
	}}, MetadataContext: md}
	if err := a.stream.Send(msg); err != nil {
		t.Fatal(err)
	}
	resp, err := a.stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = a.stream.CloseSend()
	_, _ = a.stream.Recv() // EOF once the picker closed the exchange
	return resp.GetResponseHeaders()
}

func servedMetadata(fields map[string]*structpb.Value) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{wire.LBNamespace: {Fields: fields}}}
}

// TestConformanceTestMode: the picker the upstream conformance suite runs
// asks the echo server to name the pick, and reports on the response the
// endpoint the proxy says served, or why it cannot.
func TestConformanceTestMode(t *testing.T) {
	r := newRig(t, rigOpts{conformance: true, endpoints: specs("10.0.0.1:3000")})
	a := r.do(t, call{})
	if got, _ := a.header(t, wire.EchoSetHeader); got != wire.ConformanceServedHeader+":10.0.0.1:3000" {
		t.Fatalf("%s = %q", wire.EchoSetHeader, got)
	}
	cases := []struct {
		name string
		md   *corev3.Metadata
		want string
	}{
		{"served reported", servedMetadata(map[string]*structpb.Value{wire.ServedEndpointKey: structpb.NewStringValue("10.0.0.1:3000")}), "10.0.0.1:3000"},
		{"no envoy.lb metadata", nil, "fail: missing envoy lb metadata"},
		{"no served key", servedMetadata(map[string]*structpb.Value{"other": structpb.NewStringValue("x")}), "fail: missing destination endpoint served metadata"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := respondHeaders(t, r.do(t, call{body: completion}), tc.md)
			var got string
			for _, o := range h.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if o.GetHeader().GetKey() == wire.ConformanceServedHeader {
					got = string(o.GetHeader().GetRawValue())
				}
			}
			if got != tc.want {
				t.Fatalf("%s = %q, want %q", wire.ConformanceServedHeader, got, tc.want)
			}
		})
	}
	// The shed header: refused as a saturated pool refuses, with the
	// pause to come back after.
	shed := r.do(t, call{headers: map[string]string{wire.ShedTestHeader: "1"}, body: completion})
	shed.wantImmediate(t, 429, epp.ReasonSaturated)
	if !slices.ContainsFunc(shed.immediate.GetHeaders().GetSetHeaders(), func(o *corev3.HeaderValueOption) bool {
		return o.GetHeader().GetKey() == "retry-after"
	}) {
		t.Fatalf("shed without retry-after: %v", shed.immediate)
	}
	// The fallback header: every named endpoint, in the selection's order
	// (an IP names each of its ports), whatever the scheduler picked.
	lists := newRig(t, rigOpts{conformance: true, configText: config.ConformanceTestConfig,
		endpoints: specs("10.0.0.1:3000", "10.0.0.1:3001", "10.0.0.2:3000", "10.0.0.3:3000")})
	for _, tc := range []struct{ selection, want string }{
		{"10.0.0.2:3000,10.0.0.1:3001", "10.0.0.2:3000,10.0.0.1:3001"},
		{"10.0.0.1:3001, 10.0.0.1:3000", "10.0.0.1:3001,10.0.0.1:3000"},
		{"10.0.0.3,10.0.0.1", "10.0.0.3:3000,10.0.0.1:3000,10.0.0.1:3001"},
		{"192.0.2.1:3000,10.0.0.2:3000", "10.0.0.2:3000"},
	} {
		for range 5 { // the scheduler picks at random among them: the answer must not vary
			a := lists.do(t, call{headers: map[string]string{wire.FallbackTestHeader: "true", wire.EndpointSelectionHeader: tc.selection}, body: completion})
			if got := a.destination(t); got != tc.want {
				t.Fatalf("selection %q with the fallback header: destination %q, want %q", tc.selection, got, tc.want)
			}
		}
	}
	// Outside the mode neither header is added, and the shed header is
	// nobody's to send.
	plain := newRig(t, rigOpts{endpoints: specs("10.0.0.1:3000")})
	if plain.do(t, call{headers: map[string]string{wire.ShedTestHeader: "1"}, body: completion}).immediate != nil {
		t.Fatal("the shed header refused a request outside conformance-test mode")
	}
	a = plain.do(t, call{})
	if _, ok := a.header(t, wire.EchoSetHeader); ok {
		t.Fatal("X-Echo-Set-Header outside conformance-test mode")
	}
	if h := respondHeaders(t, plain.do(t, call{body: completion}), nil); len(h.GetResponse().GetHeaderMutation().GetSetHeaders()) != 0 {
		t.Fatalf("response headers set outside conformance-test mode: %v", h)
	}
}

func TestServedEndpointIsRecorded(t *testing.T) {
	cfg := queueWithFallbacks(2)
	r := newRig(t, rigOpts{configText: cfg, endpoints: specs("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")})
	respond := func(a *answer, served string) {
		t.Helper()
		var md *corev3.Metadata
		if served != "" {
			md = servedMetadata(map[string]*structpb.Value{wire.ServedEndpointKey: structpb.NewStringValue(served)})
		}
		respondHeaders(t, a, md)
	}
	a := r.do(t, call{body: completion})
	list := strings.Split(a.destination(t), ",")
	respond(a, list[0])
	a = r.do(t, call{body: completion})
	list = strings.Split(a.destination(t), ",")
	respond(a, list[1])
	respond(r.do(t, call{body: completion}), "")
	served := func(match string) float64 {
		return counterValue(t, r.reg, "infergate_epp_served_total", "match", match)
	}
	if served("primary") != 1 || served("fallback") != 1 || served("unreported") != 1 {
		t.Fatalf("served: primary %v fallback %v unreported %v", served("primary"), served("fallback"), served("unreported"))
	}
}

// valueOf is a counter's or a gauge's value.
func valueOf(m *dto.Metric) float64 {
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetCounter().GetValue()
}

// counterValue is the value of the series of name with label=value (a
// counter or a gauge).
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" {
				return valueOf(m)
			}
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return valueOf(m)
				}
			}
		}
	}
	return 0
}

func TestEmittedScoresCoverEveryCandidate(t *testing.T) {
	cfg := `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: lora-affinity-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: lora-affinity-scorer, weight: 1}
`
	r := newRig(t, rigOpts{configText: cfg, endpoints: specs("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"), emitScores: true})
	r.store.Get("10.0.0.1:8000").SetMetrics(&datastore.Metrics{WaitingQueueSize: 4, UpdatedAt: time.Now()})
	r.store.Get("10.0.0.2:8000").SetMetrics(&datastore.Metrics{UpdatedAt: time.Now()})
	r.store.Get("10.0.0.3:8000").SetMetrics(&datastore.Metrics{WaitingQueueSize: 2, KVCacheUsage: 0.5, UpdatedAt: time.Now()})
	a := r.do(t, call{body: completion})
	if a.destination(t) != "10.0.0.2:8000" {
		t.Fatal("the idle endpoint should win")
	}
	scores := a.metadata.GetFields()[wire.LBNamespace].GetStructValue().GetFields()[wire.ScoresKey].GetStructValue().GetFields()
	if len(scores) != 3 {
		t.Fatalf("scores for %d endpoints, want 3: %v", len(scores), scores)
	}
	// queue 2, kv 2, lora 1 (no LoRA reported: 0 for all).
	want := map[string]float64{"10.0.0.1:8000": 0 + 2, "10.0.0.2:8000": 2 + 2, "10.0.0.3:8000": 1 + 1}
	for addr, w := range want {
		if got := scores[addr].GetNumberValue(); got != w {
			t.Errorf("score of %s = %v, want %v", addr, got, w)
		}
	}
}

// learner is a scorer that records what the picker tells it was served.
type learner struct {
	mu     sync.Mutex
	served []string
	picked [][]string
}

func (*learner) Type() string                                                                 { return "learner" }
func (*learner) Name() string                                                                 { return "learner" }
func (*learner) Score(context.Context, *scheduling.Request, []scheduling.Endpoint, []float64) {}
func (l *learner) Served(_ context.Context, _ *scheduling.Request, picked []string, served string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.picked = append(l.picked, picked)
	l.served = append(l.served, served)
}

func TestServedEndpointReachesLearningPlugins(t *testing.T) {
	loaded, err := config.Load([]byte(config.DefaultConfig))
	if err != nil {
		t.Fatal(err)
	}
	l := &learner{}
	prof := loaded.Scheduler.Profiles["default"]
	prof.Scorers = append(prof.Scorers, scheduling.WeightedScorer{Scorer: l, Weight: 1})
	store := datastore.New()
	if err := store.Replace(specs("10.0.0.1:8000", "10.0.0.2:8000")); err != nil {
		t.Fatal(err)
	}
	p, err := epp.New(epp.Options{Store: store, Scheduler: loaded.Scheduler, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ex := p.NewExchange(ctx)
	d := ex.HandleRequest(ctx, &server.Request{Headers: server.Headers{}, Body: completion})
	if d.Reject != nil {
		t.Fatalf("rejected: %+v", d.Reject)
	}
	md, _ := structpb.NewStruct(map[string]any{wire.ServedEndpointKey: "10.0.0.2:8000"})
	ex.Close(ctx, server.Summary{ResponseMetadata: server.Metadata{wire.LBNamespace: md}, ResponseStatus: 200})
	if len(l.served) != 1 || l.served[0] != "10.0.0.2:8000" || len(l.picked[0]) != 1 {
		t.Fatalf("learner saw served %v picked %v", l.served, l.picked)
	}
}

// TestDefaultProfileKeepsPrefixesTogether drives the default profile over
// gRPC: a prompt seen before goes back to the endpoint that took it, and
// new prompts spread over the pool.
func TestDefaultProfileKeepsPrefixesTogether(t *testing.T) {
	addrs := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
	r := newRig(t, rigOpts{endpoints: specs(addrs...)})
	for _, a := range addrs {
		r.store.Get(a).SetMetrics(&datastore.Metrics{UpdatedAt: time.Now()})
	}
	body := func(topic string) []byte {
		return []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question"}]}`,
			strings.Repeat(topic+" is the subject of this long shared system prompt. ", 40)))
	}
	home := map[string]string{}
	spread := map[string]int{}
	for i := range 6 {
		topic := fmt.Sprintf("topic-%d", i)
		home[topic] = r.do(t, call{body: body(topic)}).destination(t)
		spread[home[topic]]++
	}
	for _, a := range addrs {
		if spread[a] != 2 {
			t.Fatalf("six new prompts over three endpoints landed %v", spread)
		}
	}
	for round := range 5 {
		for topic, want := range home {
			if got := r.do(t, call{body: body(topic)}).destination(t); got != want {
				t.Fatalf("round %d: %s went to %s, its prefix is on %s", round, topic, got, want)
			}
		}
	}
}

func TestFlowControlHoldsRequestsUntilThePoolHasRoom(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000"), queueTTL: 5 * time.Second, objectives: []datastore.Objective{{Name: "batch", Priority: -1}}})
	full := func(q int) {
		r.store.Get("10.0.0.1:8000").SetMetrics(&datastore.Metrics{WaitingQueueSize: q, UpdatedAt: time.Now()})
	}
	full(20)
	got := make(chan *answer, 1)
	go func() {
		got <- r.do(t, call{body: completion, headers: map[string]string{wire.ObjectiveHeader: "batch"}})
	}()
	select {
	case a := <-got:
		t.Fatalf("answered while the pool was full: immediate %v", a.immediate)
	case <-time.After(100 * time.Millisecond):
	}
	full(0) // room again: the waiting request is picked, not shed
	select {
	case a := <-got:
		if a.destination(t) != "10.0.0.1:8000" {
			t.Fatal("wrong pick")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the queued request was not released")
	}
}

func TestFlowControlTTLExpiryIs429(t *testing.T) {
	r := newRig(t, rigOpts{endpoints: specs("10.0.0.1:8000"), queueTTL: 50 * time.Millisecond})
	r.store.Get("10.0.0.1:8000").SetMetrics(&datastore.Metrics{WaitingQueueSize: 20, UpdatedAt: time.Now()})
	r.do(t, call{body: completion}).wantImmediate(t, 429, epp.ReasonTTLExpired)
}
