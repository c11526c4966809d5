package extprocload

import (
	"errors"
	"fmt"

	"github.com/infergate/infergate/internal/grpcwire"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Frame encodes m as a gRPC message on the wire: its prefix, then the
// message.
func Frame(m proto.Message) ([]byte, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	p := grpcwire.Prefix(len(b))
	return append(p[:], b...), nil
}

// answer is what the driver needs of one ProcessingResponse; it reads
// only those fields, straight from the connection's buffer (decoding every
// answer in full took a seventh of the driver's CPU, more for a processor
// whose answers are larger).
type answer struct {
	// headers: the message answers the request headers; setHeaders is how
	// many headers it sets.
	headers    bool
	setHeaders int
	// streamedEnd: a request body chunk re-emitted with end_of_stream.
	streamedEnd bool
	// immediate: the message is an immediate response, with status.
	immediate bool
	status    uint64
}

// Field numbers of envoy.service.ext_proc.v3 and envoy.type.v3 messages
// the driver reads (TestFieldNumbers checks them against the descriptors).
const (
	fieldResponseRequestHeaders   = 1 // ProcessingResponse.request_headers (HeadersResponse)
	fieldResponseRequestBody      = 3 // ProcessingResponse.request_body (BodyResponse)
	fieldResponseImmediate        = 7 // ProcessingResponse.immediate_response
	fieldHeadersOrBodyResponse    = 1 // HeadersResponse.response, BodyResponse.response (CommonResponse)
	fieldCommonHeaderMutation     = 2 // CommonResponse.header_mutation
	fieldCommonBodyMutation       = 3 // CommonResponse.body_mutation
	fieldHeaderMutationSetHeaders = 1 // HeaderMutation.set_headers (repeated)
	fieldBodyMutationStreamed     = 3 // BodyMutation.streamed_response
	fieldStreamedBodyEndOfStream  = 2 // StreamedBodyResponse.end_of_stream
	fieldImmediateStatus          = 1 // ImmediateResponse.status (envoy.type.v3.HttpStatus)
	fieldHTTPStatusCode           = 1 // HttpStatus.code
)

var errMalformedAnswer = errors.New("malformed ext_proc answer")

// read fills a from one encoded ProcessingResponse. Fields appear in any
// order and a message field may appear more than once (its parts merge),
// as protobuf allows; everything else is skipped.
func (a *answer) read(b []byte) error {
	*a = answer{}
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case fieldResponseRequestHeaders:
			a.headers = true
			return within(v, []protowire.Number{fieldHeadersOrBodyResponse, fieldCommonHeaderMutation, fieldHeaderMutationSetHeaders},
				func([]byte) error { a.setHeaders++; return nil })
		case fieldResponseRequestBody:
			return within(v, []protowire.Number{fieldHeadersOrBodyResponse, fieldCommonBodyMutation, fieldBodyMutationStreamed},
				func(sr []byte) error {
					return varint(sr, fieldStreamedBodyEndOfStream, func(n uint64) { a.streamedEnd = n != 0 })
				})
		case fieldResponseImmediate:
			a.immediate = true
			return within(v, []protowire.Number{fieldImmediateStatus},
				func(st []byte) error { return varint(st, fieldHTTPStatusCode, func(n uint64) { a.status = n }) })
		}
		return nil
	})
}

// within calls f with the bytes of every message at path in b: path[0]
// of b, path[1] of that, and so on.
func within(b []byte, path []protowire.Number, f func([]byte) error) error {
	if len(path) == 0 {
		return f(b)
	}
	return fields(b, func(n protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if n == path[0] && typ == protowire.BytesType {
			return within(v, path[1:], f)
		}
		return nil
	})
}

// varint calls f with the value of every occurrence of varint field num
// in b.
func varint(b []byte, num protowire.Number, f func(uint64)) error {
	return fields(b, func(n protowire.Number, typ protowire.Type, _ []byte, v uint64) error {
		if n == num && typ == protowire.VarintType {
			f(v)
		}
		return nil
	})
}

// fields walks the fields of one encoded message, calling f with each
// field's number and type and its bytes (length-delimited) or value
// (varint); other types are skipped.
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %w", errMalformedAnswer, protowire.ParseError(n))
		}
		b = b[n:]
		var (
			v     []byte
			value uint64
		)
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			value, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: %w", errMalformedAnswer, protowire.ParseError(n))
		}
		b = b[n:]
		if typ == protowire.BytesType || typ == protowire.VarintType {
			if err := f(num, typ, v, value); err != nil {
				return err
			}
		}
	}
	return nil
}
