// Package payload is the "payload" profile of the InferencePool conformance
// suite: it checks that a payload processor served over Envoy ext_proc at
// an address (an ext_proc server that reads the request body and sets the
// model headers routes match on, ahead of route selection and the picker;
// README "The payload processor") does what gateways rely on, with no
// Kubernetes cluster.
//
// The specs live in this non-test package so that a test (see
// payload_test.go) or a CLI can run them: fill a Config, call Register
// before ginkgo's RunSpecs, and set the Config's fields at any time before
// the specs run (for instance once the processor under test has started).
// Envoy is played by package extprocfilter with the processing mode the
// README asks for (headers SEND, FULL_DUPLEX_STREAMED bodies, trailers
// SEND); only the request path is exercised. A processor that is not an
// ext_proc server (the Wasm plugin in its proxy-wasm host: WasmPlugin) is
// driven through Config.Processor instead.
package payload

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive // ginkgo DSL
	. "github.com/onsi/gomega"    //nolint:revive // gomega DSL
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/inference/wire"
)

// Config is the payload processor under test.
type Config struct {
	// Address is the processor's ext_proc gRPC address, host:port. Its
	// grpc.health.v1 service is checked there too.
	Address string
	// Processor, when set, stands for Address: it passes each request
	// through a processor that is not an ext_proc server, as its proxy
	// does. The health spec, which asks an ext_proc server's grpc.health.v1
	// service, is then skipped and says why.
	Processor Processor
	// TLS dials with TLS without verifying the server certificate, as
	// gateways configure processor clusters.
	TLS bool
	// Model is a model the processor serves (lets through).
	Model string
	// BaseModel is the base the processor maps Model to; equal to Model
	// when Model is a base.
	BaseModel string
	// DeniedPrompt is a prompt the processor's guardrails refuse; the
	// refusal spec is skipped when it is empty.
	DeniedPrompt string
	// Timeout bounds each exchange; 0 means 10s.
	Timeout time.Duration
}

// ExtProcHealthService is the grpc.health.v1 service name of the ext_proc
// service.
const ExtProcHealthService = wire.ExtProcHealthService

// Header names the processor sets or must drop.
const (
	ModelHeader     = wire.ModelNameHeader
	BaseModelHeader = wire.BaseModelNameHeader
)

// Spec texts, so that callers can tell which behaviour failed.
const (
	SpecChatCompletion     = "sets the model and base-model headers and clear_route_cache for a chat completion and forwards its body unchanged"
	SpecCompletion         = "sets the model and base-model headers and clear_route_cache for a completion (prompt) and forwards its body unchanged"
	SpecChunkedBody        = "sets the model headers for a body sent in several chunks and forwards the body unchanged"
	SpecClientModelHeaders = "replaces client-sent x-gateway-model-name and x-gateway-base-model-name headers"
	SpecClientDestination  = "removes a client-sent x-gateway-destination-endpoint header"
	SpecMalformedJSON      = "answers malformed JSON with an immediate 400"
	SpecMissingModel       = "answers a body without a model with an immediate 400"
	SpecDenied             = "refuses a request its guardrails deny with an immediate 4xx and a JSON error body"
	SpecHealth             = "answers grpc.health.v1 SERVING for the ext_proc service"
)

// Values a client sends to spoof headers only the processor and the
// picker may set (the endpoint lies in an RFC 5737 documentation range).
const (
	spoofModel     = "conformance-client-spoofed-model"
	spoofBaseModel = "conformance-client-spoofed-base"
	spoofEndpoint  = "203.0.113.7:8000"
)

