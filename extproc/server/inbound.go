package server

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// inbound is a ProcessingRequest as a stream reads it, decoded straight
// from the wire: the headers into a Headers map, the body into a slice of
// its own. Unmarshalling into the generated messages and converting them
// built a message per header, a string per key and value and then the
// map again: 13% of the picker's CPU with four headers, and Envoy sends
// a dozen or more. The metadata and the protocol configuration, small and
// not sent with every message, still go through proto.
type inbound struct {
	kind        inboundKind
	headers     Headers // the headers kinds: keys lower-cased
	body        []byte  // the body kinds
	endOfStream bool    // of the headers or body
	metadata    *corev3.Metadata
	protocol    *extprocv3.ProtocolConfiguration
}

// inboundKind is which message of ProcessingRequest's request oneof came.
type inboundKind int

// The kinds are the oneof's field numbers; zero is none.
const (
	kindRequestHeaders   inboundKind = 2
	kindResponseHeaders  inboundKind = 3
	kindRequestBody      inboundKind = 4
	kindResponseBody     inboundKind = 5
	kindRequestTrailers  inboundKind = 6
	kindResponseTrailers inboundKind = 7
)

// Other fields of ProcessingRequest, HttpHeaders, HttpBody, HeaderMap and
// HeaderValue (envoy/service/ext_proc/v3/external_processor.proto,
// envoy/config/core/v3/base.proto).
const (
	fieldMetadataContext = 8
	fieldProtocolConfig  = 11

	fieldHeadersMap         = 1
	fieldHeadersEndOfStream = 3
	fieldBodyBody           = 1
	fieldBodyEndOfStream    = 2
	fieldMapHeaders         = 1
	fieldValueKey           = 1
	fieldValueValue         = 2
	fieldValueRaw           = 3
)

// unmarshal decodes b, a ProcessingRequest, into m as proto.Unmarshal
// and the generated getters would: a repeated message field merges, the
// last field of the oneof wins, a field of the wrong wire type is an
// unknown field, and the strings read must be valid UTF-8. The fields not
// read (attributes, observability_mode, the trailers' content) are
// skipped as unknown ones.
func (m *inbound) unmarshal(b []byte) error {
	*m = inbound{}
	for len(b) > 0 {
		num, typ, v, err := consumeField(&b)
		if err != nil {
			return fmt.Errorf("ProcessingRequest: %w", err)
		}
		if typ != protowire.BytesType {
			continue
		}
		switch kind := inboundKind(num); {
		case num == fieldMetadataContext:
			if m.metadata == nil {
				m.metadata = &corev3.Metadata{}
			}
			err = proto.UnmarshalOptions{Merge: true}.Unmarshal(v.bytes, m.metadata)
		case num == fieldProtocolConfig:
			if m.protocol == nil {
				m.protocol = &extprocv3.ProtocolConfiguration{}
			}
			err = proto.UnmarshalOptions{Merge: true}.Unmarshal(v.bytes, m.protocol)
		case kind >= kindRequestHeaders && kind <= kindResponseTrailers:
			if kind != m.kind {
				// Another member of the oneof replaces the last.
				m.headers, m.body, m.endOfStream = nil, nil, false
			}
			m.kind = kind
			switch kind {
			case kindRequestHeaders, kindResponseHeaders:
				err = m.unmarshalHeaders(v.bytes)
			case kindRequestBody, kindResponseBody:
				err = m.unmarshalBody(v.bytes)
			default: // trailers: their content is not read
				err = validMessage(v.bytes)
			}
		}
		if err != nil {
			return fmt.Errorf("ProcessingRequest field %d: %w", num, err)
		}
	}
	return nil
}

