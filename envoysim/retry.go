package envoysim

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// retryOn is RetryPolicy.retry_on as Envoy parses it: the HTTP conditions
// (RetryStateImpl::parseRetryOn) and the gRPC ones (parseRetryGrpcOn) from
// the same comma list; a name neither knows is ignored, as Envoy ignores it.
type retryOn uint32

const (
	retry5xx retryOn = 1 << iota
	retryGatewayError
	retryConnectFailure
	retryEnvoyRateLimited
	retryRetriable4xx
	retryRefusedStream
	retryRetriableStatusCodes
	retryRetriableHeaders
	retryReset
	retryResetBeforeRequest
	retryHTTP3PostConnectFailure
	retryGrpcCancelled
	retryGrpcDeadlineExceeded
	retryGrpcResourceExhausted
	retryGrpcUnavailable
	retryGrpcInternal
)

var retryOnNames = map[string]retryOn{
	"5xx":                        retry5xx,
	"gateway-error":              retryGatewayError,
	"connect-failure":            retryConnectFailure,
	"envoy-ratelimited":          retryEnvoyRateLimited,
	"retriable-4xx":              retryRetriable4xx,
	"refused-stream":             retryRefusedStream,
	"retriable-status-codes":     retryRetriableStatusCodes,
	"retriable-headers":          retryRetriableHeaders,
	"reset":                      retryReset,
	"reset-before-request":       retryResetBeforeRequest,
	"http3-post-connect-failure": retryHTTP3PostConnectFailure,
	"cancelled":                  retryGrpcCancelled,
	"deadline-exceeded":          retryGrpcDeadlineExceeded,
	"resource-exhausted":         retryGrpcResourceExhausted,
	"unavailable":                retryGrpcUnavailable,
	"internal":                   retryGrpcInternal,
}

// retryPolicy is a route's RetryPolicy (the route's own, else its virtual
// host's, as Envoy takes the most specific one whole).
type retryPolicy struct {
	on          retryOn
	numRetries  uint32
	statusCodes []uint32
	// previousHosts is the envoy.retry_host_predicates.previous_hosts
	// predicate; hostSelections is host_selection_retry_max_attempts.
	previousHosts  bool
	hostSelections int64
	base, max      time.Duration // retry_back_off
}

const previousHostsType = "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"

// buildRetryPolicy reads a RetryPolicy.
func buildRetryPolicy(where string, rp *routev3.RetryPolicy) (*retryPolicy, error) {
	if err := checkFields(where, rp); err != nil {
		return nil, err
	}
	out := &retryPolicy{numRetries: 1, hostSelections: 1, base: 25 * time.Millisecond}
	for _, name := range strings.Split(rp.GetRetryOn(), ",") {
		name = strings.TrimSpace(name)
		if name == "reset-before-request" {
			// Needs to know whether any byte reached the upstream.
			return nil, fmt.Errorf("%s.retry_on reset-before-request is not implemented by the stand-in", where)
		}
		out.on |= retryOnNames[name]
	}
	if n := rp.GetNumRetries(); n != nil {
		out.numRetries = n.GetValue()
	}
	if n := rp.GetHostSelectionRetryMaxAttempts(); n != 0 {
		out.hostSelections = n
	}
	out.statusCodes = rp.GetRetriableStatusCodes()
	for i, p := range rp.GetRetryHostPredicate() {
		pw := fmt.Sprintf("%s.retry_host_predicate[%d] %q", where, i, p.GetName())
		if err := checkFields(pw, p); err != nil {
			return nil, err
		}
		if p.GetTypedConfig().GetTypeUrl() != previousHostsType {
			return nil, fmt.Errorf("%s: predicate %s is not implemented by the stand-in (only previous_hosts)", pw, p.GetTypedConfig().GetTypeUrl())
		}
		m := &previoushostsv3.PreviousHostsPredicate{}
		if err := p.GetTypedConfig().UnmarshalTo(m); err != nil {
			return nil, fmt.Errorf("%s: %w", pw, err)
		}
		if err := checkFields(pw, m); err != nil {
			return nil, err
		}
		out.previousHosts = true
	}
	if bo := rp.GetRetryBackOff(); bo != nil {
		if err := checkFields(where+".retry_back_off", bo); err != nil {
			return nil, err
		}
		// RetryPolicyImpl: base at least 1ms; max defaults to 10 times base
		// and may not be below it.
		out.base = max(bo.GetBaseInterval().AsDuration(), time.Millisecond)
		if bo.GetMaxInterval() != nil {
			out.max = max(bo.GetMaxInterval().AsDuration(), time.Millisecond)
			if out.max < out.base {
				return nil, fmt.Errorf("%s.retry_back_off: max_interval below base_interval (Envoy rejects it)", where)
			}
		}
	}
	if out.max == 0 {
		out.max = 10 * out.base
	}
	return out, nil
}

