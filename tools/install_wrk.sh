#!/usr/bin/env bash
# Install wrk (Debian package `wrk`), the C load generator of bench/wrk_load.py, only if missing.
# Benchmarks only: `make test` does not need it. Non-interactive (tools/apt_install.sh).
set -euo pipefail
if ! command -v wrk >/dev/null 2>&1; then
    # shellcheck source=tools/apt_install.sh
    source "$(dirname "$0")/apt_install.sh"
    apt_install wrk
fi
command -v wrk >/dev/null
