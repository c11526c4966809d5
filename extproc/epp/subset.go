package epp

import (
	"net"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/server"
)

// subsetHint is the proxy's restriction of the candidates. Entries with a
// port match that exact ip:port (two endpoints may share an IP, one per
// data-parallel rank); entries without a port match every port of the IP.
type subsetHint struct {
	exact map[string]bool
	ips   map[string]bool
}

// readSubsetHint returns the hint, or nil when the proxy sent none. The
// value is accepted as a list of strings or as one comma-separated string,
// since proxies send both.
func readSubsetHint(md server.Metadata) *subsetHint {
	st := md[SubsetNamespace]
	if st == nil {
		return nil
	}
	v, ok := st.GetFields()[SubsetKey]
	if !ok {
		return nil
	}
	h := &subsetHint{exact: map[string]bool{}, ips: map[string]bool{}}
	var add func(v *structpb.Value)
	add = func(v *structpb.Value) {
		switch x := v.GetKind().(type) {
		case *structpb.Value_StringValue:
			for _, part := range strings.Split(x.StringValue, ",") {
				h.add(strings.TrimSpace(part))
			}
		case *structpb.Value_ListValue:
			for _, item := range x.ListValue.GetValues() {
				add(item)
			}
		}
	}
	add(v)
	return h
}

func (h *subsetHint) add(entry string) {
	if entry == "" {
		return
	}
	if host, port, err := net.SplitHostPort(entry); err == nil {
		h.exact[net.JoinHostPort(canonicalIP(host), port)] = true
		return
	}
	h.ips[canonicalIP(strings.Trim(entry, "[]"))] = true
}

func (h *subsetHint) empty() bool { return len(h.exact) == 0 && len(h.ips) == 0 }

func (h *subsetHint) allows(e *datastore.Endpoint) bool {
	host, port, err := net.SplitHostPort(e.Address)
	if err != nil {
		return false
	}
	ip := canonicalIP(host)
	return h.exact[net.JoinHostPort(ip, port)] || h.ips[ip]
}

// canonicalIP makes equal IPv6 spellings compare equal.
func canonicalIP(s string) string {
	if ip := net.ParseIP(s); ip != nil {
		return ip.String()
	}
	return s
}
