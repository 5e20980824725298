#!/usr/bin/env bash
# Install `prometheus` and `promtool` (Debian package `prometheus`) and `docker-compose` (to check
# the compose file without an engine) for tests/deploy, only if missing.
#
# Idempotent and non-interactive: safe in CI as root with no stdin, or as a user with
# passwordless sudo. The package's own service is stopped again: the tests start their own
# Prometheus on loopback with a temporary data dir.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 \
    && command -v docker-compose >/dev/null 2>&1; then
    exit 0
fi

# shellcheck source=tools/apt_install.sh
source "$(dirname "$0")/apt_install.sh"
# No recommends: they would add node-exporter and its service.
apt_install prometheus docker-compose

# The package may have started its service (on hosts with an init system); the tests don't want it.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    as_root systemctl disable --now prometheus >/dev/null 2>&1 || true
elif [ -x /etc/init.d/prometheus ]; then
    as_root /etc/init.d/prometheus stop >/dev/null 2>&1 || true
fi

command -v prometheus >/dev/null && command -v promtool >/dev/null \
    && command -v docker-compose >/dev/null