// Register adds the profile's specs to the ginkgo suite; cfg is read when
// the specs run. It returns true so it can be called as `var _ = Register(cfg)`.
func Register(cfg *Config) bool {
	Describe("InferencePool conformance, profile payload: payload processor", Label("payload"), func() {
		var ctx context.Context

		BeforeEach(func() {
			if cfg.Processor == nil {
				Expect(cfg.Address).NotTo(BeEmpty(), "conformance config: Address of the payload processor under test is empty")
			}
			Expect(cfg.Model).NotTo(BeEmpty(), "conformance config: Model (a model the processor serves) is empty")
			Expect(cfg.BaseModel).NotTo(BeEmpty(), "conformance config: BaseModel (Model's base, or Model itself) is empty")
			timeout := cfg.Timeout
			if timeout <= 0 {
				timeout = 10 * time.Second
			}
			c, cancel := context.WithTimeout(context.Background(), timeout)
			DeferCleanup(cancel)
			ctx = c
		})

		It(SpecChatCompletion, func() {
			req := chat(chatBody(cfg.Model, "Conformance check: say hello to the payload processor."), nil)
			res := run(ctx, cfg, req)
			expectModelHeaders(cfg, res, "a chat completion")
			Expect(res.RouteCacheCleared).To(BeTrue(), "the processor must clear the route cache with the model headers so the proxy re-selects the route on them")
			Expect(string(res.Body)).To(Equal(string(req.Body[0])), "a chat completion no guardrail applies to must be forwarded unchanged")
		})

		It(SpecCompletion, func() {
			body := fmt.Sprintf(`{"model":%q,"prompt":"Conformance check: say hello to the payload processor.","max_tokens":8}`, cfg.Model)
			req := request("/v1/completions", body, nil)
			res := run(ctx, cfg, req)
			expectModelHeaders(cfg, res, "a completion (prompt)")
			Expect(res.RouteCacheCleared).To(BeTrue(), "the processor must clear the route cache with the model headers so the proxy re-selects the route on them")
			Expect(string(res.Body)).To(Equal(body), "a completion no guardrail applies to must be forwarded unchanged")
		})

		It(SpecChunkedBody, func() {
			body := chatBody(cfg.Model, "Conformance check: this body arrives in three chunks; say hello.")
			third := len(body) / 3
			req := chat(body, nil)
			req.Body = [][]byte{[]byte(body[:third]), []byte(body[third : 2*third]), []byte(body[2*third:])}
			res := run(ctx, cfg, req)
			expectModelHeaders(cfg, res, "a chat completion sent in 3 chunks")
			Expect(res.RouteCacheCleared).To(BeTrue(), "the processor must clear the route cache with the model headers")
			Expect(string(res.Body)).To(Equal(body), "a body delivered in 3 chunks (FULL_DUPLEX_STREAMED) must be forwarded whole and unchanged")
		})

		It(SpecClientModelHeaders, func() {
			spoof := extprocfilter.Headers{{Key: ModelHeader, Value: spoofModel}, {Key: BaseModelHeader, Value: spoofBaseModel}}
			res := run(ctx, cfg, chat(chatBody(cfg.Model, "Conformance check: say hello."), spoof))
			expectModelHeaders(cfg, res, "a chat completion carrying client-sent model headers")
		})

		It(SpecClientDestination, func() {
			spoof := extprocfilter.Headers{{Key: wire.DestinationEndpointKey, Value: spoofEndpoint}}
			res := run(ctx, cfg, chat(chatBody(cfg.Model, "Conformance check: say hello."), spoof))
			expectForwarded(res, "a chat completion carrying a client-sent "+wire.DestinationEndpointKey)
			got := res.Headers.Values(wire.DestinationEndpointKey)
			Expect(got).To(BeEmpty(), "the processor must remove a client-sent %s (the picker after it would obey the client), the forwarded request has %q",
				wire.DestinationEndpointKey, got)
		})

		It(SpecMalformedJSON, func() {
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"unterminated`, cfg.Model)
			res := run(ctx, cfg, request("/v1/chat/completions", body, nil))
			expectImmediate(res, "a malformed JSON body", 400, 400)
		})

		It(SpecMissingModel, func() {
			res := run(ctx, cfg, request("/v1/chat/completions", `{"messages":[{"role":"user","content":"Conformance check: no model here."}]}`, nil))
			expectImmediate(res, `a body without "model"`, 400, 400)
		})

		It(SpecDenied, func() {
			if cfg.DeniedPrompt == "" {
				Skip("conformance config: no DeniedPrompt given")
			}
			res := run(ctx, cfg, chat(chatBody(cfg.Model, cfg.DeniedPrompt), nil))
			lr := expectImmediate(res, "a prompt the guardrails deny", 400, 499)
			Expect(lr.Headers.Get("content-type")).To(HavePrefix("application/json"), "a refusal must carry content-type: application/json, got %q", lr.Headers.Get("content-type"))
			var answer struct {
				Error map[string]any `json:"error"`
			}
			Expect(json.Unmarshal(lr.Body, &answer)).To(Succeed(), "a refusal's body must be JSON {\"error\":{...}}, got %q", lr.Body)
			Expect(answer.Error).NotTo(BeNil(), "a refusal's body must be {\"error\":{...}} with an object, got %q", lr.Body)
			Expect(answer.Error["message"]).To(And(BeAssignableToTypeOf(""), Not(BeEmpty())), "a refusal's error must carry a message, got %q", lr.Body)
		})

		It(SpecHealth, func() {
			if cfg.Processor != nil {
				Skip("the processor under test is not an ext_proc server: no grpc.health.v1 service to ask")
			}
			conn, err := extprocfilter.Dial(cfg.Address, cfg.TLS, nil)
			Expect(err).NotTo(HaveOccurred(), "dialing %s", cfg.Address)
			defer conn.Close()
			resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: ExtProcHealthService})
			Expect(err).NotTo(HaveOccurred(), "the processor must serve grpc.health.v1 Check for service %q at %s", ExtProcHealthService, cfg.Address)
			Expect(resp.GetStatus()).To(Equal(healthpb.HealthCheckResponse_SERVING), "grpc.health.v1 %q at %s must be SERVING once the processor is ready", ExtProcHealthService, cfg.Address)
		})
	})
	return true
}

