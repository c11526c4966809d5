package envoysim

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/inference/wire"
	"github.com/infergate/infergate/test/loopback"
)

func post(t *testing.T, url, body string, kv ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(fakeproc.Ctx(t), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Add(kv[i], kv[i+1])
	}
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestProxyEndToEnd(t *testing.T) {
	a, b := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	epp := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: b.Addr, MetadataDest: b.Addr}))
	url := startProxy(t, Config{
		Filters:           []extprocfilter.FilterConfig{{Name: "epp", Target: epp.Addr}},
		FallbackEndpoints: []string{a.Addr},
	})
	reqBody := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	resp, body := post(t, url, reqBody)
	if resp.StatusCode != 200 || body != "hello from "+b.Addr {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if resp.Header.Get(UpstreamHeader) != b.Addr || resp.Header.Get("x-test-served") != b.Addr {
		t.Errorf("response headers %v", resp.Header)
	}
	h, got := b.Last()
	if string(got) != reqBody || h.Get(wire.DestinationEndpointKey) != b.Addr || a.Count() != 0 {
		t.Errorf("upstream got %q with %v; fallback used %d times", got, h, a.Count())
	}
	if h.Get("User-Agent") == "" {
		t.Error("client User-Agent not forwarded")
	}
}

func TestProxyFilterChain(t *testing.T) {
	// A payload processor rewrites the body and sets a header; the picker
	// after it must see both, and the response path must run in reverse.
	var seq, payloadSaw, eppSaw atomic.Int64
	payload := fakeproc.Start(t, func(c *fakeproc.Conn) error {
		var body []byte
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			switch v := req.Request.(type) {
			case *extprocv3.ProcessingRequest_RequestBody:
				body = append(body, v.RequestBody.GetBody()...)
				if v.RequestBody.GetEndOfStream() {
					_ = c.Send(fakeproc.HeadersResp(false, &extprocv3.CommonResponse{HeaderMutation: fakeproc.SetHeaders("x-gateway-model-name", "llama"), ClearRouteCache: true}))
					out := bytes.ReplaceAll(body, []byte(`"alias"`), []byte(`"meta-llama/Llama-3.1-8B"`))
					_ = c.Send(fakeproc.Streamed(false, out[:10], false))
					_ = c.Send(fakeproc.Streamed(false, out[10:], true))
				}
			case *extprocv3.ProcessingRequest_ResponseHeaders:
				payloadSaw.Store(seq.Add(1))
				_ = c.Send(fakeproc.HeadersResp(true, nil))
			case *extprocv3.ProcessingRequest_ResponseBody:
				_ = c.Send(fakeproc.Streamed(true, v.ResponseBody.GetBody(), v.ResponseBody.GetEndOfStream()))
			}
		}
	})
	up := fakeproc.StartUpstream(t, nil)
	epp := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: up.Addr, MetadataDest: up.Addr, Seq: &seq, RespSeen: &eppSaw}))
	url := startProxy(t, Config{Filters: []extprocfilter.FilterConfig{{Name: "payload", Target: payload.Addr}, {Name: "epp", Target: epp.Addr}}})

	resp, _ := post(t, url, `{"model":"alias"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	want := `{"model":"meta-llama/Llama-3.1-8B"}`
	var eppHeaders *extprocv3.HttpHeaders
	var eppBody []byte
	for _, m := range epp.Messages() {
		if h := m.GetRequestHeaders(); h != nil {
			eppHeaders = h
		}
		eppBody = append(eppBody, m.GetRequestBody().GetBody()...)
	}
	if string(eppBody) != want || extprocfilter.HeadersFromProto(eppHeaders.GetHeaders()).Get("x-gateway-model-name") != "llama" {
		t.Errorf("picker saw body %q headers %v", eppBody, extprocfilter.HeadersFromProto(eppHeaders.GetHeaders()))
	}
	h, got := up.Last()
	if string(got) != want || h.Get("Content-Length") != "" {
		t.Errorf("upstream got %q (content-length %q)", got, h.Get("Content-Length"))
	}
	if e, p := eppSaw.Load(), payloadSaw.Load(); e == 0 || p == 0 || e > p {
		t.Errorf("response path order: epp at %d, payload at %d; want epp first", e, p)
	}
}

func TestProxyRouting(t *testing.T) {
	a, b := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	refused := fakeproc.ClosedAddr(t)
	for _, tc := range []struct {
		name       string
		routing    RoutingMode
		epp        fakeproc.EPPOpts
		clientDest string // x-gateway-destination-endpoint sent by the client
		wantStatus int
		want       string // upstream that must serve
		wantBody   string
	}{
		{name: "override-host walks the list past a refused endpoint", epp: fakeproc.EPPOpts{HeaderDest: refused + "," + b.Addr, MetadataDest: refused + "," + b.Addr}, wantStatus: 200, want: b.Addr},
		{name: "override-host metadata wins over header", epp: fakeproc.EPPOpts{HeaderDest: b.Addr, MetadataDest: a.Addr}, wantStatus: 200, want: a.Addr},
		{name: "override-host header alone", epp: fakeproc.EPPOpts{HeaderDest: b.Addr}, wantStatus: 200, want: b.Addr},
		{name: "override-host all refused", epp: fakeproc.EPPOpts{MetadataDest: refused}, wantStatus: 503, wantBody: "upstream connect error or disconnect/reset before headers. reset reason: connection failure"},
		{name: "original-dst ignores metadata", routing: RoutingOriginalDstHeader, epp: fakeproc.EPPOpts{HeaderDest: b.Addr, MetadataDest: a.Addr}, wantStatus: 200, want: b.Addr},
		{name: "original-dst takes the first header instance", routing: RoutingOriginalDstHeader, epp: fakeproc.EPPOpts{HeaderDest: b.Addr, AppendHeader: true}, clientDest: a.Addr, wantStatus: 200, want: a.Addr},
		{name: "original-dst does not walk a list", routing: RoutingOriginalDstHeader, epp: fakeproc.EPPOpts{HeaderDest: b.Addr + "," + a.Addr}, wantStatus: 503, wantBody: "no healthy upstream"},
		{name: "original-dst unparsable", routing: RoutingOriginalDstHeader, epp: fakeproc.EPPOpts{HeaderDest: "pod-1:8000"}, wantStatus: 503, wantBody: "no healthy upstream"},
		{name: "no pick and no fallback", epp: fakeproc.EPPOpts{}, wantStatus: 503, wantBody: "no healthy upstream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			epp := fakeproc.Start(t, fakeproc.EPPHandler(tc.epp))
			url := startProxy(t, Config{Routing: tc.routing, Filters: []extprocfilter.FilterConfig{{Name: "epp", Target: epp.Addr}}, KeepClientDestination: tc.clientDest != ""})
			var kv []string
			if tc.clientDest != "" {
				kv = []string{wire.DestinationEndpointKey, tc.clientDest}
			}
			resp, body := post(t, url, `{"model":"m"}`, kv...)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d (%s)", resp.StatusCode, tc.wantStatus, body)
			}
			if tc.want != "" && (resp.Header.Get(UpstreamHeader) != tc.want || body != "hello from "+tc.want) {
				t.Errorf("served by %q (%s), want %s", resp.Header.Get(UpstreamHeader), body, tc.want)
			}
			if tc.wantBody != "" && body != tc.wantBody {
				t.Errorf("body %q, want %q", body, tc.wantBody)
			}
			// Router replies pass through the filter's response path too.
			if tc.wantStatus == 503 && resp.Header.Get("x-test-served") != "" {
				t.Errorf("served metadata on a local reply: %q", resp.Header.Get("x-test-served"))
			}
		})
	}
}

// TestClientCannotChooseItsUpstream: with the picker failing open and
// fallback endpoints, a client's own x-gateway-destination-endpoint is
// removed before the filters, so the cluster's balancing chooses, never the
// client (which could otherwise reach any address). The request has no
// body: with one, the picker's failed connection would come after the body
// reached the filter, and Envoy answers 500 (TestFailOpenNeedsNoBodyYet).
func TestClientCannotChooseItsUpstream(t *testing.T) {
	pool, rogue := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	for _, routing := range []RoutingMode{RoutingOverrideHost, RoutingOriginalDstHeader} {
		t.Run(string(routing), func(t *testing.T) {
			url := startProxy(t, Config{
				Routing:           routing,
				Filters:           []extprocfilter.FilterConfig{{Name: "epp", Target: fakeproc.ClosedAddr(t), FailureModeAllow: true}},
				FallbackEndpoints: []string{pool.Addr},
			})
			resp, body := post(t, url, "", wire.DestinationEndpointKey, rogue.Addr)
			if resp.StatusCode != 200 || resp.Header.Get(UpstreamHeader) != pool.Addr {
				t.Fatalf("%d %q via %q, want the pool's %s", resp.StatusCode, body, resp.Header.Get(UpstreamHeader), pool.Addr)
			}
			if rogue.Count() != 0 {
				t.Fatal("the client's chosen upstream was reached")
			}
		})
	}
}

func TestProxyFallback(t *testing.T) {
	a, b := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	for _, tc := range []struct {
		name     string
		failOpen bool
	}{{"fail-open round robin", true}, {"fail-close", false}} {
		t.Run(tc.name, func(t *testing.T) {
			url := startProxy(t, Config{
				Filters:           []extprocfilter.FilterConfig{{Name: "epp", Target: fakeproc.ClosedAddr(t), FailureModeAllow: tc.failOpen}},
				FallbackEndpoints: []string{a.Addr, b.Addr},
			})
			var served []string
			for range 4 {
				// GET: no body, so failing open is always possible.
				req, _ := http.NewRequestWithContext(fakeproc.Ctx(t), http.MethodGet, url+"/v1/models", nil)
				resp, err := httpClient().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				if !tc.failOpen {
					if resp.StatusCode != 500 {
						t.Fatalf("fail-close: status %d, want 500", resp.StatusCode)
					}
					continue
				}
				served = append(served, resp.Header.Get(UpstreamHeader))
			}
			if tc.failOpen && (served[0] == served[1] || served[0] != served[2] || served[1] != served[3]) {
				t.Errorf("fallback order %v is not round robin", served)
			}
		})
	}
}

func TestProxyFilterFailures(t *testing.T) {
	crashMidBody := func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return err
			}
			if req.GetRequestBody() != nil {
				return errors.New("crash")
			}
		}
	}
	// upAddr is the subtest's own upstream: a request a failed case let
	// through late must not be counted against the next case.
	var upAddr string
	plainBody := func(c *fakeproc.Conn) error {
		for {
			req, err := c.Recv()
			if err != nil {
				return nil
			}
			if req.GetRequestBody().GetEndOfStream() {
				_ = c.Send(fakeproc.HeadersResp(false, &extprocv3.CommonResponse{HeaderMutation: fakeproc.SetHeaders(wire.DestinationEndpointKey, upAddr)}))
				_ = c.Send(fakeproc.BodyResp(false, &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("{}")}}}))
			}
		}
	}
	deny := func(c *fakeproc.Conn) error {
		_, _ = c.Recv()
		_ = c.Send(fakeproc.Immediate(429, "too many requests", "x-llm-d-request-dropped-reason", "rejected-saturated"))
		_, _ = c.Recv()
		return nil
	}
	for _, tc := range []struct {
		name       string
		handle     func(*fakeproc.Conn) error
		failOpen   bool
		wantStatus int
		wantBody   string
	}{
		{name: "spurious plain body mutation", handle: plainBody, wantStatus: 500},
		{name: "fail-open after body reached the picker", handle: crashMidBody, failOpen: true, wantStatus: 500},
		{name: "immediate response passes through", handle: deny, wantStatus: 429, wantBody: "too many requests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := fakeproc.StartUpstream(t, nil)
			upAddr = up.Addr
			epp := fakeproc.Start(t, tc.handle)
			url := startProxy(t, Config{
				Filters:           []extprocfilter.FilterConfig{{Name: "epp", Target: epp.Addr, FailureModeAllow: tc.failOpen}},
				FallbackEndpoints: []string{up.Addr},
			})
			before := up.Count()
			resp, body := post(t, url, `{"model":"m"}`)
			if resp.StatusCode != tc.wantStatus || (tc.wantBody != "" && body != tc.wantBody) {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, body, tc.wantStatus, tc.wantBody)
			}
			if tc.wantStatus == 429 && resp.Header.Get("x-llm-d-request-dropped-reason") != "rejected-saturated" {
				t.Errorf("immediate response headers lost: %v", resp.Header)
			}
			if tc.wantStatus == 429 && up.Count() != before {
				t.Errorf("upstream reached %d times", up.Count()-before)
			}
		})
	}
}

func TestProxySSEStreams(t *testing.T) {
	release := make(chan struct{})
	up := fakeproc.StartUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		_, _ = io.WriteString(w, "data: first\n\n")
		_ = rc.Flush()
		select {
		case <-release:
		case <-time.After(5 * time.Second): // the client never saw the first event
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "data: second\n\n")
	})
	epp := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: up.Addr, MetadataDest: up.Addr}))
	url := startProxy(t, Config{Filters: []extprocfilter.FilterConfig{{Name: "epp", Target: epp.Addr}}})

	req, _ := http.NewRequestWithContext(fakeproc.Ctx(t), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	start := time.Now()
	line, err := br.ReadString('\n')
	if err != nil || line != "data: first\n" {
		t.Fatalf("first event %q: %v", line, err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("first event only arrived after the upstream gave up waiting")
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: second\n\n" {
		t.Fatalf("rest %q: %v", rest, err)
	}
}

func TestProxyNeverHangs(t *testing.T) {
	// A picker that never answers: in FULL_DUPLEX_STREAMED there is no
	// message timeout, so only the route timeout can end the request.
	epp := fakeproc.Start(t, func(c *fakeproc.Conn) error {
		<-c.Context().Done()
		return nil
	})
	url := startProxy(t, Config{
		Filters:  []extprocfilter.FilterConfig{{Name: "epp", Target: epp.Addr}},
		Timeouts: Timeouts{Route: 300 * time.Millisecond},
	})
	start := time.Now()
	resp, body := post(t, url, `{"model":"m"}`)
	if resp.StatusCode != http.StatusGatewayTimeout || time.Since(start) > 3*time.Second {
		t.Fatalf("status %d %q after %v", resp.StatusCode, body, time.Since(start))
	}
}

func TestProxyConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Routing: "random"},
		{FallbackEndpoints: []string{"pod:80"}},
		{Filters: []extprocfilter.FilterConfig{{Name: "x"}}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v): want an error", cfg)
		}
	}
}

// startProxy serves a Proxy on a loopback port until the test ends.
func startProxy(t *testing.T, cfg Config) string {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + loopback.Serve(t, p.Serve)
}

func httpClient() *http.Client { return &http.Client{Timeout: 10 * time.Second} }

// TestFailOpenNeedsNoBodyYet: a picker that dies fails open only for a
// request whose body has not reached the filter, as Envoy's
// FULL_DUPLEX_STREAMED rule goes (ProcessorState::canFailOpen): until the
// health check takes the picker out, a POST whose body came with its
// headers gets a 500 even with FailOpen, a request without a body is
// balanced over the fallback endpoints; once it is out (two failed checks
// 2 s apart), the stream fails at its start and every request fails open.
func TestFailOpenNeedsNoBodyYet(t *testing.T) {
	pool := fakeproc.StartUpstream(t, nil)
	epp := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: pool.Addr}))
	url := startProxy(t, Config{
		Filters:           []extprocfilter.FilterConfig{{Name: "epp", Target: epp.Addr, FailureModeAllow: true}},
		FallbackEndpoints: []string{pool.Addr},
	})
	if resp, body := post(t, url, `{"model":"m"}`); resp.StatusCode != 200 {
		t.Fatalf("picker up: %d %q", resp.StatusCode, body)
	}
	epp.Stop()
	stopped := time.Now()
	if resp, body := post(t, url, `{"model":"m"}`); resp.StatusCode != 500 {
		t.Fatalf("picker just died, body with the headers: %d %q, want 500", resp.StatusCode, body)
	}
	if resp, body := post(t, url, ""); resp.StatusCode != 200 {
		t.Fatalf("picker just died, no body: %d %q, want 200 from the fallback", resp.StatusCode, body)
	}
	// The checker needs two failed checks (ProcessorUnhealthyThreshold) at
	// its 2 s interval; 2 s more bound a check in flight and the scheduler.
	deadline := stopped.Add(3*2*time.Second + 2*time.Second)
	for {
		resp, _ := post(t, url, `{"model":"m"}`)
		if resp.StatusCode == 200 {
			t.Logf("the picker was taken out %s after it died", time.Since(stopped).Round(100*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d %s after the picker died: the health check never took it out", resp.StatusCode, time.Since(stopped))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestReplicasShareTheStreams: a processor of two hosts (two picker
// replicas) gets its streams in turn; once one dies and its health check
// takes it out, every stream goes to the other and no request fails.
func TestReplicasShareTheStreams(t *testing.T) {
	poolA, poolB := fakeproc.StartUpstream(t, nil), fakeproc.StartUpstream(t, nil)
	eppA := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: poolA.Addr}))
	eppB := fakeproc.Start(t, fakeproc.EPPHandler(fakeproc.EPPOpts{HeaderDest: poolB.Addr}))
	url := startProxy(t, Config{
		Filters:     []extprocfilter.FilterConfig{{Name: "epp", Target: eppA.Addr}},
		FilterHosts: map[string][]string{"epp": {eppA.Addr, eppB.Addr}},
	})
	for i := range 10 {
		if resp, body := post(t, url, `{"model":"m"}`); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if poolA.Count() != 5 || poolB.Count() != 5 {
		t.Fatalf("ten streams over two replicas: %d and %d, want 5 and 5 (round robin)", poolA.Count(), poolB.Count())
	}
	eppA.Stop()
	stopped := time.Now()
	// Until the check takes A out, its streams fail (FailClose): 500s.
	deadline := stopped.Add(3*2*time.Second + 2*time.Second)
	for ok := 0; ok < 10; {
		resp, _ := post(t, url, `{"model":"m"}`)
		if resp.StatusCode != 200 {
			ok = 0
			if time.Now().After(deadline) {
				t.Fatalf("still %d %s after replica A died", resp.StatusCode, time.Since(stopped))
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		ok++
	}
	before := poolB.Count()
	for i := range 10 {
		if resp, body := post(t, url, `{"model":"m"}`); resp.StatusCode != 200 {
			t.Fatalf("after A was taken out, request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if poolB.Count() != before+10 {
		t.Fatalf("after A was taken out B served %d of 10", poolB.Count()-before)
	}
}
