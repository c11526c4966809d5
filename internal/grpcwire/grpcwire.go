// Package grpcwire frames gRPC messages as gRPC over HTTP/2 carries them:
// each message behind a 5-byte prefix, a compressed flag and its length
// (grpc/grpc PROTOCOL-HTTP2.md, "Length-Prefixed-Message"). The ext_proc
// transport (extproc/h2server) and the load driver (bench/extprocload)
// speak it without grpc-go and share this one reading of it.
package grpcwire

import (
	"encoding/binary"
	"errors"
)

// PrefixLen is the length of a message's prefix.
const PrefixLen = 5

// ErrCompressed is a message whose compressed flag is set: neither side
// here negotiates compression, so one is a broken peer.
var ErrCompressed = errors.New("a compressed gRPC message, but no compression was negotiated")

// Prefix is the prefix of an uncompressed message of n bytes.
func Prefix(n int) [PrefixLen]byte {
	var p [PrefixLen]byte
	binary.BigEndian.PutUint32(p[1:], uint32(n))
	return p
}

// Length reads the message length from a whole prefix; ErrCompressed if
// the message is compressed.
func Length(prefix []byte) (uint32, error) {
	n := binary.BigEndian.Uint32(prefix[1:PrefixLen])
	if prefix[0] != 0 {
		return n, ErrCompressed
	}
	return n, nil
}

// Split splits the first message off b: the message and what follows it;
// ok is false while b holds less than a whole one.
func Split(b []byte) (msg, rest []byte, ok bool, err error) {
	if len(b) < PrefixLen {
		return nil, b, false, nil
	}
	n, err := Length(b)
	if err != nil {
		return nil, b, false, err
	}
	if uint64(len(b)) < PrefixLen+uint64(n) {
		return nil, b, false, nil
	}
	end := PrefixLen + int(n)
	return b[PrefixLen:end], b[end:], true, nil
}
