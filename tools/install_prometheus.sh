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

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "install_prometheus.sh: prometheus/promtool missing; run as root or with passwordless sudo:" >&2
    echo "  apt-get update && apt-get install -y --no-install-recommends prometheus" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -q </dev/null
# No recommends: they would add node-exporter and its service.
"${as_root[@]}" apt-get install -y -q --no-install-recommends prometheus docker-compose </dev/null

# The package may have started its service (on hosts with an init system); the tests don't want it.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    "${as_root[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
elif [ -x /etc/init.d/prometheus ]; then
    "${as_root[@]}" /etc/init.d/prometheus stop >/dev/null 2>&1 || true
fi

command -v prometheus >/dev/null && command -v promtool >/dev/null \
    && command -v docker-compose >/dev/null
