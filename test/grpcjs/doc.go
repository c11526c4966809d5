// Package grpcjs checks the ext_proc processors against a gRPC client that
// is not grpc-go: @grpc/grpc-js on Node's HTTP/2, which is nghttp2, the
// codec family of Envoy's own HTTP/2. The test plays Envoy's ext_proc
// filter for an endpoint picker and for a payload processor, through
// grpc-js, against each processor served by grpc-go and by the project's
// own HTTP/2 server (extproc/h2server), plain text and TLS, and requires
// the two transports to answer alike: the same messages byte for byte
// once map order is normalised, the same statuses, metadata and
// connection events.
//
// driver.js is a pipe: it opens one grpc-js channel and runs the streams
// the Go side asks for, passing messages as opaque bytes. Everything about
// ext_proc (the messages, their order, what an answer means) is decided
// here in Go.
//
// Run it with `go test ./test/grpcjs/`. It builds cmd/infergate, and finds
// grpc-js in $INFERGATE_GRPCJS or installs it with hack/grpcjs.sh (once,
// into ~/.cache/infergate); without node, npm or the registry it fails
// and says why.
package grpcjs
