package datastore

import (
	"net"
	"strings"
)

// AddressSet matches endpoints against a list of addresses as proxies and
// test clients write them. Entries with a port match that exact ip:port (two
// endpoints may share an IP, one per data-parallel rank); entries without a
// port match every port of the IP. IPv6 spellings are compared in their
// canonical form, with or without brackets.
type AddressSet struct {
	exact map[string]bool
	ips   map[string]bool
}

// NewAddressSet returns an empty set.
func NewAddressSet() *AddressSet {
	return &AddressSet{exact: map[string]bool{}, ips: map[string]bool{}}
}

// AddList adds each entry of a comma-separated list; blanks are skipped.
func (s *AddressSet) AddList(list string) {
	for _, entry := range strings.Split(list, ",") {
		s.Add(entry)
	}
}

// Add adds one "ip", "[ipv6]" or "ip:port" entry.
func (s *AddressSet) Add(entry string) {
	entry = strings.TrimSpace(entry)
	if entry == "" {
		return
	}
	if host, port, err := net.SplitHostPort(entry); err == nil {
		s.exact[net.JoinHostPort(canonicalIP(host), port)] = true
		return
	}
	s.ips[canonicalIP(strings.Trim(entry, "[]"))] = true
}

// Empty reports whether no entry was added.
func (s *AddressSet) Empty() bool { return len(s.exact) == 0 && len(s.ips) == 0 }

// Allows reports whether the endpoint's address is in the set.
func (s *AddressSet) Allows(e *Endpoint) bool {
	host, port, err := net.SplitHostPort(e.Address)
	if err != nil {
		return false
	}
	ip := canonicalIP(host)
	return s.exact[net.JoinHostPort(ip, port)] || s.ips[ip]
}

// canonicalIP makes equal IPv6 spellings compare equal.
func canonicalIP(s string) string {
	if ip := net.ParseIP(s); ip != nil {
		return ip.String()
	}
	return s
}
