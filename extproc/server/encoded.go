package server

import (
	"fmt"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// EncodedMetadata is dynamic metadata encoded once, for a handler that
// answers many requests with one of a few values (a picker's destination):
// the server appends its bytes to the answer as they are, where a Struct
// would be sized and encoded again for every answer (its maps made that a
// tenth of the picker's CPU).
type EncodedMetadata struct {
	md   *structpb.Struct
	wire []byte // ProcessingResponse.dynamic_metadata: tag, length, message
}

// EncodeMetadata encodes md as an answer's dynamic metadata.
func EncodeMetadata(md *structpb.Struct) (*EncodedMetadata, error) {
	b, err := proto.Marshal(md)
	if err != nil {
		return nil, fmt.Errorf("encode dynamic metadata: %w", err)
	}
	num := (&extprocv3.ProcessingResponse{}).ProtoReflect().Descriptor().Fields().ByName("dynamic_metadata").Number()
	wire := protowire.AppendTag(nil, num, protowire.BytesType)
	return &EncodedMetadata{md: md, wire: protowire.AppendBytes(wire, b)}, nil
}

// Struct is the metadata encoded; it is not to be changed.
func (m *EncodedMetadata) Struct() *structpb.Struct { return m.md }

// withMetadata is an answer and the encoded dynamic metadata the codec
// appends to it. A message field may come in any position, so the answer
// without the field, followed by the field, is the answer with it.
type withMetadata struct {
	resp *extprocv3.ProcessingResponse // DynamicMetadata unset
	md   *EncodedMetadata
}
