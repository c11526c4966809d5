package devproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/infergate/infergate/extproc/extproctest"
	"github.com/infergate/infergate/inference/wire"
	"google.golang.org/protobuf/encoding/protojson"
)

// Response headers the stand-in adds; Envoy has neither.
const (
	// UpstreamHeader names the endpoint that served, on every proxied response.
	UpstreamHeader = "x-infergate-upstream"
	// DebugMetadataHeader carries, when Config.DebugMetadata is set, the
	// envoy.lb dynamic metadata the filters emitted, as JSON.
	DebugMetadataHeader = "x-infergate-debug-envoy-lb"
)

// Timeouts bound the proxy's work so that no request can hang.
type Timeouts struct {
	// Route bounds a whole request: ext_proc streams, upstream, response
	// streaming. Default 60s.
	Route time.Duration
	// Connect bounds an upstream connect, like a cluster's connect_timeout. Default 5s.
	Connect time.Duration
	// Shutdown is the grace period for in-flight requests when Serve stops. Default 5s.
	Shutdown time.Duration
}

// Config configures a Proxy.
type Config struct {
	// Listen is the address ListenAndServe listens on, e.g. 127.0.0.1:8080.
	Listen string
	// Filters run in order on the request path and in reverse order on the
	// response path, as an Envoy HTTP filter chain does.
	Filters []extproctest.FilterConfig
	// Routing defaults to RoutingOverrideHost.
	Routing RoutingMode
	// FallbackEndpoints (ip:port) are used round robin when no filter picked
	// an endpoint, like the cluster's normal load balancing.
	FallbackEndpoints []string
	Timeouts          Timeouts
	// DebugMetadata adds DebugMetadataHeader to responses so a developer
	// (or the demo) can see what the picker said, scores included.
	DebugMetadata bool
	Logger        logr.Logger
}

// Proxy is a loopback HTTP/1.1 reverse proxy that runs its requests through
// ext_proc filters the way Envoy does. It is an http.Handler.
type Proxy struct {
	cfg       Config
	clients   []*extproctest.Client
	transport *http.Transport
	log       logr.Logger
	next      atomic.Uint64 // round robin position
	closers   sync.WaitGroup
	closeOnce sync.Once
}

// New checks cfg and prepares the filters' gRPC channels.
func New(cfg Config) (*Proxy, error) {
	switch cfg.Routing {
	case "":
		cfg.Routing = RoutingOverrideHost
	case RoutingOverrideHost, RoutingOriginalDstHeader:
	default:
		return nil, fmt.Errorf("routing %q: want %s or %s", cfg.Routing, RoutingOverrideHost, RoutingOriginalDstHeader)
	}
	fallback := make([]string, 0, len(cfg.FallbackEndpoints))
	for _, s := range cfg.FallbackEndpoints {
		ep, err := ParseEndpoint(s)
		if err != nil {
			return nil, fmt.Errorf("fallback endpoints: %w", err)
		}
		fallback = append(fallback, ep)
	}
	cfg.FallbackEndpoints = fallback
	setDefault(&cfg.Timeouts.Route, 60*time.Second)
	setDefault(&cfg.Timeouts.Connect, 5*time.Second)
	setDefault(&cfg.Timeouts.Shutdown, 5*time.Second)

	p := &Proxy{cfg: cfg, log: cfg.Logger}
	for _, fc := range cfg.Filters {
		c, err := extproctest.NewClient(fc)
		if err != nil {
			_ = p.Close()
			return nil, err
		}
		p.clients = append(p.clients, c)
	}
	p.transport = &http.Transport{
		Proxy:               nil, // never an HTTP(S)_PROXY from the environment
		DialContext:         (&net.Dialer{Timeout: cfg.Timeouts.Connect, KeepAlive: 30 * time.Second}).DialContext,
		DisableCompression:  true, // pass bodies through byte for byte
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     60 * time.Second,
	}
	return p, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// ListenAndServe listens on Config.Listen and serves until ctx ends.
func (p *Proxy) ListenAndServe(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", p.cfg.Listen)
	if err != nil {
		return fmt.Errorf("devproxy listen: %w", err)
	}
	return p.Serve(ctx, ln)
}

// Serve serves on ln until ctx ends, then drains in-flight requests for up to
// Timeouts.Shutdown and closes the proxy.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.Timeouts.Shutdown)
		if serr := srv.Shutdown(sctx); serr != nil {
			_ = srv.Close()
		}
		cancel()
		err = <-errc
	}
	_ = p.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close waits for background stream closes and releases the gRPC channels.
func (p *Proxy) Close() error {
	var errs []error
	p.closeOnce.Do(func() {
		p.closers.Wait()
		for _, c := range p.clients {
			errs = append(errs, c.Close())
		}
		if p.transport != nil {
			p.transport.CloseIdleConnections()
		}
	})
	return errors.Join(errs...)
}

