// Package payload is the payload processor: an ext_proc server that reads
// inference request bodies, sets the model headers routing matches on,
// applies the guardrails of inference/policy, and reports token usage
// from responses as dynamic metadata. The decision itself is the shared
// core; this package is the ext_proc delivery of it.
package payload

import (
	"context"
	"math"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference"
	"github.com/infergate/infergate/inference/policy"
	"github.com/infergate/infergate/inference/wire"
)

// MetadataNamespace holds what the processor reports for a request:
// model, base_model, and from the response llm_input_token,
// llm_output_token and llm_total_token (the key names token-based rate
// limits already use). The gateway must list it among the ext_proc
// filter's receiving namespaces or Envoy drops it.
const MetadataNamespace = "io.infergate.payload"

// Processor is the server.Handler of the payload processor.
type Processor struct {
	policy  atomic.Pointer[policy.Policy]
	labels  atomic.Pointer[modelLabels]
	metrics *metrics
	log     logr.Logger
	// streamUsage asks for the usage of streamed requests (Config.KeepStreamOptions).
	streamUsage bool
}

// NewProcessor serves with p until SetPolicy swaps it. Until
// SetModelLabels is called every model is counted as "other" in the
// metrics.
func NewProcessor(p *policy.Policy, m *metrics, log logr.Logger) *Processor {
	pr := &Processor{metrics: m, log: log}
	pr.policy.Store(p)
	pr.SetModelLabels(nil)
	return pr
}

// SetModelLabels takes the model names the metrics may carry from c, the
// configuration the policy was compiled from (see modelLabels); streams
// that start from now on use them. Call it with SetPolicy.
func (pr *Processor) SetModelLabels(c *policy.Config) {
	l := newModelLabels(c)
	pr.labels.Store(&l)
}

// SetPolicy replaces the policy for streams that start from now on; open
// streams finish under the one they started with.
func (pr *Processor) SetPolicy(p *policy.Policy) { pr.policy.Store(p) }

// NewExchange implements server.Handler.
func (pr *Processor) NewExchange(context.Context) server.Exchange {
	return &exchange{pr: pr, policy: pr.policy.Load(), labels: *pr.labels.Load()}
}

type exchange struct {
	pr     *Processor
	policy *policy.Policy
	labels modelLabels
	model  string
	usage  *inference.UsageReader
	// addedUsage: the processor asked for the stream's usage, so the
	// usage-only chunk is not the client's and filter removes it.
	addedUsage bool
	filter     *inference.UsageChunkFilter
}

func (x *exchange) HandleRequest(_ context.Context, req *server.Request) *server.Decision {
	if len(req.Body) == 0 {
		// GET /v1/models and the like, or a body that turned out empty
		// (chunked 0\r\n\r\n): nothing to read, nothing to route on, and
		// no client copy of the model headers may stand in. The Wasm
		// plugin answers both the same way.
		x.pr.metrics.requests.WithLabelValues("passed", "no-body").Inc()
		return &server.Decision{RemoveHeaders: clientHeadersToRemove(req.Headers, nil)}
	}
	start := time.Now()
	res := x.policy.Apply(req.Body)
	x.pr.metrics.decision.Observe(time.Since(start).Seconds())
	if r := res.Reject; r != nil {
		return &server.Decision{Reject: x.rejected(r)}
	}
	x.model = res.Model
	d := &server.Decision{Body: res.Body, ClearRouteCache: true}
	for _, h := range res.Headers() {
		d.SetHeaders = append(d.SetHeaders, server.Header{Name: h[0], Value: h[1]})
	}
	// A client must not claim its prompt was masked, name its model
	// headers, or pick its endpoint.
	d.RemoveHeaders = clientHeadersToRemove(req.Headers, d.SetHeaders)
	for _, rule := range res.Masked {
		x.pr.metrics.masked.WithLabelValues(ruleLabel(rule)).Inc()
	}
	outcome := "forwarded"
	if res.Body != nil {
		outcome = "rewritten"
	}
	x.pr.metrics.requests.WithLabelValues(outcome, "").Inc()
	if x.pr.streamUsage && res.Stream {
		x.askStreamUsage(req, d)
	}
	d.DynamicMetadata = namespaced(map[string]*structpb.Value{
		"model":      structpb.NewStringValue(res.Model),
		"base_model": structpb.NewStringValue(res.BaseModel),
	})
	return d
}

