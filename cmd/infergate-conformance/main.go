// Command infergate-conformance runs infergate's InferencePool conformance
// suite against a gateway in a cluster, or an endpoint picker or a payload
// processor at an address. It is a binary of its own so that the image's
// binary (cmd/infergate) links no test framework: the suite is ginkgo and
// gomega specs, and reuses upstream's gateway tests (testify).
package main

import "github.com/infergate/infergate/internal/cli"

// version is set at build time with -ldflags "-X main.version=..." (the
// Makefile does): the gateway profile runs the test picker and the echo
// server from the image of the same release.
var version = "dev"

func main() { cli.Main(newConformanceCommand()) }
