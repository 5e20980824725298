# Sourced by the tools/install_*.sh scripts: `apt_install PACKAGE...` installs Debian packages,
# without recommends and without a prompt, as root or through passwordless sudo; otherwise it
# names the command to run and exits 1. The index is refreshed only when a first try fails, so
# a host whose lists are fresh installs offline from its cache.
apt_install() {
    local as_root=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            as_root=(sudo -n)
        else
            echo "$(basename "$0"): run as root or with passwordless sudo, or first:" >&2
            echo "  apt-get update && apt-get install -y --no-install-recommends $*" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${as_root[@]}" apt-get install -y -q --no-install-recommends "$@" </dev/null >/dev/null \
        || { "${as_root[@]}" apt-get update -q </dev/null >/dev/null
             "${as_root[@]}" apt-get install -y -q --no-install-recommends "$@" </dev/null >/dev/null; }
}

# Runs a command as root (the caller has passed apt_install's check).
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}
