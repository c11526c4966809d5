// Package epp is the "epp" profile of the InferencePool conformance suite:
// it checks that an Endpoint Picker served over Envoy ext_proc at an address
// speaks the endpoint picker protocol (gateway-api-inference-extension
// docs/proposals/004-endpoint-picker-protocol), with no Kubernetes cluster.
//
// The specs live in this non-test package so that a test (see epp_test.go)
// or a CLI can run them: fill a Config, call Register before ginkgo's
// RunSpecs, and set the Config's fields at any time before the specs run
// (for instance once the picker under test has started). Envoy is played by
// package extprocfilter with the processing mode gateways configure for
// pickers (FULL_DUPLEX_STREAMED request body, trailers SEND).
//
// Core specs assert only what the upstream protocol requires and the
// infergate README's protocol table promises. Specs labelled "extension"
// check infergate behaviour beyond the upstream protocol (a comma-string
// subset hint, a port-less IP in a hint); they are skipped unless
// Config.Extensions is set.
package epp

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive // ginkgo DSL
	. "github.com/onsi/gomega"    //nolint:revive // gomega DSL
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/inference/wire"
)

// Config is the endpoint picker under test.
type Config struct {
	// Address is the picker's ext_proc gRPC address, host:port.
	Address string
	// TLS dials with TLS without verifying the server certificate, as
	// gateways configure picker clusters.
	TLS bool
	// Endpoints are the pool endpoints ("ip:port") the picker was
	// configured with. The subset specs need at least two with distinct
	// IPs to tell a honoured hint from a default pick.
	Endpoints []string
	// HealthAddress is where grpc.health.v1 is served; "" means Address.
	HealthAddress string
	// Model is the "model" of the completion requests; "" means
	// DefaultModel. A picker that checks models must accept it.
	Model string
	// Extensions runs the specs labelled "extension" (infergate behaviour
	// beyond the upstream protocol).
	Extensions bool
	// MaxBodyBytes is the largest request body the picker takes; a larger
	// one must get 413. 0 skips that spec, which then says why.
	MaxBodyBytes int
	// Timeout bounds each exchange; 0 means 10s.
	Timeout time.Duration
}

// DefaultModel is the model requested when Config.Model is empty.
const DefaultModel = "conformance-model"

// Health service names the protocol defines: the ext_proc service (ready
// to pick), liveness (the process runs) and readiness (its endpoint set is
// loaded).
const (
	ExtProcHealthService   = wire.ExtProcHealthService
	LivenessHealthService  = "liveness"
	ReadinessHealthService = "readiness"
)

// MaxChunkBytes is the largest body chunk a picker may hand back: Envoy
// builds cap a streamed chunk at 64 KiB (the protocol recommends chunks of
// at most that; infergate's and the reference picker re-emit at most
// 62,000 bytes).
const MaxChunkBytes = 64 << 10

// Spec texts, so that callers can tell which behaviour failed.
const (
	SpecPick            = "answers a completion POST with a pool endpoint in the x-gateway-destination-endpoint header and the same value in envoy.lb dynamic metadata"
	SpecClearRouteCache = "asks the proxy to clear its route cache with the pick"
	SpecChunkedBody     = "picks for a body sent in several chunks and forwards the body unchanged"
	SpecAntiSpoof       = "overwrites a client-sent x-gateway-destination-endpoint naming an address outside the pool"
	SpecSubsetList      = "picks the one endpoint of a subset hint given as a list"
	SpecSubsetNoMatch   = "answers 503 when the subset hint matches no pool endpoint"
	SpecSubsetEmpty     = "answers 503 when the subset hint is an empty list"
	SpecSubsetComma     = "honours a subset hint given as a comma-separated string"
	SpecSubsetIPOnly    = "honours a subset hint naming an IP without a port"
	SpecHealth          = "answers grpc.health.v1 SERVING for the ext_proc service"
	SpecHealthServices  = "answers grpc.health.v1 SERVING for liveness and readiness"
	SpecBodiless        = "picks for a body-less request (the headers end the stream)"
	SpecLargeBody       = "forwards a body over 64 KiB unchanged, in chunks of at most 64 KiB"
	SpecMalformedJSON   = "answers a malformed JSON body with an immediate 400"
	SpecTooLarge        = "answers a body over its limit with an immediate 413"
)