// backoff is Envoy's JitteredExponentialBackOffStrategy: before retry n
// (1 for the first), a random time below (2^n - 1) times the base
// interval, the multiplier no longer growing once that passes the max
// interval, and the draw capped at the max.
func (rp *retryPolicy) backoff(n int) time.Duration {
	ceiling := rp.base
	for k := 1; k <= n && k < 31; k++ {
		ceiling = (time.Duration(1)<<k - 1) * rp.base
		if ceiling > rp.max || ceiling <= 0 {
			break
		}
	}
	if ceiling <= 0 {
		return rp.max
	}
	return min(time.Duration(rand.Int64N(int64(ceiling))), rp.max) //nolint:gosec // jitter, not security
}

// retriesReset reports whether a failure before any response headers is
// retried (RetryStateImpl::wouldRetryFromReset): a connection that could
// not be made under connect-failure, any reset under reset, 5xx or
// gateway-error. refused-stream and http3-post-connect-failure need
// HTTP/2 or HTTP/3 upstreams, which the stand-in (HTTP/1.1 upstream) never
// has.
func (rp *retryPolicy) retriesReset(connectFailure bool) bool {
	if connectFailure && rp.on&retryConnectFailure != 0 {
		return true
	}
	return rp.on&(retryReset|retry5xx|retryGatewayError) != 0
}

// retriesResponse reports whether response headers are retried
// (RetryStateImpl::wouldRetryFromHeaders).
func (rp *retryPolicy) retriesResponse(h http.Header, status int) bool {
	if _, ok := h[http.CanonicalHeaderKey("x-envoy-ratelimited")]; ok {
		// From an upstream Envoy: retried only under envoy-ratelimited.
		return rp.on&retryEnvoyRateLimited != 0
	}
	switch {
	case rp.on&retry5xx != 0 && status >= 500 && status < 600:
		return true
	case rp.on&retryGatewayError != 0 && (status == 502 || status == 503 || status == 504):
		return true
	case rp.on&retryRetriable4xx != 0 && status == http.StatusConflict:
		return true
	}
	if rp.on&retryRetriableStatusCodes != 0 {
		for _, c := range rp.statusCodes {
			if int(c) == status {
				return true
			}
		}
	}
	if rp.on&(retryGrpcCancelled|retryGrpcDeadlineExceeded|retryGrpcResourceExhausted|retryGrpcUnavailable|retryGrpcInternal) != 0 {
		// Grpc::Common::getGrpcStatus: the grpc-status header, whatever
		// the content type.
		if s, err := strconv.ParseUint(h.Get("grpc-status"), 10, 32); err == nil {
			switch {
			case s == 1 && rp.on&retryGrpcCancelled != 0,
				s == 4 && rp.on&retryGrpcDeadlineExceeded != 0,
				s == 8 && rp.on&retryGrpcResourceExhausted != 0,
				s == 14 && rp.on&retryGrpcUnavailable != 0,
				s == 13 && rp.on&retryGrpcInternal != 0:
				return true
			}
		}
	}
	return false
}