func chatBody(model, prompt string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":8}`, model, prompt)
}

func chat(body string, extra extprocfilter.Headers) extprocfilter.Request {
	return request("/v1/chat/completions", body, extra)
}

// request is a JSON POST with the body in one chunk.
func request(path, body string, extra extprocfilter.Headers) extprocfilter.Request {
	h := extprocfilter.Headers{{Key: "content-type", Value: "application/json"}}
	h = append(h, extra...)
	return extprocfilter.Request{Method: "POST", Path: path, Headers: h, Body: [][]byte{[]byte(body)}}
}

// run passes one request through the processor under test.
func run(ctx context.Context, cfg *Config, req extprocfilter.Request) *Outcome {
	GinkgoHelper()
	p := cfg.Processor
	if p == nil {
		p = ExtProc(cfg.Address, cfg.TLS)
	}
	res, err := p(ctx, req)
	Expect(err).NotTo(HaveOccurred())
	return res
}

func expectForwarded(res *Outcome, what string) {
	GinkgoHelper()
	if lr := res.Reply; lr != nil {
		Fail(fmt.Sprintf("the processor must let %s through but answered with an immediate response %d (%s) %q", what, lr.Status, lr.Details, lr.Body))
	}
}

// expectModelHeaders checks that the request went on with exactly one
// model header naming Model and one base-model header naming BaseModel.
func expectModelHeaders(cfg *Config, res *Outcome, what string) {
	GinkgoHelper()
	expectForwarded(res, what)
	for _, h := range []struct{ name, want string }{{ModelHeader, cfg.Model}, {BaseModelHeader, cfg.BaseModel}} {
		got := res.Headers.Values(h.name)
		Expect(got).To(Equal([]string{h.want}), "for %s the forwarded request must carry exactly one %s: %s (any client-sent copy replaced), it has %q",
			what, h.name, h.want, got)
	}
}

// expectImmediate checks that the request was answered at once with a
// status in [lo, hi] and never went on: no headers response let the
// headers through and no body byte was forwarded.
func expectImmediate(res *Outcome, what string, lo, hi int) *extprocfilter.LocalReply {
	GinkgoHelper()
	lr := res.Reply
	if lr == nil {
		Fail(fmt.Sprintf("for %s the processor must answer an immediate response (status %d..%d), but it let the request through with %s %q",
			what, lo, hi, ModelHeader, res.Headers.Values(ModelHeader)))
	}
	Expect(lr.Status).To(And(BeNumerically(">=", lo), BeNumerically("<=", hi)), "for %s the processor must answer an immediate response with status %d..%d, got %d (%s) %q",
		what, lo, hi, lr.Status, lr.Details, lr.Body)
	Expect(res.Body).To(BeEmpty(), "for %s the processor must not forward the body before refusing it, %d bytes went on", what, len(res.Body))
	Expect(res.HeadersWentOn).To(BeFalse(), "for %s the processor let the request headers go on to the upstream before refusing it", what)
	return lr
}