// Addresses no pool may hold (RFC 5737 documentation ranges).
const (
	spoofEndpoint   = "203.0.113.7:8000"
	outsideEndpoint = "192.0.2.1:9"
)

// Register adds the profile's specs to the ginkgo suite; cfg is read when
// the specs run. It returns true so it can be called as `var _ = Register(cfg)`.
func Register(cfg *Config) bool {
	Describe("InferencePool conformance, profile epp: endpoint picker protocol", Label("epp"), func() {
		var ctx context.Context

		BeforeEach(func() {
			Expect(cfg.Address).NotTo(BeEmpty(), "conformance config: Address of the picker under test is empty")
			Expect(cfg.Endpoints).NotTo(BeEmpty(), "conformance config: the pool's Endpoints are not given")
			timeout := cfg.Timeout
			if timeout <= 0 {
				timeout = 10 * time.Second
			}
			c, cancel := context.WithTimeout(context.Background(), timeout)
			DeferCleanup(cancel)
			ctx = c
		})

		It(SpecPick, func() {
			res := run(ctx, cfg, nil, completion(cfg, nil))
			pick := expectPick(cfg, res, cfg.Endpoints)
			md := lbString(res, wire.DestinationEndpointKey)
			Expect(md).To(Equal(pick), "the picker must set dynamic metadata %s/%s to the same value as the %s header (got %q, header %q): proxies that route on metadata need it",
				wire.LBNamespace, wire.DestinationEndpointKey, wire.DestinationEndpointKey, md, pick)
		})

		It(SpecClearRouteCache, func() {
			res := run(ctx, cfg, nil, completion(cfg, nil))
			expectPick(cfg, res, cfg.Endpoints)
			Expect(res.ClearRouteCache).To(BeTrue(), "the picker's request-path answer must set clear_route_cache so the proxy re-routes on the pick")
		})

		It(SpecChunkedBody, func() {
			req := completion(cfg, nil)
			body := req.Body[0]
			req.Body = chunked(body, (len(body)+2)/3)
			res := run(ctx, cfg, nil, req)
			expectPick(cfg, res, cfg.Endpoints)
			Expect(string(res.Body)).To(Equal(string(body)), "a body delivered in 3 chunks (FULL_DUPLEX_STREAMED) must be forwarded unchanged by the picker")
		})

		It(SpecAntiSpoof, func() {
			Expect(cfg.Endpoints).NotTo(ContainElement(spoofEndpoint), "conformance config: the pool must not contain %s", spoofEndpoint)
			res := run(ctx, cfg, nil, completion(cfg, extprocfilter.Headers{{Key: wire.DestinationEndpointKey, Value: spoofEndpoint}}))
			Expect(res.LocalReply).To(BeNil(), "the picker must pick for a request carrying a client-sent %s header, got local reply %v", wire.DestinationEndpointKey, res.LocalReply)
			got := res.Headers.Values(wire.DestinationEndpointKey)
			Expect(got).To(HaveLen(1), "the picker must overwrite a client-sent %s header (anti-spoof), the forwarded request has %q", wire.DestinationEndpointKey, got)
			Expect(got[0]).NotTo(Equal(spoofEndpoint), "the client-sent %s: %s (outside the pool) survived: the picker must overwrite it", wire.DestinationEndpointKey, spoofEndpoint)
			expectPick(cfg, res, cfg.Endpoints)
		})

		Context("subset hint "+wire.SubsetHintNamespace+" / "+wire.SubsetKey, func() {
			It(SpecSubsetList, func() {
				target := cfg.Endpoints[len(cfg.Endpoints)-1]
				res := run(ctx, cfg, extprocfilter.SubsetHintMetadata(target), completion(cfg, nil))
				expectPick(cfg, res, []string{target})
			})

			It(SpecSubsetNoMatch, func() {
				Expect(cfg.Endpoints).NotTo(ContainElement(outsideEndpoint), "conformance config: the pool must not contain %s", outsideEndpoint)
				res := run(ctx, cfg, extprocfilter.SubsetHintMetadata(outsideEndpoint), completion(cfg, nil))
				expectImmediate(res, fmt.Sprintf("a subset hint [%s] matching no pool endpoint", outsideEndpoint), 503)
			})

			It(SpecSubsetEmpty, func() {
				res := run(ctx, cfg, extprocfilter.SubsetHintMetadata(), completion(cfg, nil))
				expectImmediate(res, "an empty subset hint list", 503)
			})

			It(SpecSubsetComma, Label("extension"), func() {
				if !cfg.Extensions {
					Skip("infergate extension (not in the upstream protocol); set Config.Extensions to run it")
				}
				target := cfg.Endpoints[len(cfg.Endpoints)-1]
				hint := outsideEndpoint + "," + target
				md := hintMetadata(structpb.NewStringValue(hint))
				res := run(ctx, cfg, md, completion(cfg, nil))
				expectPick(cfg, res, []string{target})
			})

			It(SpecSubsetIPOnly, Label("extension"), func() {
				if !cfg.Extensions {
					Skip("infergate extension (not in the upstream protocol); set Config.Extensions to run it")
				}
				target := cfg.Endpoints[len(cfg.Endpoints)-1]
				ip, _, err := net.SplitHostPort(target)
				Expect(err).NotTo(HaveOccurred(), "conformance config: endpoint %q is not ip:port", target)
				var eligible []string
				for _, e := range cfg.Endpoints {
					if h, _, err := net.SplitHostPort(e); err == nil && h == ip {
						eligible = append(eligible, e)
					}
				}
				res := run(ctx, cfg, extprocfilter.SubsetHintMetadata(ip), completion(cfg, nil))
				expectPick(cfg, res, eligible)
			})
		})

		It(SpecBodiless, func() {
			req := completion(cfg, nil)
			req.Method, req.Body = "GET", nil
			res := run(ctx, cfg, nil, req)
			expectPick(cfg, res, cfg.Endpoints)
		})

		It(SpecLargeBody, func() {
			req := completion(cfg, nil)
			body := largeBody(cfg, 200<<10)
			req.Body = chunked(body, 50<<10)
			res := run(ctx, cfg, nil, req)
			expectPick(cfg, res, cfg.Endpoints)
			Expect(string(res.Body)).To(Equal(string(body)), "a %d-byte body must be forwarded unchanged (%d bytes came out)", len(body), len(res.Body))
			for _, n := range res.BodyChunkSizes {
				Expect(n).To(BeNumerically("<=", MaxChunkBytes), "the picker handed back a %d-byte body chunk (chunks %v): Envoy builds cap a streamed chunk at %d",
					n, res.BodyChunkSizes, MaxChunkBytes)
			}
		})

		It(SpecMalformedJSON, func() {
			req := completion(cfg, nil)
			req.Body = [][]byte{[]byte(fmt.Sprintf(`{"model":%q,"prompt":"unterminated`, cfg.model()))}
			res := run(ctx, cfg, nil, req)
			expectImmediate(res, "a malformed JSON body", 400)
		})

		It(SpecTooLarge, func() {
			if cfg.MaxBodyBytes <= 0 {
				Skip("conformance config: MaxBodyBytes (the picker's body limit) not given")
			}
			req := completion(cfg, nil)
			req.Body = chunked(largeBody(cfg, cfg.MaxBodyBytes+1), 60<<10)
			res := run(ctx, cfg, nil, req)
			expectImmediate(res, fmt.Sprintf("a body of %d bytes (the limit is %d)", cfg.MaxBodyBytes+1, cfg.MaxBodyBytes), 413)
		})

		It(SpecHealth, func() {
			expectServing(ctx, cfg, ExtProcHealthService)
		})

		It(SpecHealthServices, func() {
			expectServing(ctx, cfg, LivenessHealthService)
			expectServing(ctx, cfg, ReadinessHealthService)
		})
	})
	return true
}

