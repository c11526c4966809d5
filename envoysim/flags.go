package envoysim

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// ParseFilterFlag parses "name=host:port[+host:port...][,failure-mode=FailOpen|FailClose][,tls=true|false]",
// the syntax of envoysim's --ext-proc flag. Failure mode defaults to FailClose
// (Envoy's failure_mode_allow false), TLS to false. Several hosts make the
// processor's cluster (several picker replicas): each stream goes to the
// next healthy one in turn; the config's Target is the first.
func ParseFilterFlag(s string) (extprocfilter.FilterConfig, []string, error) {
	parts := strings.Split(s, ",")
	name, addrs, ok := strings.Cut(parts[0], "=")
	if !ok || name == "" || addrs == "" {
		return extprocfilter.FilterConfig{}, nil, fmt.Errorf("%q: want name=host:port first", parts[0])
	}
	hosts := strings.Split(addrs, "+")
	for _, addr := range hosts {
		if _, port, err := net.SplitHostPort(addr); err != nil {
			return extprocfilter.FilterConfig{}, nil, fmt.Errorf("address %q: %w", addr, err)
		} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return extprocfilter.FilterConfig{}, nil, fmt.Errorf("address %q: invalid port", addr)
		}
	}
	fc, err := filterOptions(extprocfilter.FilterConfig{Name: name, Target: hosts[0]}, parts[1:])
	if err != nil {
		return extprocfilter.FilterConfig{}, nil, err
	}
	return fc, hosts, nil
}

// filterOptions applies the options that follow the address.
func filterOptions(fc extprocfilter.FilterConfig, opts []string) (extprocfilter.FilterConfig, error) {
	for _, opt := range opts {
		k, v, _ := strings.Cut(opt, "=")
		switch k {
		case "failure-mode":
			switch v {
			case "FailOpen":
				fc.FailureModeAllow = true
			case "FailClose":
				fc.FailureModeAllow = false
			default:
				return extprocfilter.FilterConfig{}, fmt.Errorf("failure-mode %q: want FailOpen or FailClose", v)
			}
		case "tls":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return extprocfilter.FilterConfig{}, fmt.Errorf("tls %q: want true or false", v)
			}
			fc.TLS = b
		case "response-body":
			// An endpoint picker needs only the response headers (the
			// served endpoint comes with them); sparing it the body saves
			// a round trip per streamed chunk.
			mode := extprocfilter.DefaultProcessingMode()
			switch v {
			case "streamed":
			case "none":
				mode.ResponseBodyMode = filterv3.ProcessingMode_NONE
				mode.ResponseTrailerMode = filterv3.ProcessingMode_SKIP
			default:
				return extprocfilter.FilterConfig{}, fmt.Errorf("response-body %q: want streamed or none", v)
			}
			fc.ProcessingMode = mode
		default:
			return extprocfilter.FilterConfig{}, fmt.Errorf("unknown option %q (want failure-mode, tls or response-body)", k)
		}
	}
	return fc, nil
}
