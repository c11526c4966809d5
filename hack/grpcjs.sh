#!/usr/bin/env bash
# @grpc/grpc-js from npm, cached outside the clone and keyed by version, for
# the interop test that drives the ext_proc processors with a gRPC client on
# Node's HTTP/2 (nghttp2) instead of grpc-go (test/grpcjs):
#   hack/grpcjs.sh   installs (or reuses) the package and prints the folder
#                    whose node_modules holds it (NODE_PATH is that folder's
#                    node_modules).
# Node and npm come from Debian's nodejs and npm packages, installed if
# missing. The first run fetches a few hundred KiB from the npm registry;
# later runs reuse the folder and need no network.
set -euo pipefail

GRPCJS_VERSION="${GRPCJS_VERSION:-1.14.7}"
CACHE="${INFERGATE_CACHE:-$HOME/.cache/infergate}"
DIR="$CACHE/grpcjs/$GRPCJS_VERSION"

log() { echo "grpcjs: $*" >&2; }

install_node() {
	if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
		return
	fi
	log "installing Debian nodejs and npm"
	local sudo=""
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null 2>&1 || { log "node or npm is missing and this user cannot install them (not root, no sudo)"; exit 1; }
		sudo=sudo
	fi
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >&2 ||
		{ $sudo apt-get update -q >&2 && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >&2; }
}

install_grpcjs() {
	log "installing @grpc/grpc-js@$GRPCJS_VERSION with $(npm --version 2>/dev/null || echo '?') (node $(node --version))"
	rm -rf "$DIR.partial"
	mkdir -p "$DIR.partial"
	local got
	npm install --no-audit --no-fund --save-exact --prefix "$DIR.partial" "@grpc/grpc-js@$GRPCJS_VERSION" >&2
	got="$(node -p "require('$DIR.partial/node_modules/@grpc/grpc-js/package.json').version")"
	[ "$got" = "$GRPCJS_VERSION" ] || { log "npm installed @grpc/grpc-js $got, want $GRPCJS_VERSION"; exit 1; }
	rm -rf "$DIR"
	mv "$DIR.partial" "$DIR"
}

install_node
if [ ! -f "$DIR/node_modules/@grpc/grpc-js/package.json" ]; then
	mkdir -p "$(dirname "$DIR")"
	install_grpcjs
fi
echo "$DIR"