var errTimeout = errors.New("timeout")

// ServeHTTP proxies one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeoutCause(r.Context(), p.cfg.Timeouts.Route, errTimeout)
	defer cancel()
	// The streams get their own context so that, when the request ends
	// normally, they can be half-closed gracefully after the handler returns;
	// a client that leaves or a route timeout still cancels them at once.
	exCtx, exCancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, exCancel)
	var exs []*extproctest.Exchange
	defer func() {
		stop()
		p.closers.Add(1)
		go func() {
			defer p.closers.Done()
			for _, ex := range exs {
				_ = ex.Close()
			}
			exCancel()
		}()
	}()

	hdrs := requestHeaders(r)
	var body extproctest.Body
	if r.ContentLength != 0 {
		body = extproctest.BodyFromReader(r.Body, r.ContentLength)
	}
	for _, c := range p.clients {
		ex := c.Open(exCtx)
		exs = append(exs, ex)
		var err error
		hdrs, body, err = ex.Request(hdrs, body)
		if err != nil {
			p.requestFailed(ctx, w, exs, err)
			return
		}
	}

	targets, err := p.route(hdrs, exs)
	if err != nil {
		closeBody(body)
		p.log.Info("no upstream", "path", hdrs.Get(":path"), "reason", err.Error())
		p.routerReply(ctx, w, exs, err)
		return
	}
	var br *extproctest.BodyReader
	if body != nil {
		br = extproctest.NewBodyReader(ctx, body)
		defer br.Close()
	}
	resp, served, err := p.forward(ctx, hdrs, br, targets)
	if err != nil {
		closeBody(body)
		var lr *extproctest.LocalReply
		if br != nil && errors.As(br.Err(), &lr) {
			// A filter ended the request while its body was streaming upstream.
			writeLocalReply(w, lr)
			return
		}
		if context.Cause(ctx) == errTimeout {
			err = errTimeout
		}
		p.log.Info("upstream failed", "endpoint", served, "error", err.Error())
		p.routerReply(ctx, w, exs, err)
		return
	}
	defer resp.Body.Close()
	var rb extproctest.Body
	if resp.Body != http.NoBody {
		rb = extproctest.BodyFromReader(resp.Body, resp.ContentLength)
	}
	p.respond(ctx, w, exs, responseHeaders(resp), rb, served, served)
}

// closeBody drops a request body nobody will send upstream, so that filters
// still streaming it back do not block the response path behind it.
func closeBody(b extproctest.Body) {
	if b != nil {
		_ = b.Close()
	}
}

func (p *Proxy) requestFailed(ctx context.Context, w http.ResponseWriter, exs []*extproctest.Exchange, err error) {
	var lr *extproctest.LocalReply
	switch {
	case errors.As(err, &lr):
		if lr.Err != nil {
			p.log.Info("ext_proc local reply", "status", lr.Status, "details", lr.Details)
		}
		writeLocalReply(w, lr)
	case context.Cause(ctx) == errTimeout:
		writeTimeout(w)
	default:
		// The client went away; nobody is left to answer.
		p.log.V(1).Info("request abandoned", "error", err.Error())
	}
}

// routerReply answers with the router's own local reply, which, unlike an
// ext_proc reply, passes through the filters' response path, unless the
// request's time is already up.
func (p *Proxy) routerReply(ctx context.Context, w http.ResponseWriter, exs []*extproctest.Exchange, err error) {
	status, msg := upstreamError(err)
	if ctx.Err() != nil {
		writeLocalReply(w, &extproctest.LocalReply{Status: status, Body: []byte(msg)})
		return
	}
	h, b := routerReply(status, msg)
	p.respond(ctx, w, exs, h, b, "", "")
}

func writeTimeout(w http.ResponseWriter) {
	writeLocalReply(w, &extproctest.LocalReply{Status: http.StatusGatewayTimeout, Body: []byte("request timeout")})
}

// forward sends the request to the first target that accepts a connection.
// Walking to the next target is only safe while the body has not been read,
// since the proxy keeps no copy of it.
func (p *Proxy) forward(ctx context.Context, hdrs extproctest.Headers, br *extproctest.BodyReader, targets []string) (*http.Response, string, error) {
	for i, target := range targets {
		req, err := upstreamRequest(ctx, target, hdrs, br)
		if err != nil {
			return nil, target, err
		}
		resp, err := p.transport.RoundTrip(req)
		if err == nil {
			return resp, target, nil
		}
		if isConnectFailure(err) && (br == nil || !br.Touched()) && i+1 < len(targets) {
			p.log.V(1).Info("endpoint refused, trying the next", "endpoint", target, "error", err.Error())
			continue
		}
		return nil, target, err
	}
	return nil, "", errNoHealthyUpstream
}