// defaultBufferLimit is Listener.per_connection_buffer_limit_bytes'
// default, 1 MiB.
const defaultBufferLimit = 1 << 20

// hostPicker is one request's host choice across its attempts, with the
// state Envoy keeps in the load balancer context: override_host's list of
// hosts (taken from the request when the first host is chosen, then
// consumed one host per attempt, as OverrideHostFilterState), and the hosts
// attempted, for the previous_hosts predicate.
type hostPicker struct {
	c  *cluster
	h  extprocfilter.Headers
	md map[string]*structpb.Struct
	// criteria are the metadata match criteria (nil: none), for a subset
	// load balancer.
	criteria  map[string]*structpb.Value
	list      []string
	listed    bool
	attempted map[string]bool
	// notMembers are the override hosts passed over for not being in the
	// cluster (for the log: a picker's choice the cluster does not hold).
	notMembers []string
}

// newHostPicker chooses hosts of c for a request with headers h and
// dynamic metadata md, on a route whose metadata_match gives routeMatch.
func newHostPicker(c *cluster, h extprocfilter.Headers, md map[string]*structpb.Struct, routeMatch map[string]*structpb.Value) *hostPicker {
	return &hostPicker{c: c, h: h, md: md, criteria: matchCriteria(routeMatch, md), attempted: map[string]bool{}}
}

// matchCriteria is the router's metadataMatchCriteria: the route's
// envoy.lb criteria with the request's envoy.lb dynamic metadata merged
// over them, key by key (router.h Filter::metadataMatchCriteria,
// MetadataMatchCriteriaImpl::extractMetadataMatchCriteria).
func matchCriteria(routeMatch map[string]*structpb.Value, md map[string]*structpb.Struct) map[string]*structpb.Value {
	req := md[lbNamespace]
	if req == nil {
		return routeMatch
	}
	out := make(map[string]*structpb.Value, len(routeMatch)+len(req.GetFields()))
	for k, v := range routeMatch {
		out[k] = v
	}
	for k, v := range req.GetFields() {
		out[k] = v
	}
	return out
}

// pick chooses the host of the next attempt. For override_host: the next
// host of the list the sources name that is in the cluster, else the
// fallback policy (OverrideHostLoadBalancer::chooseHostInternal). For the
// round robin load balancers, on a retry with previous_hosts, a host
// already attempted is chosen again up to host_selection_retry_max_attempts
// times, then the last one is used (LoadBalancerBase::chooseHost).
func (hp *hostPicker) pick(rp *retryPolicy, retry bool) (string, error) {
	host, err := hp.choose(rp, retry)
	if err == nil {
		hp.attempted[host] = true
	}
	return host, err
}

func (hp *hostPicker) choose(rp *retryPolicy, retry bool) (string, error) {
	c := hp.c
	if c.originalDst != nil {
		list, err := c.targets(hp.h, hp.md)
		if err != nil {
			return "", err
		}
		return list[0], nil
	}
	if c.override != nil {
		if !hp.listed {
			hp.listed = true
			for _, src := range c.override.sources {
				hp.list = append(hp.list, parseList(src.value(hp.h, hp.md))...)
			}
		}
		for len(hp.list) > 0 {
			host := hp.list[0]
			hp.list = hp.list[1:]
			if c.anyHost || c.members[host] {
				return host, nil
			}
			hp.notMembers = append(hp.notMembers, host)
		}
	}
	next := c.roundRobin
	if c.subsets != nil {
		next = func() ([]string, error) { return c.subsets.choose(c, hp.criteria) }
	}
	tries := 1
	if retry && rp != nil && rp.previousHosts {
		tries = int(min(rp.hostSelections, 1<<20)) + 1
	}
	var host string
	for range tries {
		list, err := next()
		if err != nil {
			return "", err
		}
		host = list[0]
		if !hp.attempted[host] {
			break
		}
	}
	return host, nil
}

