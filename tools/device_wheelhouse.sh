#!/usr/bin/env bash
# Build, on this box, the wheels that tools/device_check.sh installs on a lent GPU host.
#
# The device reaches no registry and each call carries at most 64 MiB (the working tree
# included), so the wheels are cut into folders of at most PART_MIB each, carried one call
# apiece (a warm device keeps what earlier calls carried; the working tree itself is ~18 MiB):
#   build/device/wheels-N/      Ferry's runtime and test dependencies, CPython 3.12, manylinux,
#                               without torch (the device image has CUDA torch for 3.12)
#   build/device/ort-gpu/part-XX onnxruntime-gpu's wheel (~245 MiB) cut with `split`, with
#                               its sha256, joined and checked there; only with ORT_GPU=1
#   build/device/requirements.txt what device_check.sh installs from them
# It prints the carry list of each call.
#
#   tools/device_wheelhouse.sh            # ORT_GPU=1 tools/device_wheelhouse.sh to add ORT's
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=build/device
PART_MIB=${PART_MIB:-40}
PYVER=${PYVER:-3.12}
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
# Ferry's own dependencies (pyproject.toml) and what the GPU tests and bench.gpu import beside
# them; torch is the image's, the CPU onnxruntime the ORT lanes' stand-in where ORT_GPU is off
# (they are then refused on the GPU and bench.gpu reports them failed, naming why).
REQUIREMENTS=(
    "fastapi>=0.115" "uvicorn>=0.30" "uvloop>=0.19" "httptools>=0.6" "pydantic>=2.7"
    "numpy>=1.26" "tokenizers>=0.21" "prometheus-client>=0.20" "httpx>=0.27" "pyyaml>=6.0"
    "jinja2>=3.1" "orjson>=3.10" "llguidance>=1.0" "nvidia-ml-py>=12.535" "pyzmq>=26"
    "msgspec>=0.18" "pillow>=10" "typing-extensions>=4.10" "tqdm>=4.66"
    "onnxruntime>=1.31" "transformers>=4.56" "onnx>=1.16" "onnx-ir>=1.0" "onnxscript"
    "pytest>=8" "pytest-timeout" "pytest-xdist" "pytest-asyncio" "aiohttp>=3.9"
)

rm -rf "$OUT" && mkdir -p "$OUT/all"
python3 -m pip download -q --only-binary=:all: --python-version "$PYVER" \
    "${PLATFORMS[@]/#/--platform=}" --platform=any -d "$OUT/all" "${REQUIREMENTS[@]}" 2>&1 \
    | grep -v "^WARNING: Location" || true
# torch and its CUDA wheels come with the image; a transitive pin of them must not be carried.
rm -f "$OUT"/all/torch-* "$OUT"/all/triton-*
find "$OUT/all" -name 'nvidia_*' ! -name 'nvidia_ml_py-*' -delete
printf '%s\n' "${REQUIREMENTS[@]}" >"$OUT/requirements.txt"

# Largest first into the first folder with room: few folders, each under PART_MIB.
part=1 used=0
limit=$((PART_MIB * 1024 * 1024))
declare -A room
while read -r size wheel; do
    placed=""
    for ((n = 1; n <= part; n++)); do
        if ((${room[$n]:-0} + size <= limit)); then placed=$n && break; fi
    done
    if [ -z "$placed" ]; then part=$((part + 1)) && placed=$part; fi
    mkdir -p "$OUT/wheels-$placed"
    mv "$OUT/all/$wheel" "$OUT/wheels-$placed/"
    room[$placed]=$((${room[$placed]:-0} + size))
    used=$((used + size))
done < <(cd "$OUT/all" && stat -c '%s %n' -- * | sort -rn)
rmdir "$OUT/all"

if [ "${ORT_GPU:-0}" = 1 ]; then
    mkdir -p "$OUT/ort-gpu"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
        "${PLATFORMS[@]/#/--platform=}" -d "$OUT/ort-gpu" "onnxruntime-gpu>=1.31,<1.32" 2>&1 \
        | grep -v "^WARNING: Location" || true
    wheel=$(cd "$OUT/ort-gpu" && ls onnxruntime_gpu-*.whl)
    (cd "$OUT/ort-gpu" && sha256sum "$wheel" >SHA256SUMS && split -b "${PART_MIB}M" -d "$wheel" "part-" \
        && rm "$wheel")
fi

echo "wheels: $((used / 1024 / 1024)) MiB in $part folder(s) of <= $PART_MIB MiB; carry one per call:"
for dir in "$OUT"/wheels-*; do echo "  carry [\"$dir\"]"; done
if [ -d "$OUT/ort-gpu" ]; then
    for piece in "$OUT"/ort-gpu/part-*; do echo "  carry [\"$piece\"]"; done
    echo "  carry [\"$OUT/ort-gpu/SHA256SUMS\", \"$OUT/requirements.txt\"] with the last"
fi
