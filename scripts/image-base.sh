#!/usr/bin/env bash
# A local base image for `make image`: Debian bookworm (minbase) with python3, built from
# Debian's packages alone.  Where no container registry can be reached, the Dockerfile's
# default base (python:3.11-slim) cannot be pulled; Debian's package mirror is all we need.
#
# usage: scripts/image-base.sh CACHE_DIR IMAGE_NAME
# The root filesystem is cached as CACHE_DIR/<name>.tar, so a second build (or a second clone
# sharing the cache) skips debootstrap; the image is re-imported from it when missing.
set -euo pipefail

cache=$1
image=$2
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
buildah=(buildah --storage-driver vfs)

if "${buildah[@]}" inspect --type image "$image" >/dev/null 2>&1; then
  echo "image-base: $image is present"
  exit 0
fi

mkdir -p "$cache"
tarball="$cache/$suite-minbase-python3.tar"
if [[ ! -f $tarball ]]; then
  command -v debootstrap >/dev/null || {
    echo "image-base: installing debootstrap"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  started=$SECONDS
  echo "image-base: debootstrap $suite (minbase + python3) from $mirror"
  # python3-venv: the Dockerfile's build stage makes a venv with pip in it (ensurepip).
  debootstrap --variant=minbase --include=python3,python3-venv "$suite" "$work/rootfs" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log"; exit 1; }
  # What a base image does not need: downloaded .debs, package lists, docs, man pages,
  # translations (a container's logs are English), and the device nodes the runtime provides.
  root=$work/rootfs
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/locale/* "$root"/var/log/* "$root"/dev/*
  tar -C "$root" --numeric-owner -cf "$tarball.partial" .
  mv "$tarball.partial" "$tarball"
  echo "image-base: root filesystem cached in $tarball after $((SECONDS - started)) s"
fi

ctr=$("${buildah[@]}" from scratch)
"${buildah[@]}" add "$ctr" "$tarball" / >/dev/null
"${buildah[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 --cmd '["python3"]' \
  --label org.opencontainers.image.description="Debian $suite minbase with python3" "$ctr"
"${buildah[@]}" commit --quiet --rm "$ctr" "$image" >/dev/null
echo "image-base: $image imported from $tarball"