// model is the model the requests ask for.
func (c *Config) model() string {
	if c.Model == "" {
		return DefaultModel
	}
	return c.Model
}

// chunked cuts body into chunks of n bytes, the last one shorter.
func chunked(body []byte, n int) [][]byte {
	var out [][]byte
	for len(body) > 0 {
		k := min(n, len(body))
		out, body = append(out, body[:k]), body[k:]
	}
	return out
}

// completion is a JSON completion POST with the body in one chunk.
func completion(cfg *Config, extra extprocfilter.Headers) extprocfilter.Request {
	body := fmt.Sprintf(`{"model":%q,"prompt":"Conformance check: say hello to the endpoint picker protocol.","max_tokens":8}`, cfg.model())
	h := extprocfilter.Headers{{Key: "content-type", Value: "application/json"}}
	h = append(h, extra...)
	return extprocfilter.Request{Method: "POST", Path: "/v1/completions", Headers: h, Body: [][]byte{[]byte(body)}}
}

// run plays Envoy for one request path against the picker under test.
func run(ctx context.Context, cfg *Config, md map[string]*structpb.Struct, req extprocfilter.Request) *extprocfilter.Result {
	GinkgoHelper()
	client, err := extprocfilter.NewClient(extprocfilter.FilterConfig{Name: "epp-conformance", Target: cfg.Address, TLS: cfg.TLS, ForwardMetadata: md})
	Expect(err).NotTo(HaveOccurred(), "configuring the ext_proc client for %s", cfg.Address)
	defer client.Close()
	res, err := client.Run(ctx, req)
	Expect(err).NotTo(HaveOccurred(), "the ext_proc exchange with %s did not complete", cfg.Address)
	if lr := res.LocalReply; lr != nil && lr.Err != nil {
		Fail(fmt.Sprintf("the ext_proc stream with %s failed (the proxy would answer %d): %v", cfg.Address, lr.Status, lr.Err))
	}
	return res
}

