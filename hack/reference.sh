#!/usr/bin/env bash
# Builds (or reuses) the reference implementations infergate is measured
# against: the Gateway API Inference Extension's endpoint picker (epp) and
# body-based router (bbr), from its Go module source, and prints the folder
# that holds them, with the CRDs of the kinds the picker watches besides
# InferencePool (crd/, from the same module). v1.5.0 is the last release whose module has both; later
# ones moved them out. Cached outside the clone, keyed by version; the first
# build takes about 6 minutes on 2 cores.
set -euo pipefail

GAIE_VERSION="${GAIE_VERSION:-v1.5.0}"
CACHE="${INFERGATE_CACHE:-$HOME/.cache/infergate}"
DIR="$CACHE/reference/$GAIE_VERSION"
GO="${GO:-go}"

log() { echo "reference: $*" >&2; }

# The commands are built inside a module of their own that requires
# upstream's, so the versions upstream's go.mod pins are the ones used
# (building in the module cache's read-only copy would need its go.sum).
build() {
	local work
	work="$(mktemp -d)"
	trap 'rm -rf "$work"' RETURN
	log "building GAIE $GAIE_VERSION epp and bbr from sigs.k8s.io/gateway-api-inference-extension (several minutes the first time)"
	(
		cd "$work"
		"$GO" mod init infergate.local/reference >/dev/null 2>&1
		GOFLAGS=-mod=mod "$GO" get "sigs.k8s.io/gateway-api-inference-extension/cmd/epp@$GAIE_VERSION" >&2
		for cmd in epp bbr; do
			CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath -ldflags "-s -w" -o "$DIR/$cmd.partial" "sigs.k8s.io/gateway-api-inference-extension/cmd/$cmd"
			mv "$DIR/$cmd.partial" "$DIR/$cmd"
		done
	)
}

crds() {
	local mod
	mod="$(cd "$DIR" && GOFLAGS=-mod=mod "$GO" mod download -json "sigs.k8s.io/gateway-api-inference-extension@$GAIE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	[ -d "$mod" ] || { log "go mod download sigs.k8s.io/gateway-api-inference-extension@$GAIE_VERSION failed"; exit 1; }
	mkdir -p "$DIR/crd.partial"
	cp "$mod"/config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml \
		"$mod"/config/crd/bases/inference.networking.x-k8s.io_inferencemodelrewrites.yaml "$DIR/crd.partial/"
	chmod u+w "$DIR"/crd.partial/*
	mv "$DIR/crd.partial" "$DIR/crd"
}

mkdir -p "$DIR"
if [ ! -x "$DIR/epp" ] || [ ! -x "$DIR/bbr" ]; then
	build
fi
if [ ! -d "$DIR/crd" ]; then
	crds
fi
echo "$DIR"
