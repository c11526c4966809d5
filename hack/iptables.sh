#!/usr/bin/env bash
# Prints the path of iptables, installing Debian's iptables package if it
# is missing: the fault-injection suite (test/faults) drops a replica's
# packets with it inside its own network namespace.
set -euo pipefail

log() { echo "iptables: $*" >&2; }

if ! p="$(command -v iptables)"; then
	log "installing Debian iptables"
	sudo=""
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null 2>&1 || { log "iptables is missing and this user cannot install it (not root, no sudo)"; exit 1; }
		sudo=sudo
	fi
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables >&2 ||
		{ $sudo apt-get update -q >&2 && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables >&2; }
	p="$(command -v iptables)"
fi
echo "$p"
