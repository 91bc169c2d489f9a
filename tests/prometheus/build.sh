#!/usr/bin/env bash
# Builds prometheus and promtool from the Go module proxy (this directory's go.mod pins the
# version) into $1/bin, for the alert-rule tests (`promtool check rules`, `promtool test rules`,
# `promtool check metrics`) and the integration test that runs a real Prometheus.
#
# Like tests/controlplane/build.sh: each binary is built only when missing or stamped with
# another version (a .NAME.version file beside it), static and trimmed, with the version stamped
# in.  The tags cut the build: remove_all_sd leaves only the file and HTTP service discoveries in
# the server (the tests give Prometheus static targets), and without builtinassets the web UI is
# absent while the HTTP API, all the tests use, is there.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: $0 OUTDIR PROMETHEUS_MODULE_VERSION}"
version="${2:?}"
mkdir -p "$out/bin"
out="$(cd "$out" && pwd)"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

pinned="$(cd "$here" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
if [[ "$pinned" != "$version" ]]; then
  echo "prometheus: tests/prometheus/go.mod pins $pinned, versions.mk says $version" >&2
  exit 1
fi
# The module's v0.3MM.P is Prometheus 3.MM.P.
release="${version#v0.3}"; release="3.$((10#${release%%.*})).${release#*.}"
now="$(date -u +%Y%m%d-%H:%M:%S)"
ldflags="-X github.com/prometheus/common/version.Version=${release}"
ldflags+=" -X github.com/prometheus/common/version.Revision=${version}"
ldflags+=" -X github.com/prometheus/common/version.Branch=module"
ldflags+=" -X github.com/prometheus/common/version.BuildUser=gpushare"
ldflags+=" -X github.com/prometheus/common/version.BuildDate=${now}"

build() {  # build NAME PACKAGE
  local name="$1" pkg="$2"
  local stamp="$out/bin/.$name.version"
  if [[ -x "$out/bin/$name" && "$(cat "$stamp" 2>/dev/null)" == "$version" ]]; then
    echo "prometheus: $name $version already built"
    return
  fi
  echo "prometheus: building $name ($pkg)"
  local start=$SECONDS
  (cd "$here" && go build -trimpath -tags remove_all_sd,netgo -ldflags "-s -w $ldflags" \
    -o "$out/bin/$name.tmp" "$pkg")
  mv "$out/bin/$name.tmp" "$out/bin/$name"
  echo "$version" > "$stamp"
  echo "prometheus: built $name in $((SECONDS - start)) s"
}

build promtool github.com/prometheus/prometheus/cmd/promtool
build prometheus github.com/prometheus/prometheus/cmd/prometheus
