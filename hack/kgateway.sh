#!/usr/bin/env bash
# Builds (or reuses) kgateway's controller from its Go module source and
# prints the folder that holds it: kgateway, and crds/ with its own CRDs (the
# Gateway API and InferencePool CRDs come from the test control plane). The
# module proxy serves v2.2.0 but refuses the version list, so the version is
# pinned exactly. Cached outside the clone, keyed by version and patch. The
# first build takes several minutes on 2 cores; later runs reuse the binary.
#
# One line of kgateway is changed before the build (KGW_PATCH, docs/kgateway.md):
# v2.2.0's (*inferencePool).Equals locks its own pool's mutex and then the
# other pool's, so comparing a pool with itself waits forever on a mutex it
# holds, inside its translation's collection lock: the controller then sends
# no Envoy configuration again. It did so to about one instance in seven here
# (pprof: a goroutine in Equals, inferencepool/ir.go:138, on sync.Mutex.Lock
# for minutes). The change returns true for a pool compared with itself.
# KGW_PATCH=none builds kgateway as shipped.
set -euo pipefail

KGW_VERSION="${KGW_VERSION:-v2.2.0}"
KGW_PATCH="${KGW_PATCH:-equals-self}"
CACHE="${INFERGATE_CACHE:-$HOME/.cache/infergate}"
DIR="$CACHE/kgateway/$KGW_VERSION"
[ "$KGW_PATCH" = none ] || DIR="$DIR+$KGW_PATCH"
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
	local src="$mod"
	if [ "$KGW_PATCH" != none ]; then
		src="$work/src"
		cp -r "$mod" "$src"
		chmod -R u+w "$src"
		patch_equals "$src/pkg/kgateway/agentgatewaysyncer/backend/inferencepool/ir.go"
	fi
	(
		cd "$src"
		CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w -X github.com/kgateway-dev/kgateway/v2/pkg/version.Version=$KGW_VERSION" \
			-o "$DIR/kgateway.partial" ./cmd/kgateway
	)
	rm -rf "$DIR/crds"
	mv "$DIR/crds.partial" "$DIR/crds"
	mv "$DIR/kgateway.partial" "$DIR/kgateway"
}

# patch_equals makes (*inferencePool).Equals return true for a pool
# compared with itself before it locks anything.
patch_equals() {
	local f="$1"
	[ "$(grep -c '^	// Compare pod selector$' "$f")" = 1 ] || { log "$f: not the v2.2.0 Equals this patch is for"; exit 1; }
	sed -i 's|^\t// Compare pod selector$|\tif otherPool == ir {\n\t\treturn true\n\t}\n&|' "$f"
	grep -q '^	if otherPool == ir {$' "$f" || { log "$f: patch not applied"; exit 1; }
	log "patched $f: a pool compared with itself is equal (kgateway v2.2.0 deadlocks there)"
}

mkdir -p "$DIR"
if [ ! -x "$DIR/kgateway" ] || [ ! -d "$DIR/crds" ]; then
	build
fi
echo "$DIR"