// attemptBody keeps the request body open when the transport gives up on a
// connection before reading it, so the next endpoint can still be tried.
type attemptBody struct{ *extproctest.BodyReader }

func (b attemptBody) Close() error {
	if b.Touched() {
		return b.BodyReader.Close()
	}
	return nil
}

func upstreamRequest(ctx context.Context, target string, hdrs extproctest.Headers, br *extproctest.BodyReader) (*http.Request, error) {
	var body io.ReadCloser
	if br != nil {
		body = attemptBody{br}
	}
	req, err := http.NewRequestWithContext(ctx, hdrs.Get(":method"), "http://"+target+hdrs.Get(":path"), body)
	if err != nil {
		return nil, fmt.Errorf("building upstream request: %w", err)
	}
	req.Host = hdrs.Get(":authority")
	req.ContentLength = 0
	if br != nil {
		req.ContentLength = -1
	}
	for _, kv := range hdrs {
		switch {
		case strings.HasPrefix(kv.Key, ":"), hopByHop(kv.Key):
		case kv.Key == "content-length":
			if n, err := strconv.ParseInt(kv.Value, 10, 64); err == nil && br != nil {
				req.ContentLength = n
			}
		default:
			req.Header.Add(kv.Key, kv.Value)
		}
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = nil // Go would add its own; Envoy adds none
	}
	return req, nil
}

// respond runs the response path through the filters in reverse order and
// streams the result to the client, flushing every chunk so server-sent
// events arrive as they are produced.
func (p *Proxy) respond(ctx context.Context, w http.ResponseWriter, exs []*extproctest.Exchange, h extproctest.Headers, b extproctest.Body, served, upstream string) {
	for i := len(exs) - 1; i >= 0; i-- {
		var err error
		h, b, err = exs[i].Response(h, b, served)
		if err != nil {
			var lr *extproctest.LocalReply
			switch {
			case errors.As(err, &lr):
				writeLocalReply(w, lr)
			case context.Cause(ctx) == errTimeout:
				writeTimeout(w)
			}
			return
		}
	}
	status, err := strconv.Atoi(h.Get(":status"))
	if err != nil {
		status = http.StatusBadGateway
	}
	out := w.Header()
	for _, kv := range h {
		if !strings.HasPrefix(kv.Key, ":") && !hopByHop(kv.Key) {
			out.Add(kv.Key, kv.Value)
		}
	}
	if upstream != "" {
		out.Set(UpstreamHeader, upstream)
	}
	if p.cfg.DebugMetadata {
		for _, ex := range exs {
			if lb := ex.DynamicMetadata()[wire.LBNamespace]; lb != nil {
				if js, err := protojson.Marshal(lb); err == nil {
					out.Set(DebugMetadataHeader, string(js))
				}
			}
		}
	}
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	if b == nil {
		return
	}
	defer b.Close()
	for {
		c, err := b.Next(ctx)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			// The response has started, so Envoy can only reset the stream.
			p.log.Info("response aborted", "error", err.Error())
			panic(http.ErrAbortHandler)
		}
		if len(c.Data) > 0 {
			if _, err := w.Write(c.Data); err != nil {
				return
			}
			_ = rc.Flush()
		}
		if c.EndOfStream {
			return
		}
	}
}

func writeLocalReply(w http.ResponseWriter, lr *extproctest.LocalReply) {
	out := w.Header()
	for _, kv := range lr.Headers {
		if !strings.HasPrefix(kv.Key, ":") && !hopByHop(kv.Key) {
			out.Add(kv.Key, kv.Value)
		}
	}
	if len(lr.Body) > 0 && out.Get("Content-Type") == "" {
		out.Set("Content-Type", "text/plain")
	}
	out.Set("Content-Length", strconv.Itoa(len(lr.Body)))
	w.WriteHeader(lr.Status)
	_, _ = w.Write(lr.Body)
}

// requestHeaders builds the header map Envoy's HTTP/1 codec would: pseudo
// headers first, names lower case, hop-by-hop headers dropped. Go does not
// keep the arrival order, so regular headers are sorted.
func requestHeaders(r *http.Request) extproctest.Headers {
	h := extproctest.Headers{{Key: ":authority", Value: r.Host}, {Key: ":path", Value: r.RequestURI}, {Key: ":method", Value: r.Method}, {Key: ":scheme", Value: "http"}}
	return appendHeaders(h, r.Header)
}

func responseHeaders(resp *http.Response) extproctest.Headers {
	return appendHeaders(extproctest.Headers{{Key: ":status", Value: strconv.Itoa(resp.StatusCode)}}, resp.Header)
}

func appendHeaders(h extproctest.Headers, hdr http.Header) extproctest.Headers {
	keys := make([]string, 0, len(hdr))
	for k := range hdr {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		if hopByHop(lk) || lk == "host" {
			continue
		}
		for _, v := range hdr[k] {
			h.Add(lk, v)
		}
	}
	return h
}
