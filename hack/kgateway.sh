#!/usr/bin/env bash
# Builds (or reuses) kgateway's controller from its Go module source and
# prints the folder that holds it: kgateway, and crds/ with its own CRDs (the
# Gateway API and InferencePool CRDs come from the test control plane). The
# module proxy serves v2.2.0 but refuses the version list, so the version is
# pinned exactly. Cached outside the clone, keyed by version. The first build
# takes several minutes on 2 cores; later runs reuse the binary.
set -euo pipefail

KGW_VERSION="${KGW_VERSION:-v2.2.0}"
CACHE="${INFERGATE_CACHE:-$HOME/.cache/infergate}"
DIR="$CACHE/kgateway/$KGW_VERSION"
GO="${GO:-go}"

log() { echo "kgateway: $*" >&2; }

build() {
	local work mod
	work="$(mktemp -d)"
	trap 'rm -rf "$work"' RETURN
	log "building kgateway $KGW_VERSION from github.com/kgateway-dev/kgateway/v2 (several minutes the first time)"
	mod="$(cd "$work" && GOFLAGS=-mod=mod "$GO" mod download -json "github.com/kgateway-dev/kgateway/v2@$KGW_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	[ -d "$mod" ] || { log "go mod download github.com/kgateway-dev/kgateway/v2@$KGW_VERSION failed"; exit 1; }
	mkdir -p "$DIR/crds.partial"
	cp "$mod"/install/helm/kgateway-crds/templates/gateway.kgateway.dev_*.yaml "$DIR/crds.partial/"
	(
		cd "$mod"
		CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w -X github.com/kgateway-dev/kgateway/v2/pkg/version.Version=$KGW_VERSION" \
			-o "$DIR/kgateway.partial" ./cmd/kgateway
	)
	rm -rf "$DIR/crds"
	mv "$DIR/crds.partial" "$DIR/crds"
	mv "$DIR/kgateway.partial" "$DIR/kgateway"
}

mkdir -p "$DIR"
if [ ! -x "$DIR/kgateway" ] || [ ! -d "$DIR/crds" ]; then
	build
fi
echo "$DIR"
