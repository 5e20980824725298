#!/usr/bin/env bash
# Install what tests/deploy/test_docker_stack.py needs, from Debian's packages, only if missing:
# the Docker engine and CLI (docker.io), Compose v1 (docker-compose 1.29), debootstrap (the local
# base image, tools/docker_base_image.sh), iproute2 and iptables (the test's clean-up).
#
# Idempotent and non-interactive: safe in CI as root with no stdin, or as a user with passwordless
# sudo. The engine is not started here: the test uses a running one (the package's service on
# systemd hosts) or starts dockerd itself, and then stops it again.
set -euo pipefail

needed=(dockerd docker docker-compose debootstrap ip iptables)
missing=0
for cmd in "${needed[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing=1
done
[ "$missing" -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "install_docker.sh: Docker missing; run as root or with passwordless sudo:" >&2
    echo "  apt-get update && apt-get install -y docker.io docker-compose debootstrap iproute2 iptables" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -q </dev/null
"${as_root[@]}" apt-get install -y -q --no-install-recommends \
    docker.io docker-compose debootstrap iproute2 iptables ca-certificates </dev/null >/dev/null

for cmd in "${needed[@]}"; do
    command -v "$cmd" >/dev/null
done
