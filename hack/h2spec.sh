#!/usr/bin/env bash
# h2spec, the HTTP/2 conformance client, built from its Go module and cached
# outside the clone, keyed by version and by this script:
#   hack/h2spec.sh       builds (or reuses) the binary and prints its path.
#
# Stock h2spec sends every request as a GET, which a gRPC server cannot
# serve: many cases then test the server's refusal of a non-gRPC request
# rather than its HTTP/2. This build adds one thing: with H2SPEC_GRPC=1 in
# its environment, the request headers every case starts from
# (spec.CommonHeaders) are those of a gRPC call, as Envoy sends one: POST,
# content-type application/grpc, te trailers. The :path is h2spec's own -P
# flag. Without the variable the binary is stock h2spec. The go command
# takes no overlay of the module cache, so the build patches a copy of the
# module's source in a scratch folder.
set -euo pipefail

H2SPEC_VERSION="${H2SPEC_VERSION:-v2.2.1+incompatible}"
# The module has no go.mod: its dependencies are pinned here, x/net at the
# version infergate's go.mod uses.
DEPS=(golang.org/x/net@v0.61.0 github.com/fatih/color@v1.18.0 github.com/spf13/cobra@v1.10.2 github.com/spf13/pflag@v1.0.10)
CACHE="${INFERGATE_CACHE:-$HOME/.cache/infergate}"
KEY="$(sha256sum "$0" | cut -c1-12)"
DIR="$CACHE/h2spec/$H2SPEC_VERSION-$KEY"
GO="${GO:-go}"

log() { echo "h2spec: $*" >&2; }

if [ -x "$DIR/h2spec" ]; then
	echo "$DIR/h2spec"
	exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log "building github.com/summerwind/h2spec@$H2SPEC_VERSION"
(
	cd "$work"
	"$GO" mod init h2specbuild >/dev/null 2>&1
	GOFLAGS=-mod=mod "$GO" get "github.com/summerwind/h2spec@$H2SPEC_VERSION" "${DEPS[@]}" >&2
)
mod="$(cd "$work" && "$GO" list -m -f '{{.Dir}}' github.com/summerwind/h2spec)"
[ -f "$mod/spec/util.go" ] || { log "module source not found at $mod"; exit 1; }

# The copy: the stock CommonHeaders renamed, and a file of ours wrapping it.
src="$work/h2spec"
cp -r "$mod" "$src"
chmod -R u+w "$src"
echo 'module github.com/summerwind/h2spec' >"$src/go.mod"
sed -i 's/^func CommonHeaders(/func stockCommonHeaders(/' "$src/spec/util.go"
grep -q '^func stockCommonHeaders(' "$src/spec/util.go" || { log "spec/util.go has no CommonHeaders to wrap"; exit 1; }
cat >"$src/spec/grpc_headers.go" <<'EOF'
package spec

import (
	"os"

	"github.com/summerwind/h2spec/config"
	"golang.org/x/net/http2/hpack"
)

// CommonHeaders is stock h2spec's request headers, or with H2SPEC_GRPC set
// those of a gRPC call (POST, content-type application/grpc, te trailers).
func CommonHeaders(c *config.Config) []hpack.HeaderField {
	h := stockCommonHeaders(c)
	if os.Getenv("H2SPEC_GRPC") == "" {
		return h
	}
	h[0] = HeaderField(":method", "POST")
	return append(h, HeaderField("content-type", "application/grpc"), HeaderField("te", "trailers"))
}
EOF

mkdir -p "$DIR"
(
	cd "$work"
	"$GO" mod edit -replace github.com/summerwind/h2spec=./h2spec
	GOFLAGS=-mod=mod "$GO" build -o "$DIR/h2spec.partial" github.com/summerwind/h2spec/cmd/h2spec
)
mv "$DIR/h2spec.partial" "$DIR/h2spec"
log "built $DIR/h2spec"
echo "$DIR/h2spec"
