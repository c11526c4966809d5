#!/usr/bin/env bash
# Builds (or reuses) the test control plane and prints the folder that holds
# it, for envtest's KUBEBUILDER_ASSETS:
#   - kube-apiserver, kube-controller-manager and kube-scheduler, built from
#     the k8s.io/kubernetes Go module source at KUBE_VERSION (the module zip
#     has no staging/ tree, so its staging replace lines are dropped and the
#     staging modules required at the matching v0.x), cached outside the
#     clone, keyed by version; the controller-manager and scheduler make a
#     live cluster of the conformance runs (Deployments get Pods, Services
#     get EndpointSlices), kwok (hack/kwok.sh) plays the kubelet;
#   - etcd, from Debian's etcd-server package (installed if missing).
# The first build took 14 minutes of wall time on the 2-core build machine
# (and a few GB of Go build cache); later runs reuse the binary.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
CACHE="${INFERGATE_CACHE:-$HOME/.cache/infergate}"
DIR="$CACHE/controlplane/$KUBE_VERSION"
GO="${GO:-go}"

log() { echo "controlplane: $*" >&2; }

install_etcd() {
	if command -v etcd >/dev/null 2>&1; then
		return
	fi
	log "installing Debian etcd-server"
	local sudo=""
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null 2>&1 || { log "etcd is missing and this user cannot install etcd-server (not root, no sudo)"; exit 1; }
		sudo=sudo
	fi
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server >&2 ||
		{ $sudo apt-get update -q >&2 && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server >&2; }
}

build_missing() {
	local work minor src mod
	work="$(mktemp -d)"
	trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' RETURN
	log "building $* $KUBE_VERSION from k8s.io/kubernetes (about 15 minutes the first time)"
	mod="$(cd "$work" && GOFLAGS=-mod=mod "$GO" mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	[ -d "$mod" ] || { log "go mod download k8s.io/kubernetes@$KUBE_VERSION failed"; exit 1; }
	src="$work/kubernetes"
	cp -r "$mod" "$src"
	chmod -R u+w "$src"
	rm -f "$src/go.work" "$src/go.work.sum"
	minor="${KUBE_VERSION#v1.}" # 36.3
	(
		cd "$src"
		# Every k8s.io/X => ./staging/src/k8s.io/X replace goes; the
		# staging module is required at v0.<minor>.<patch> instead.
		for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*#\1#p' go.mod); do
			"$GO" mod edit -dropreplace="$m" -require="$m@v0.$minor"
		done
		local major gminor
		major=1
		gminor="${minor%%.*}"
		local cmd
		for cmd in "$@"; do
			GOFLAGS=-mod=mod CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w \
				-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
				-X k8s.io/component-base/version.gitMajor=$major \
				-X k8s.io/component-base/version.gitMinor=$gminor" \
				-o "$DIR/$cmd.partial" "./cmd/$cmd"
			mv "$DIR/$cmd.partial" "$DIR/$cmd"
		done
	)
}

mkdir -p "$DIR"
missing=()
for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
	[ -x "$DIR/$cmd" ] || missing+=("$cmd")
done
if [ "${#missing[@]}" -gt 0 ]; then
	build_missing "${missing[@]}"
fi
install_etcd
ln -sf "$(command -v etcd)" "$DIR/etcd"
"$DIR/kube-apiserver" --version >&2
echo "$DIR"
