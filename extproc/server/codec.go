package server

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// codec is gRPC's proto codec, except that a message too large to
// allocate on its own is marshalled into a buffer of pool rather than of
// gRPC's default pool. Those tiers are 256 B, 4, 16 and 32 KiB and 1 MiB,
// and a body chunk of up to MaxChunkBytes marshals to more than 32 KiB:
// each took a 1 MiB buffer (with 64 KiB bodies over 32 streams, 28 of the
// payload processor's 39 MB of heap in use were such buffers).
type codec struct {
	pool mem.BufferPool
	base encoding.CodecV2 // gRPC's, for unmarshalling
}

// newCodec is the codec over buffers of 256 B, 4, 16, 32 and 64 KiB and
// 1 MiB: gRPC's tiers and one that holds a chunk's message.
func newCodec() (*codec, error) {
	pool, err := mem.NewBinaryTieredBufferPool(8, 12, 14, 15, 16, 20)
	if err != nil {
		return nil, fmt.Errorf("grpc buffer pool: %w", err)
	}
	base := encoding.GetCodecV2("proto")
	if base == nil {
		return nil, fmt.Errorf("grpc has no proto codec registered")
	}
	return &codec{pool: pool, base: base}, nil
}

func (c *codec) Name() string { return "proto" }

func (c *codec) Marshal(v any) (mem.BufferSlice, error) {
	m, tail, size, err := sized(v)
	if err != nil {
		return nil, err
	}
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := marshalAppend(make([]byte, 0, size), m, tail)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf, err := c.intoPool(m, tail, size)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, c.pool)}, nil
}

// marshalPooled marshals v into a buffer of the pool, which the caller
// puts back once it has sent it.
func (c *codec) marshalPooled(v any) (*[]byte, error) {
	m, tail, size, err := sized(v)
	if err != nil {
		return nil, err
	}
	return c.intoPool(m, tail, size)
}

// intoPool marshals m and tail, size bytes together, into a buffer of the
// pool.
func (c *codec) intoPool(m proto.Message, tail []byte, size int) (*[]byte, error) {
	buf := c.pool.Get(size)
	b, err := marshalAppend((*buf)[:0], m, tail)
	if err != nil {
		c.pool.Put(buf)
		return nil, err
	}
	*buf = b
	return buf, nil
}

// sized is the message v holds, the encoded fields to append to it (a
// withMetadata's), and their size together.
func sized(v any) (m proto.Message, tail []byte, size int, err error) {
	m, ok := v.(proto.Message)
	if w, isW := v.(*withMetadata); isW {
		m, tail, ok = w.resp, w.md.wire, true
	}
	if !ok {
		return nil, nil, 0, fmt.Errorf("proto: cannot marshal %T, not a proto.Message", v)
	}
	return m, tail, proto.Size(m) + len(tail), nil
}

// marshalAppend appends m, then tail, to b. It reuses the size sized just
// computed; nothing else writes m while it is being sent.
func marshalAppend(b []byte, m proto.Message, tail []byte) ([]byte, error) {
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, m)
	if err != nil {
		return nil, err
	}
	return append(b, tail...), nil
}

// Unmarshal decodes a ProcessingRequest into an inbound by hand, and
// anything else (a health check) with gRPC's codec.
func (c *codec) Unmarshal(data mem.BufferSlice, v any) error {
	in, ok := v.(*inbound)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(c.pool)
	defer buf.Free()
	return in.unmarshal(buf.ReadOnlyData())
}
