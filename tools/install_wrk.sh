#!/usr/bin/env bash
# Install wrk (Debian package `wrk`), the C load generator bench/wrk_load.py drives, only if
# missing. Benchmarks only: `make test` does not need it.
#
# Idempotent and non-interactive: safe as root with no stdin, or as a user with passwordless sudo.
set -euo pipefail

if command -v wrk >/dev/null 2>&1; then
    exit 0
fi

# shellcheck source=tools/apt_install.sh
source "$(dirname "$0")/apt_install.sh"
apt_install wrk

command -v wrk >/dev/null