// unmarshalHeaders decodes an HttpHeaders.
func (m *inbound) unmarshalHeaders(b []byte) error {
	if m.headers == nil {
		m.headers = Headers{}
	}
	for len(b) > 0 {
		num, typ, v, err := consumeField(&b)
		if err != nil {
			return err
		}
		switch {
		case num == fieldHeadersMap && typ == protowire.BytesType:
			if err := m.unmarshalHeaderMap(v.bytes); err != nil {
				return err
			}
		case num == fieldHeadersEndOfStream && typ == protowire.VarintType:
			m.endOfStream = v.varint != 0
		}
	}
	return nil
}

// unmarshalHeaderMap decodes a HeaderMap's values into m.headers as the
// stream reads them: the raw value when there is one, else the value, by
// the lower-cased key. The keys and values of one map share one string.
func (m *inbound) unmarshalHeaderMap(b []byte) error {
	type field struct{ key, value []byte }
	var inline [32]field
	fields := inline[:0]
	size := 0
	for rest := b; len(rest) > 0; {
		num, typ, v, err := consumeField(&rest)
		if err != nil {
			return err
		}
		if num != fieldMapHeaders || typ != protowire.BytesType {
			continue
		}
		var f field
		var raw []byte
		for hv := v.bytes; len(hv) > 0; {
			num, typ, v, err := consumeField(&hv)
			if err != nil {
				return err
			}
			if typ != protowire.BytesType {
				continue
			}
			switch num {
			case fieldValueKey:
				f.key = v.bytes
			case fieldValueValue:
				f.value = v.bytes
			case fieldValueRaw:
				raw = v.bytes
			}
		}
		if !utf8.Valid(f.key) || !utf8.Valid(f.value) {
			return errors.New("HeaderValue: a key or value is not valid UTF-8")
		}
		if len(raw) > 0 {
			f.value = raw
		}
		fields = append(fields, f)
		size += len(f.key) + len(f.value)
	}
	var sb strings.Builder
	sb.Grow(size)
	for _, f := range fields {
		sb.Write(f.key)
		sb.Write(f.value)
	}
	all := sb.String()
	at := 0
	for _, f := range fields {
		key := all[at : at+len(f.key)]
		at += len(f.key)
		m.headers[strings.ToLower(key)] = all[at : at+len(f.value)]
		at += len(f.value)
	}
	return nil
}

// unmarshalBody decodes an HttpBody, copying the body out of b.
func (m *inbound) unmarshalBody(b []byte) error {
	for len(b) > 0 {
		num, typ, v, err := consumeField(&b)
		if err != nil {
			return err
		}
		switch {
		case num == fieldBodyBody && typ == protowire.BytesType:
			m.body = append([]byte(nil), v.bytes...)
		case num == fieldBodyEndOfStream && typ == protowire.VarintType:
			m.endOfStream = v.varint != 0
		}
	}
	return nil
}

// fieldValue is a consumed field's value: bytes for the length-delimited
// wire type, varint for the varint type; other types are skipped.
type fieldValue struct {
	bytes  []byte
	varint uint64
}

// consumeField reads the field at the start of *b and moves past it.
func consumeField(b *[]byte) (protowire.Number, protowire.Type, fieldValue, error) {
	num, typ, n := protowire.ConsumeTag(*b)
	if n < 0 {
		return 0, 0, fieldValue{}, protowire.ParseError(n)
	}
	*b = (*b)[n:]
	var v fieldValue
	switch typ {
	case protowire.BytesType:
		v.bytes, n = protowire.ConsumeBytes(*b)
	case protowire.VarintType:
		v.varint, n = protowire.ConsumeVarint(*b)
	default:
		n = protowire.ConsumeFieldValue(num, typ, *b)
	}
	if n < 0 {
		return 0, 0, fieldValue{}, protowire.ParseError(n)
	}
	*b = (*b)[n:]
	return num, typ, v, nil
}

// validMessage checks that b is a well-formed message, as proto.Unmarshal
// does of the fields it does not read.
func validMessage(b []byte) error {
	for len(b) > 0 {
		if _, _, _, err := consumeField(&b); err != nil {
			return err
		}
	}
	return nil
}
