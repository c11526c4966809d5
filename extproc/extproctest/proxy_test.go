package extproctest

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
)

func post(t *testing.T, url, body string, kv ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
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
	a, b := startUpstream(t, nil), startUpstream(t, nil)
	epp := startServer(t, eppHandler(eppOpts{headerDest: b.addr, metadataDest: b.addr}))
	url := startProxy(t, Config{
		Filters:           []FilterConfig{{Name: "epp", Target: epp.addr}},
		FallbackEndpoints: []string{a.addr},
	})
	reqBody := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	resp, body := post(t, url, reqBody)
	if resp.StatusCode != 200 || body != "hello from "+b.addr {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if resp.Header.Get(UpstreamHeader) != b.addr || resp.Header.Get("x-test-served") != b.addr {
		t.Errorf("response headers %v", resp.Header)
	}
	h, got := b.last()
	if string(got) != reqBody || h.Get(DestinationEndpointKey) != b.addr || a.count() != 0 {
		t.Errorf("upstream got %q with %v; fallback used %d times", got, h, a.count())
	}
	if h.Get("User-Agent") == "" {
		t.Error("client User-Agent not forwarded")
	}
}

func TestProxyFilterChain(t *testing.T) {
	// A payload processor rewrites the body and sets a header; the picker
	// after it must see both, and the response path must run in reverse.
	var seq, payloadSaw, eppSaw atomic.Int64
	payload := startServer(t, func(c *conn) error {
		var body []byte
		for {
			req, err := c.recv()
			if err != nil {
				return nil
			}
			switch v := req.Request.(type) {
			case *extprocv3.ProcessingRequest_RequestBody:
				body = append(body, v.RequestBody.GetBody()...)
				if v.RequestBody.GetEndOfStream() {
					_ = c.send(headersResp(false, &extprocv3.CommonResponse{HeaderMutation: setHeaders("x-gateway-model-name", "llama"), ClearRouteCache: true}))
					out := bytes.ReplaceAll(body, []byte(`"alias"`), []byte(`"meta-llama/Llama-3.1-8B"`))
					_ = c.send(streamed(false, out[:10], false))
					_ = c.send(streamed(false, out[10:], true))
				}
			case *extprocv3.ProcessingRequest_ResponseHeaders:
				payloadSaw.Store(seq.Add(1))
				_ = c.send(headersResp(true, nil))
			case *extprocv3.ProcessingRequest_ResponseBody:
				_ = c.send(streamed(true, v.ResponseBody.GetBody(), v.ResponseBody.GetEndOfStream()))
			}
		}
	})
	up := startUpstream(t, nil)
	epp := startServer(t, eppHandler(eppOpts{headerDest: up.addr, metadataDest: up.addr, seq: &seq, respSeen: &eppSaw}))
	url := startProxy(t, Config{Filters: []FilterConfig{{Name: "payload", Target: payload.addr}, {Name: "epp", Target: epp.addr}}})

	resp, _ := post(t, url, `{"model":"alias"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	want := `{"model":"meta-llama/Llama-3.1-8B"}`
	var eppHeaders *extprocv3.HttpHeaders
	var eppBody []byte
	for _, m := range epp.messages() {
		if h := m.GetRequestHeaders(); h != nil {
			eppHeaders = h
		}
		eppBody = append(eppBody, m.GetRequestBody().GetBody()...)
	}
	if string(eppBody) != want || headersFromProto(eppHeaders.GetHeaders()).Get("x-gateway-model-name") != "llama" {
		t.Errorf("picker saw body %q headers %v", eppBody, headersFromProto(eppHeaders.GetHeaders()))
	}
	h, got := up.last()
	if string(got) != want || h.Get("Content-Length") != "" {
		t.Errorf("upstream got %q (content-length %q)", got, h.Get("Content-Length"))
	}
	if e, p := eppSaw.Load(), payloadSaw.Load(); e == 0 || p == 0 || e > p {
		t.Errorf("response path order: epp at %d, payload at %d; want epp first", e, p)
	}
}

func TestProxyRouting(t *testing.T) {
	a, b := startUpstream(t, nil), startUpstream(t, nil)
	refused := closedAddr(t)
	for _, tc := range []struct {
		name       string
		routing    RoutingMode
		epp        eppOpts
		clientDest string // x-gateway-destination-endpoint sent by the client
		wantStatus int
		want       string // upstream that must serve
		wantBody   string
	}{
		{name: "override-host walks the list past a refused endpoint", epp: eppOpts{headerDest: refused + "," + b.addr, metadataDest: refused + "," + b.addr}, wantStatus: 200, want: b.addr},
		{name: "override-host metadata wins over header", epp: eppOpts{headerDest: b.addr, metadataDest: a.addr}, wantStatus: 200, want: a.addr},
		{name: "override-host header alone", epp: eppOpts{headerDest: b.addr}, wantStatus: 200, want: b.addr},
		{name: "override-host all refused", epp: eppOpts{metadataDest: refused}, wantStatus: 503, wantBody: "upstream connect error or disconnect/reset before headers. reset reason: connection failure"},
		{name: "original-dst ignores metadata", routing: RoutingOriginalDstHeader, epp: eppOpts{headerDest: b.addr, metadataDest: a.addr}, wantStatus: 200, want: b.addr},
		{name: "original-dst takes the first header instance", routing: RoutingOriginalDstHeader, epp: eppOpts{headerDest: b.addr, appendHeader: true}, clientDest: a.addr, wantStatus: 200, want: a.addr},
		{name: "original-dst does not walk a list", routing: RoutingOriginalDstHeader, epp: eppOpts{headerDest: b.addr + "," + a.addr}, wantStatus: 503, wantBody: "no healthy upstream"},
		{name: "original-dst unparsable", routing: RoutingOriginalDstHeader, epp: eppOpts{headerDest: "pod-1:8000"}, wantStatus: 503, wantBody: "no healthy upstream"},
		{name: "no pick and no fallback", epp: eppOpts{}, wantStatus: 503, wantBody: "no healthy upstream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			epp := startServer(t, eppHandler(tc.epp))
			url := startProxy(t, Config{Routing: tc.routing, Filters: []FilterConfig{{Name: "epp", Target: epp.addr}}})
			var kv []string
			if tc.clientDest != "" {
				kv = []string{DestinationEndpointKey, tc.clientDest}
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

func TestProxyFallback(t *testing.T) {
	a, b := startUpstream(t, nil), startUpstream(t, nil)
	for _, tc := range []struct {
		name     string
		failOpen bool
	}{{"fail-open round robin", true}, {"fail-close", false}} {
		t.Run(tc.name, func(t *testing.T) {
			url := startProxy(t, Config{
				Filters:           []FilterConfig{{Name: "epp", Target: closedAddr(t), FailureModeAllow: tc.failOpen}},
				FallbackEndpoints: []string{a.addr, b.addr},
			})
			var served []string
			for range 4 {
				// GET: no body, so failing open is always possible.
				req, _ := http.NewRequestWithContext(testCtx(t), http.MethodGet, url+"/v1/models", nil)
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
	crashMidBody := func(c *conn) error {
		for {
			req, err := c.recv()
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
	plainBody := func(c *conn) error {
		for {
			req, err := c.recv()
			if err != nil {
				return nil
			}
			if req.GetRequestBody().GetEndOfStream() {
				_ = c.send(headersResp(false, &extprocv3.CommonResponse{HeaderMutation: setHeaders(DestinationEndpointKey, upAddr)}))
				_ = c.send(bodyResp(false, &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("{}")}}}))
			}
		}
	}
	deny := func(c *conn) error {
		_, _ = c.recv()
		_ = c.send(immediate(429, "too many requests", "x-llm-d-request-dropped-reason", "rejected-saturated"))
		_, _ = c.recv()
		return nil
	}
	for _, tc := range []struct {
		name       string
		handle     func(*conn) error
		failOpen   bool
		wantStatus int
		wantBody   string
	}{
		{name: "spurious plain body mutation", handle: plainBody, wantStatus: 500},
		{name: "fail-open after body reached the picker", handle: crashMidBody, failOpen: true, wantStatus: 500},
		{name: "immediate response passes through", handle: deny, wantStatus: 429, wantBody: "too many requests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startUpstream(t, nil)
			upAddr = up.addr
			epp := startServer(t, tc.handle)
			url := startProxy(t, Config{
				Filters:           []FilterConfig{{Name: "epp", Target: epp.addr, FailureModeAllow: tc.failOpen}},
				FallbackEndpoints: []string{up.addr},
			})
			before := up.count()
			resp, body := post(t, url, `{"model":"m"}`)
			if resp.StatusCode != tc.wantStatus || (tc.wantBody != "" && body != tc.wantBody) {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, body, tc.wantStatus, tc.wantBody)
			}
			if tc.wantStatus == 429 && resp.Header.Get("x-llm-d-request-dropped-reason") != "rejected-saturated" {
				t.Errorf("immediate response headers lost: %v", resp.Header)
			}
			if tc.wantStatus == 429 && up.count() != before {
				t.Errorf("upstream reached %d times", up.count()-before)
			}
		})
	}
}

func TestProxySSEStreams(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
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
	epp := startServer(t, eppHandler(eppOpts{headerDest: up.addr, metadataDest: up.addr}))
	url := startProxy(t, Config{Filters: []FilterConfig{{Name: "epp", Target: epp.addr}}})

	req, _ := http.NewRequestWithContext(testCtx(t), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
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
	epp := startServer(t, func(c *conn) error {
		<-c.srv.Context().Done()
		return nil
	})
	url := startProxy(t, Config{
		Filters:  []FilterConfig{{Name: "epp", Target: epp.addr}},
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
		{Filters: []FilterConfig{{Name: "x"}}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v): want an error", cfg)
		}
	}
}
