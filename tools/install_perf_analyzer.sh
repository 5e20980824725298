#!/usr/bin/env bash
# Install Triton's perf_analyzer under .perf_analyzer/ for tests/server/test_perf_analyzer.py,
# only if missing.
#
# The perf-analyzer wheel needs glibc 2.38 (Debian 12 has 2.36); the binary inside the
# tritonclient 2.50 wheel runs here with two shared libraries: libb64 (Debian's libb64-0d) and
# libcudart.so.12 (the nvidia-cuda-runtime-cu12 wheel; it loads without a GPU).
set -euo pipefail

DEST=${PERF_ANALYZER_DIR:-.perf_analyzer}
PY=${PY:-.venv/bin/python}
BIN="$DEST/perf_analyzer"

if [ -x "$BIN" ] && LD_LIBRARY_PATH="$DEST/lib" "$BIN" --version >/dev/null 2>&1; then
    exit 0
fi

if ! ldconfig -p | grep -q libb64.so.0d; then
    # shellcheck source=tools/apt_install.sh
    source "$(dirname "$0")/apt_install.sh"
    apt_install libb64-0d
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
    -d "$tmp" tritonclient==2.50.0
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" nvidia-cuda-runtime-cu12==12.9.79
mkdir -p "$DEST/lib"
"$PY" - "$tmp" "$DEST" <<'PYEOF'
import sys, zipfile, pathlib
tmp, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wanted = {
    "tritonclient-2.50.0.data/data/bin/perf_analyzer": dest / "perf_analyzer",
    "nvidia/cuda_runtime/lib/libcudart.so.12": dest / "lib" / "libcudart.so.12",
}
for wheel in tmp.glob("*.whl"):
    with zipfile.ZipFile(wheel) as archive:
        for name in set(archive.namelist()) & set(wanted):
            wanted[name].write_bytes(archive.read(name))
PYEOF
chmod +x "$BIN"
LD_LIBRARY_PATH="$DEST/lib" "$BIN" --version >/dev/null
