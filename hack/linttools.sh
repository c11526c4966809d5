#!/usr/bin/env bash
# The linters make lint runs, built from their Go modules at pinned versions
# into a cache outside the clone (the module proxy is the only network they
# need, and only on the first run):
#   hack/linttools.sh   builds (or reuses) them and prints the folder that
#                       holds staticcheck and deadcode.
# They are built in their own module context (go install pkg@version), so
# they add nothing to this module's go.mod.
set -euo pipefail

STATICCHECK_VERSION="${STATICCHECK_VERSION:-v0.8.2}" # staticcheck 2026.1.x
DEADCODE_VERSION="${DEADCODE_VERSION:-v0.51.0}"      # golang.org/x/tools
CACHE="${INFERGATE_CACHE:-$HOME/.cache/infergate}"
DIR="$CACHE/linttools/staticcheck-$STATICCHECK_VERSION-deadcode-$DEADCODE_VERSION-$(go env GOVERSION)"

if [ ! -x "$DIR/staticcheck" ] || [ ! -x "$DIR/deadcode" ]; then
	echo "linttools: building staticcheck $STATICCHECK_VERSION and deadcode $DEADCODE_VERSION" >&2
	rm -rf "$DIR.partial"
	mkdir -p "$DIR.partial"
	GOBIN="$DIR.partial" GOFLAGS=-mod=mod go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" >&2
	GOBIN="$DIR.partial" GOFLAGS=-mod=mod go install "golang.org/x/tools/cmd/deadcode@$DEADCODE_VERSION" >&2
	rm -rf "$DIR"
	mv "$DIR.partial" "$DIR"
fi
echo "$DIR"
