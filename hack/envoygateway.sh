#!/usr/bin/env bash
# Builds (or reuses) Envoy Gateway's controller from its Go module source and
# prints the folder that holds it: envoy-gateway, for the gateway tests that
# run it against the test control plane. Cached outside the clone, keyed by
# version. The first build takes several minutes on 2 cores; later runs reuse
# the binary.
set -euo pipefail

EG_VERSION="${EG_VERSION:-v1.9.1}"
CACHE="${INFERGATE_CACHE:-$HOME/.cache/infergate}"
DIR="$CACHE/envoygateway/$EG_VERSION"
GO="${GO:-go}"

log() { echo "envoygateway: $*" >&2; }

build() {
	local work mod
	work="$(mktemp -d)"
	trap 'rm -rf "$work"' RETURN
	log "building Envoy Gateway $EG_VERSION from github.com/envoyproxy/gateway (several minutes the first time)"
	mod="$(cd "$work" && GOFLAGS=-mod=mod "$GO" mod download -json "github.com/envoyproxy/gateway@$EG_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	[ -d "$mod" ] || { log "go mod download github.com/envoyproxy/gateway@$EG_VERSION failed"; exit 1; }
	(
		cd "$mod"
		CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$DIR/envoy-gateway.partial" ./cmd/envoy-gateway
	)
	mv "$DIR/envoy-gateway.partial" "$DIR/envoy-gateway"
}

mkdir -p "$DIR"
if [ ! -x "$DIR/envoy-gateway" ]; then
	build
fi
echo "$DIR"
