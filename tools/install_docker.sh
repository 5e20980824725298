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

# shellcheck source=tools/apt_install.sh
source "$(dirname "$0")/apt_install.sh"
apt_install docker.io docker-compose debootstrap iproute2 iptables ca-certificates

for cmd in "${needed[@]}"; do
    command -v "$cmd" >/dev/null
done
