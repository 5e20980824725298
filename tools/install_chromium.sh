#!/usr/bin/env bash
# Install headless Chromium (Debian package `chromium`) for tests/server/test_console_browser.py,
# only if missing. Playwright drives it through `executable_path`: no browser download.
#
# Idempotent and non-interactive: safe in CI as root with no stdin, or as a user with
# passwordless sudo.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi

# shellcheck source=tools/apt_install.sh
source "$(dirname "$0")/apt_install.sh"
# No recommends: chromium-sandbox, fonts and desktop integration are not needed headless.
apt_install chromium

command -v chromium >/dev/null
