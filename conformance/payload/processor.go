package payload

import (
	"context"
	"fmt"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/wasm/wasmtest"
)

// Outcome is what one request's pass through the processor did, as the
// proxy in front of it saw it.
type Outcome struct {
	// Headers and Body are the request as it went on to the upstream.
	Headers extprocfilter.Headers
	Body    []byte
	// RouteCacheCleared: the processor had the proxy select the route
	// again (ext_proc clear_route_cache, Wasm's clear_route_cache foreign
	// function).
	RouteCacheCleared bool
	// HeadersWentOn: the request headers went on to the upstream, which
	// must not happen before a refusal.
	HeadersWentOn bool
	// Reply is the processor's immediate answer; nil when the request
	// went on.
	Reply *extprocfilter.LocalReply
}

// Processor passes one request through the payload processor under test,
// as the proxy in front of it does. An error means the pass itself failed
// (a broken stream, a plugin crash), not that the processor refused.
type Processor func(ctx context.Context, req extprocfilter.Request) (*Outcome, error)

// ExtProc is the ext_proc server at addr (TLS: dialled with TLS, any
// certificate accepted, as gateways configure processor clusters) behind
// Envoy's ext_proc filter as package extprocfilter plays it, with the processing
// mode the README asks for.
func ExtProc(addr string, tls bool) Processor {
	return func(ctx context.Context, req extprocfilter.Request) (*Outcome, error) {
		client, err := extprocfilter.NewClient(extprocfilter.FilterConfig{Name: "payload-conformance", Target: addr, TLS: tls,
			ProcessingMode: extprocfilter.DefaultProcessingMode()})
		if err != nil {
			return nil, fmt.Errorf("configuring the ext_proc client for %s: %w", addr, err)
		}
		defer client.Close()
		res, err := client.Run(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("the ext_proc exchange with %s did not complete: %w", addr, err)
		}
		if lr := res.LocalReply; lr != nil && lr.Err != nil {
			return nil, fmt.Errorf("the ext_proc stream with %s failed (the proxy would answer %d): %w", addr, lr.Status, lr.Err)
		}
		out := &Outcome{Headers: res.Headers, Body: res.Body, RouteCacheCleared: res.ClearRouteCache, Reply: res.LocalReply}
		for _, r := range res.Responses {
			if _, ok := r.GetResponse().(*extprocv3.ProcessingResponse_RequestHeaders); ok {
				out.HeadersWentOn = true
			}
		}
		return out, nil
	}
}

// WasmPlugin is a proxy-wasm plugin loaded in wasmtest's host, which
// plays Envoy's Wasm HTTP filter. The request's body chunks are delivered
// one callback each, as Envoy delivers the chunks it receives.
func WasmPlugin(h *wasmtest.Host) Processor {
	return func(ctx context.Context, req extprocfilter.Request) (*Outcome, error) {
		wr := wasmtest.Request{Method: req.Method, Path: req.Path, Authority: req.Authority, ChunkSizes: []int{}}
		for _, hd := range req.Headers {
			wr.Headers = append(wr.Headers, [2]string{hd.Key, hd.Value})
		}
		for _, c := range req.Body {
			wr.Body = append(wr.Body, c...)
			wr.ChunkSizes = append(wr.ChunkSizes, len(c))
		}
		res, err := h.Do(ctx, wr)
		if err != nil {
			return nil, fmt.Errorf("the Wasm plugin's pass: %w", err)
		}
		out := &Outcome{Headers: pairs(res.Headers), Body: res.Body, RouteCacheCleared: res.RouteCacheCleared > 0, HeadersWentOn: res.HeadersSent}
		if lr := res.Local; lr != nil {
			out.Reply = &extprocfilter.LocalReply{Status: int(lr.Status), Headers: pairs(lr.Headers), Body: lr.Body, Details: lr.Details}
		}
		return out, nil
	}
}

func pairs(hs [][2]string) extprocfilter.Headers {
	out := make(extprocfilter.Headers, 0, len(hs))
	for _, h := range hs {
		out = append(out, extprocfilter.Header{Key: h[0], Value: h[1]})
	}
	return out
}
