#!/usr/bin/env bash
# Build the local base image `ferry-base:bookworm` (Debian 12 minbase + Python 3.11 + venv +
# ca-certificates) from Debian's packages with debootstrap, and `docker import` it. The tests build
# every image FROM it, so they never pull from a registry. Debian 12's python3 is 3.11, the
# version python:3.11-slim-bookworm (the Dockerfile's default base) carries.
#
# Cached in Docker's own image store: a no-op when the image with this script's version label is
# there. Needs root (debootstrap) and a running Docker engine. Prints the image's tag.
#   DEBIAN_MIRROR   the mirror debootstrap reads (default http://deb.debian.org/debian)
set -euo pipefail

TAG="${FERRY_BASE_IMAGE:-ferry-base:bookworm}"
VERSION=1  # bump when the package list below changes: the cached image is rebuilt
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

have="$(docker image inspect -f '{{index .Config.Labels "ferry.base.version"}}' "$TAG" 2>/dev/null || true)"
if [ "$have" = "$VERSION" ]; then
    echo "$TAG"
    exit 0
fi

command -v debootstrap >/dev/null || { echo "docker_base_image.sh: debootstrap missing (tools/install_docker.sh)" >&2; exit 1; }
rootfs="$(mktemp -d /tmp/ferry-base.XXXXXX)"
trap 'rm -rf --one-file-system "$rootfs"' EXIT

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$MIRROR" </dev/null >&2
# What an image does not need: package lists and caches, docs, man pages.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
       "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/tmp/*

tar --numeric-owner -C "$rootfs" -c . | docker import \
    -c "LABEL ferry.base.version=$VERSION" \
    -c 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["/bin/bash"]' \
    - "$TAG" >/dev/null
echo "$TAG"
