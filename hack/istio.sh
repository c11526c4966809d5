#!/usr/bin/env bash
# Istio's control plane from the istio.io/istio Go module, cached outside
# the clone and keyed by version:
#   hack/istio.sh        builds (or reuses) pilot-discovery and prints the
#                        folder that holds it, crds/crd-all.gen.yaml and
#                        charts/istio-discovery (the chart whose ConfigMaps
#                        hold the gateway deployment template);
#   hack/istio.sh crds   only fetches the module and prints the folder
#                        that holds crds/ (Istio's CRDs, for tests that
#                        apply Istio objects without running istiod).
# The first build takes several minutes on 2 cores; later runs reuse it.
set -euo pipefail

# The newest pseudo-version the module proxy serves (istio.io/istio tags no
# Go module releases).
ISTIO_VERSION="${ISTIO_VERSION:-v0.0.0-20260827124520-eed52ebb66ad}"
CACHE="${INFERGATE_CACHE:-$HOME/.cache/infergate}"
DIR="$CACHE/istio/$ISTIO_VERSION"
GO="${GO:-go}"

log() { echo "istio: $*" >&2; }

module() {
	local work mod
	work="$(mktemp -d)"
	mod="$(cd "$work" && GOFLAGS=-mod=mod "$GO" mod download -json "istio.io/istio@$ISTIO_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	rm -rf "$work"
	[ -d "$mod" ] || { log "go mod download istio.io/istio@$ISTIO_VERSION failed"; exit 1; }
	echo "$mod"
}

crds() {
	mkdir -p "$DIR/crds"
	cp "$1/manifests/charts/base/files/crd-all.gen.yaml" "$DIR/crds/crd-all.gen.yaml.partial"
	mv "$DIR/crds/crd-all.gen.yaml.partial" "$DIR/crds/crd-all.gen.yaml"
}

chart() {
	mkdir -p "$DIR/charts"
	rm -rf "$DIR/charts/istio-discovery.partial"
	cp -r "$1/manifests/charts/istio-control/istio-discovery" "$DIR/charts/istio-discovery.partial"
	chmod -R u+w "$DIR/charts/istio-discovery.partial"
	mv "$DIR/charts/istio-discovery.partial" "$DIR/charts/istio-discovery"
}

build() {
	log "building pilot-discovery $ISTIO_VERSION from istio.io/istio (several minutes the first time)"
	(
		cd "$1"
		CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$DIR/pilot-discovery.partial" ./pilot/cmd/pilot-discovery
	)
	mv "$DIR/pilot-discovery.partial" "$DIR/pilot-discovery"
}

mkdir -p "$DIR"
if [ ! -f "$DIR/crds/crd-all.gen.yaml" ] || { [ "${1:-}" != crds ] && { [ ! -x "$DIR/pilot-discovery" ] || [ ! -f "$DIR/charts/istio-discovery/Chart.yaml" ]; }; }; then
	mod="$(module)"
	[ -f "$DIR/crds/crd-all.gen.yaml" ] || crds "$mod"
	[ "${1:-}" = crds ] || [ -f "$DIR/charts/istio-discovery/Chart.yaml" ] || chart "$mod"
	[ "${1:-}" = crds ] || [ -x "$DIR/pilot-discovery" ] || build "$mod"
fi
echo "$DIR"
