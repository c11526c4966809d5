package extprocfilter

import (
	"fmt"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Header is one header line. Keys are lower case, as Envoy keeps them.
type Header struct {
	Key   string
	Value string
}

// Headers is an ordered header list with pseudo-headers (":method", ":path",
// ":authority", ":scheme", ":status") first, the shape of Envoy's header map.
// A key may repeat; order matters because an ORIGINAL_DST cluster reads only
// the first instance of its header.
type Headers []Header

// Get returns the first value of key, or "".
func (h Headers) Get(key string) string {
	key = strings.ToLower(key)
	for _, kv := range h {
		if kv.Key == key {
			return kv.Value
		}
	}
	return ""
}

// Values returns every value of key in order.
func (h Headers) Values(key string) []string {
	key = strings.ToLower(key)
	var out []string
	for _, kv := range h {
		if kv.Key == key {
			out = append(out, kv.Value)
		}
	}
	return out
}

// Has reports whether key is present.
func (h Headers) Has(key string) bool {
	key = strings.ToLower(key)
	for _, kv := range h {
		if kv.Key == key {
			return true
		}
	}
	return false
}

// Clone returns an independent copy.
func (h Headers) Clone() Headers {
	if h == nil {
		return nil
	}
	return append(Headers(nil), h...)
}

// Add appends a value.
func (h *Headers) Add(key, value string) {
	*h = append(*h, Header{Key: strings.ToLower(key), Value: value})
}

// Set replaces every instance of key with one value, keeping the position of
// the first instance (Envoy's setCopy).
func (h *Headers) Set(key, value string) {
	key = strings.ToLower(key)
	out := (*h)[:0]
	done := false
	for _, kv := range *h {
		if kv.Key != key {
			out = append(out, kv)
			continue
		}
		if !done {
			out = append(out, Header{Key: key, Value: value})
			done = true
		}
	}
	if !done {
		out = append(out, Header{Key: key, Value: value})
	}
	*h = out
}

// Del removes every instance of key.
func (h *Headers) Del(key string) {
	key = strings.ToLower(key)
	out := (*h)[:0]
	for _, kv := range *h {
		if kv.Key != key {
			out = append(out, kv)
		}
	}
	*h = out
}

// toProto encodes headers the way Envoy does by default (runtime flag
// send_header_raw_value): the bytes go in raw_value, value stays empty.
func (h Headers) toProto() *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, 0, len(h))}
	for _, kv := range h {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv.Key, RawValue: []byte(kv.Value)})
	}
	return m
}

// HeadersFromProto decodes a HeaderMap, accepting either value field.
func HeadersFromProto(m *corev3.HeaderMap) Headers {
	var h Headers
	for _, hv := range m.GetHeaders() {
		v := string(hv.GetRawValue())
		if v == "" {
			v = hv.GetValue()
		}
		h.Add(hv.GetKey(), v)
	}
	return h
}

// applyHeaderMutation applies an ext_proc HeaderMutation with the rules of
// Envoy's default HeaderMutationRules: changes to :method, :scheme,
// :authority, host and x-envoy-* are ignored, system headers cannot be
// removed. Malformed mutations return ErrInvalidMutation, which Envoy turns
// into a 500 local reply whatever failure_mode_allow says.
func applyHeaderMutation(h *Headers, m *extprocv3.HeaderMutation, response bool) error {
	if m == nil {
		return nil
	}
	for _, name := range m.GetRemoveHeaders() {
		if !validHeaderName(name) {
			return fmt.Errorf("%w: invalid character in remove_headers %q", ErrInvalidMutation, name)
		}
		name = strings.ToLower(name)
		if strings.HasPrefix(name, ":") || name == "host" || protectedHeader(name) {
			continue
		}
		h.Del(name)
	}
	for _, opt := range m.GetSetHeaders() {
		hv := opt.GetHeader()
		if hv == nil {
			continue
		}
		// Envoy reads only raw_value (send_header_raw_value is on by
		// default): a server that fills value alone sets an empty header,
		// and value beside raw_value is not looked at.
		key, value := strings.ToLower(hv.GetKey()), string(hv.GetRawValue())
		if !validHeaderName(key) || strings.ContainsAny(value, "\r\n\x00") {
			return fmt.Errorf("%w: invalid character in set_headers %q", ErrInvalidMutation, key)
		}
		if !mutable(key, value, response) {
			continue
		}
		// ext_proc reads the deprecated append flag only (false unless
		// set) and ignores append_action (mutation_utils.cc
		// MutationUtils::applyHeaderMutations).
		if opt.GetAppend().GetValue() && h.Has(key) {
			h.Add(key, value)
		} else {
			h.Set(key, value)
		}
	}
	return nil
}

// mutable reports whether Envoy's default rules let a server set key.
func mutable(key, value string, response bool) bool {
	switch {
	case protectedHeader(key):
		return false
	case key == ":path":
		return !response
	case key == ":status":
		code, err := strconv.Atoi(value)
		return response && err == nil && code >= 200 && code <= 599
	case strings.HasPrefix(key, ":"):
		return false
	}
	return true
}

func protectedHeader(key string) bool {
	switch key {
	case ":method", ":scheme", ":authority", "host":
		return true
	}
	return strings.HasPrefix(key, "x-envoy")
}

func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i, c := range []byte(name) {
		if c == ':' && i == 0 {
			continue
		}
		if c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	return true
}