// expectPick checks that the request was let through with exactly one
// x-gateway-destination-endpoint header whose endpoints (a comma list, best
// first) all lie in allowed; it returns the header value.
func expectPick(cfg *Config, res *extprocfilter.Result, allowed []string) string {
	GinkgoHelper()
	if lr := res.LocalReply; lr != nil {
		Fail(fmt.Sprintf("the picker must pick an endpoint but answered with an immediate response %d (%s) %q", lr.Status, lr.Details, lr.Body))
	}
	vals := res.Headers.Values(wire.DestinationEndpointKey)
	Expect(vals).To(HaveLen(1), "the picker must set exactly one %s header on the forwarded request, got %q", wire.DestinationEndpointKey, vals)
	for _, e := range strings.Split(vals[0], ",") {
		e = strings.TrimSpace(e)
		Expect(allowed).To(ContainElement(e), "the picker chose %q (header %s: %q), which is not among the eligible endpoints %q of the pool %q",
			e, wire.DestinationEndpointKey, vals[0], allowed, cfg.Endpoints)
	}
	return vals[0]
}

func expectImmediate(res *extprocfilter.Result, what string, status int) {
	GinkgoHelper()
	lr := res.LocalReply
	if lr == nil {
		Fail(fmt.Sprintf("for %s the picker must answer an ImmediateResponse %d, but it let the request through with %s: %q",
			what, status, wire.DestinationEndpointKey, res.Headers.Values(wire.DestinationEndpointKey)))
	}
	Expect(lr.Status).To(Equal(status), "for %s the picker must answer an ImmediateResponse with status %d, got %d (%s)", what, status, lr.Status, lr.Details)
}

// expectServing checks grpc.health.v1 SERVING for service at the health
// address.
func expectServing(ctx context.Context, cfg *Config, service string) {
	GinkgoHelper()
	addr := cfg.HealthAddress
	if addr == "" {
		addr = cfg.Address
	}
	conn, err := extprocfilter.Dial(addr, cfg.TLS, nil)
	Expect(err).NotTo(HaveOccurred(), "dialing the health address %s", addr)
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	Expect(err).NotTo(HaveOccurred(), "the picker must serve grpc.health.v1 Check for service %q at %s", service, addr)
	Expect(resp.GetStatus()).To(Equal(healthpb.HealthCheckResponse_SERVING), "grpc.health.v1 %q at %s must be SERVING once the pool is loaded", service, addr)
}

// largeBody is a completion body of exactly n bytes (n of at least 200).
func largeBody(cfg *Config, n int) []byte {
	head := fmt.Sprintf(`{"model":%q,"max_tokens":8,"prompt":"`, cfg.model())
	tail := `"}`
	pad := n - len(head) - len(tail)
	return []byte(head + strings.Repeat("a", max(pad, 0)) + tail)
}

func lbString(res *extprocfilter.Result, key string) string {
	return res.DynamicMetadata[wire.LBNamespace].GetFields()[key].GetStringValue()
}

func hintMetadata(v *structpb.Value) map[string]*structpb.Struct {
	return map[string]*structpb.Struct{wire.SubsetHintNamespace: {Fields: map[string]*structpb.Value{wire.SubsetKey: v}}}
}
