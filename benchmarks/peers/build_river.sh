#!/usr/bin/env bash
# Builds riverbench (River's worker and producer for `make bench-peers`) from the Go module in
# benchmarks/peers/river into a cache outside the work tree, and prints the binary's path.
# Idempotent: a binary built from the same go.mod/go.sum/main.go is reused.
set -euo pipefail
here="$(cd "$(dirname "$0")/river" && pwd)"
stamp="$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-16)"
cache="${OUTBOX_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outbox-dispatcher/riverbench-$stamp}"
if [ -x "$cache/riverbench" ]; then
	echo "$cache/riverbench"
	exit 0
fi
command -v go >/dev/null || { echo "build_river.sh: needs Go >= 1.26" >&2; exit 1; }
mkdir -p "$cache"
(cd "$here" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod -trimpath -buildvcs=false" \
	go build -o "$cache/riverbench.$$" .) >&2
mv "$cache/riverbench.$$" "$cache/riverbench"
echo "$cache/riverbench"
