#!/usr/bin/env bash
# Builds the MIG-table exporter (main.go, go-nvml from the Go module proxy) into $1/miggeometry.
#
# Built only when missing or when its inputs changed: the binary carries a stamp beside it (a
# hash of main.go, go.mod and go.sum), so a warm cache costs nothing and a go-nvml bump rebuilds.
# go-nvml's nvml package needs cgo (its dlopen bindings), though the mock tables never load a
# driver; its deprecation warnings from NVML's header are silenced.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: $0 OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
stamp="$out/.miggeometry.inputs"
inputs="$(cd "$here" && cat main.go go.mod go.sum | sha256sum | cut -d' ' -f1)"
if [[ -x "$out/miggeometry" && "$(cat "$stamp" 2>/dev/null)" == "$inputs" ]]; then
  echo "miggeometry: already built" >&2
  exit 0
fi
echo "miggeometry: building" >&2
start=$SECONDS
(cd "$here" && CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations" GOFLAGS=-buildvcs=false \
  go build -trimpath -o "$out/miggeometry.tmp" .)
mv "$out/miggeometry.tmp" "$out/miggeometry"
echo "$inputs" > "$stamp"
echo "miggeometry: built in $((SECONDS - start)) s" >&2
