#!/usr/bin/env bash
# make lint's static checks beyond gofmt and vet:
#   staticcheck ./...                  every default check;
#   deadcode -test ./...               code that nothing reaches, tests included;
#   deadcode over the commands         code of the shipped packages that only
#                                      tests reach (unexport it, or move it to
#                                      an export_test.go);
#   hack/funclen                       functions of the product's code over
#                                      100 lines.
# A finding fails the run unless a line of hack/lint-exceptions.txt (an
# extended regexp over "tool: finding", with its reason in the comment above
# it) matches it; an exception that matches nothing fails the run too, so the
# list never outlives its reasons.
set -euo pipefail
cd "$(dirname "$0")/.."

tools="$(hack/linttools.sh)"
exceptions=hack/lint-exceptions.txt
found="$(mktemp)"
trap 'rm -f "$found" "$found.rx"' EXIT

{
	"$tools/staticcheck" ./... | sed 's/^/staticcheck: /' || true
	"$tools/deadcode" -test ./... | sed 's/^/deadcode -test: /'
	# Roots: every main package; findings: the packages the image ships.
	"$tools/deadcode" -filter 'infergate/infergate/(extproc|inference|gateways|internal|sim)($|/)' \
		$(go list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' ./...) | sed 's/^/deadcode: /'
	go run ./hack/funclen -max 100 cmd conformance extproc gateways inference internal sim wasm/payload | sed 's/^/funclen: /'
} >"$found"

grep -Ev '^[[:space:]]*(#|$)' "$exceptions" >"$found.rx" || true
status=0
if unexcused="$(grep -Evf "$found.rx" "$found")"; then
	echo "$unexcused"
	echo "lint: $(echo "$unexcused" | wc -l) finding(s) above; fix them, or add an exception with its reason to $exceptions" >&2
	status=1
fi
while IFS= read -r rx; do
	if ! grep -Eq -- "$rx" "$found"; then
		echo "lint: the exception '$rx' in $exceptions matches no finding; remove it" >&2
		status=1
	fi
done <"$found.rx"
exit $status