// replayBody keeps the request body the router has sent so that a retry
// can send it again, as Envoy's router buffers it while a retry is
// possible: up to the buffer limit, past which retries are given up
// (Router::Filter::decodeData, retry_shadow_buffer_limit_). Each attempt
// reads through its own reader: what was sent already, then the rest of
// the body as it arrives.
type replayBody struct {
	src   *extprocfilter.BodyReader
	limit int

	mu       sync.Mutex
	buf      []byte
	read     int  // bytes taken from src
	overflow bool // past the limit: buf is gone, no retry
	eof      bool
	err      error
	current  *attemptReader
	final    bool // no attempt will follow the current one
	closed   bool // the current attempt's reader was closed
}

var errAttemptAbandoned = errors.New("upstream attempt abandoned for a retry")

func newReplayBody(src *extprocfilter.BodyReader, limit int) *replayBody {
	return &replayBody{src: src, limit: limit}
}

// attempt starts a new attempt's reader; earlier ones stop reading.
func (r *replayBody) attempt() *attemptReader {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := &attemptReader{r: r}
	r.current, r.closed = a, false
	return a
}

// replayable reports whether the body can still be sent again.
func (r *replayBody) replayable() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.overflow && r.err == nil
}

// seal says no attempt will follow the current one: from now on, the
// current attempt closing its body closes the source (as the router lets
// go of a body nobody will send), and so does sealing after it did.
func (r *replayBody) seal() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.final = true
	if r.closed && r.read > 0 {
		_ = r.src.Close()
	}
}

type attemptReader struct {
	r   *replayBody
	pos int
}

func (a *attemptReader) Read(p []byte) (int, error) {
	r := a.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current != a {
		return 0, errAttemptAbandoned
	}
	if a.pos < len(r.buf) {
		n := copy(p, r.buf[a.pos:])
		a.pos += n
		return n, nil
	}
	switch {
	case a.pos < r.read:
		return 0, errors.New("request body past the retry buffer limit cannot be sent again")
	case r.eof:
		return 0, io.EOF
	case r.err != nil:
		return 0, r.err
	}
	n, err := r.src.Read(p)
	if n > 0 {
		r.read += n
		a.pos += n
		if !r.overflow && len(r.buf)+n > r.limit {
			r.overflow, r.buf = true, nil
		} else if !r.overflow {
			r.buf = append(r.buf, p[:n]...)
		}
	}
	switch {
	case errors.Is(err, io.EOF):
		r.eof = true
	case err != nil:
		r.err = err
	}
	return n, err
}

// Close is the transport letting go of the attempt's body.
func (a *attemptReader) Close() error {
	r := a.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current != a {
		return nil
	}
	r.closed = true
	if r.final && r.read > 0 {
		return r.src.Close()
	}
	return nil
}

// isGrpcRequest is Grpc::Common::isGrpcRequestHeaders: content-type
// application/grpc, alone or with a +suffix or parameters.
func isGrpcRequest(h extprocfilter.Headers) bool {
	ct := h.Get("content-type")
	return ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;")
}

// grpcTimeout is Grpc::Common::getGrpcTimeout: the grpc-timeout header,
// up to 8 digits and a unit; false when absent or malformed.
func grpcTimeout(h extprocfilter.Headers) (time.Duration, bool) {
	v := h.Get("grpc-timeout")
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseUint(v[:len(v)-1], 10, 64)
	if err != nil {
		return 0, false
	}
	d := time.Duration(n)
	switch v[len(v)-1] {
	case 'H':
		d *= time.Hour
	case 'M':
		d *= time.Minute
	case 'S':
		d *= time.Second
	case 'm':
		d *= time.Millisecond
	case 'u':
		// Envoy counts in whole milliseconds, rounding up.
		d = (d*time.Microsecond + time.Millisecond - 1).Truncate(time.Millisecond)
	case 'n':
		d = (d + time.Millisecond - 1).Truncate(time.Millisecond)
	default:
		return 0, false
	}
	return d, true
}