// askStreamUsage makes a streamed OpenAI chat or completions request ask
// for its usage (it parses the forwarded body again, so it is called for
// streamed requests only): without stream_options.include_usage the server reports
// none, and a token-based limit would charge the request nothing.
func (x *exchange) askStreamUsage(req *server.Request, d *server.Decision) {
	if !openAITextAPI(req.Headers.Get(":path")) {
		return // Anthropic and the responses API report usage on their own
	}
	body := req.Body
	if d.Body != nil {
		body = d.Body
	}
	b, err := inference.Parse(body)
	if err != nil {
		return
	}
	if e, ok := b.StreamUsageEdit(); ok {
		d.Body, x.addedUsage = b.Rewrite([]inference.Edit{e}), true
	}
}

// openAITextAPI says whether a request path is OpenAI's chat or
// completions API as the model server routes it: the servers (uvicorn,
// under vLLM and SGLang) percent-decode the path first, so
// "/v1/chat/completion%73" is the chat API too. A path that does not
// decode is left as sent.
func openAITextAPI(target string) bool {
	path, _, _ := strings.Cut(target, "?")
	if decoded, err := url.PathUnescape(path); err == nil {
		path = decoded
	}
	return strings.HasSuffix(path, "/chat/completions") || strings.HasSuffix(path, "/completions")
}

func (x *exchange) HandleResponseHeaders(_ context.Context, resp *server.Response) *server.Decision {
	if x.model != "" && !resp.EndOfStream && strings.HasPrefix(resp.Headers.Get(":status"), "2") {
		ct := resp.Headers.Get("content-type")
		x.usage = inference.NewUsageReader(ct)
		if x.addedUsage && strings.HasPrefix(strings.TrimSpace(ct), "text/event-stream") {
			x.filter = &inference.UsageChunkFilter{}
		}
	}
	return nil
}

// HandleResponseBody passes every chunk on as it comes (an SSE stream is
// never held back) and, at the end, reports the usage the server sent.
func (x *exchange) HandleResponseBody(_ context.Context, chunk []byte, endOfStream bool) ([]byte, *structpb.Struct) {
	if x.usage == nil {
		return chunk, nil
	}
	x.usage.Write(chunk)
	if x.filter != nil {
		chunk = x.filter.Write(chunk, endOfStream)
	}
	if !endOfStream {
		return chunk, nil
	}
	u, ok := x.usage.Usage()
	x.usage = nil
	if !ok {
		return chunk, nil
	}
	// The label is the configured name or "other", never the client's
	// string: see modelLabels.
	model := x.labels.of(x.model)
	x.pr.metrics.tokens.WithLabelValues(model, "prompt").Add(float64(u.PromptTokens))
	x.pr.metrics.tokens.WithLabelValues(model, "completion").Add(float64(u.CompletionTokens))
	return chunk, namespaced(map[string]*structpb.Value{
		"model":            structpb.NewStringValue(x.model),
		"llm_input_token":  structpb.NewNumberValue(float64(u.PromptTokens)),
		"llm_output_token": structpb.NewNumberValue(float64(u.CompletionTokens)),
		"llm_total_token":  structpb.NewNumberValue(float64(u.TotalTokens)),
	})
}

// DecisionCost is what deciding req holds beyond its body under the
// exchange's policy (server.DecisionCoster): the policy's own bound of what
// Apply allocates, which the server charges to its buffer budget while
// HandleRequest runs. (A streamed request's usage edit, askStreamUsage,
// parses the forwarded body again once Apply is done and copies it once:
// not in the bound, and a body's size or two at most.)
func (x *exchange) DecisionCost(req *server.Request) int64 {
	if len(req.Body) == 0 {
		return 0
	}
	return x.policy.WorkBytes(len(req.Body))
}

// CheckBodySize holds the body to the policy's limits.maxBodyBytes as it
// arrives (server.BodyLimiter): a stalled or huge upload is refused at the
// chunk that passes the limit, not buffered whole first.
func (x *exchange) CheckBodySize(n int64) *server.Rejection {
	if r := x.policy.CheckSize(int(min(n, math.MaxInt))); r != nil {
		return x.rejected(r)
	}
	return nil
}

// rejected counts and logs a policy rejection and turns it into the
// answer, naming the guardrail that refused.
func (x *exchange) rejected(r *policy.Rejection) *server.Rejection {
	x.pr.metrics.requests.WithLabelValues("rejected", r.Reason).Inc()
	rej := &server.Rejection{Status: r.Status, Reason: r.Reason, Message: r.Message}
	if r.Rule != "" {
		rej.Headers = []server.Header{{Name: wire.GuardrailHeader, Value: r.Rule}}
	}
	x.pr.log.V(1).Info("request rejected", "status", r.Status, "reason", r.Reason, "rule", r.Rule)
	return rej
}

func (x *exchange) Close(context.Context, server.Summary) {}

func namespaced(fields map[string]*structpb.Value) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: fields}),
	}}
}
