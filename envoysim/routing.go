package envoysim

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// RoutingMode is how Proxy turns the endpoint picker's answer into an upstream.
type RoutingMode string

const (
	// RoutingOverrideHost behaves like envoy.load_balancing_policies.override_host
	// as Istio configures it: the envoy.lb metadata wins over the header, the
	// value may be a comma list walked in order on connection failure, and
	// without a usable value the cluster's own round robin picks.
	RoutingOverrideHost RoutingMode = "override-host"
	// RoutingOriginalDstHeader behaves like an ORIGINAL_DST cluster with
	// use_http_header and http_header_name x-gateway-destination-endpoint (the
	// standalone Envoy recipe): only the first instance of the header counts,
	// metadata is ignored, and a value that is not one ip:port gives 503.
	RoutingOriginalDstHeader RoutingMode = "original-dst-header"
)

// ParseEndpoint checks that s is one numeric ip:port and returns it normalised.
func ParseEndpoint(s string) (string, error) {
	host, port, err := net.SplitHostPort(strings.TrimSpace(s))
	if err != nil {
		return "", fmt.Errorf("endpoint %q: %w", s, err)
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return "", fmt.Errorf("endpoint %q: host is not an IP address", s)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("endpoint %q: invalid port", s)
	}
	return net.JoinHostPort(ip.String(), port), nil
}

// parseList keeps the valid entries of a comma list in order; override_host
// skips entries it cannot use.
func parseList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if ep, err := ParseEndpoint(part); err == nil {
			out = append(out, ep)
		}
	}
	return out
}

var errNoHealthyUpstream = errors.New("no healthy upstream")

// routerReply builds the response of a local reply of the router itself.
func routerReply(status int, body string) (extprocfilter.Headers, extprocfilter.Body) {
	h := extprocfilter.Headers{
		{Key: ":status", Value: strconv.Itoa(status)},
		{Key: "content-type", Value: "text/plain"},
		{Key: "content-length", Value: strconv.Itoa(len(body))},
	}
	return h, extprocfilter.BodyFromChunks([]byte(body))
}

func isConnectFailure(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// upstreamError maps a routing or upstream failure to Envoy's local reply;
// retried is whether the request was retried (the router then says the
// reason is the latest of several).
func upstreamError(err error, retried bool) (int, string) {
	const prefix = "upstream connect error or disconnect/reset before headers. "
	reason := "reset reason: "
	if retried {
		reason = "retried and the latest reset reason: "
	}
	switch {
	case errors.Is(err, errNoHealthyUpstream):
		return http.StatusServiceUnavailable, "no healthy upstream"
	case errors.Is(err, errSecretNotSupplied):
		return http.StatusServiceUnavailable, prefix + reason + "connection failure, transport failure reason: " + errSecretNotSupplied.Error()
	case isConnectFailure(err):
		return http.StatusServiceUnavailable, prefix + reason + "connection failure"
	case errors.Is(err, errTimeout):
		return http.StatusGatewayTimeout, "upstream request timeout"
	}
	return http.StatusServiceUnavailable, prefix + reason + "connection termination"
}

// hopByHop reports the connection-scoped headers a proxy never forwards.
func hopByHop(key string) bool {
	switch key {
	case "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade":
		return true
	}
	return false
}
