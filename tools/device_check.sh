#!/usr/bin/env bash
# On a lent GPU host (the device tool): the GPU tests and bench.gpu, in under 8 minutes, from the
# wheels tools/device_wheelhouse.sh built here and earlier calls carried (build/device/).
#
# The host reaches no registry; its image has CUDA torch for Python 3.12, which the venv sees
# (--system-site-packages). Every figure and log goes to $OUT (the device tool brings it back):
#   install.txt      what was installed, and whether ONNX Runtime's CUDA EP can run
#   test-gpu.txt     pytest -m gpu: the torch backend on CUDA, the GPU metrics, ORT's CUDA EP when
#                    onnxruntime-gpu came (its parts joined and checked); vLLM and TensorRT are
#                    not carried (GBs of wheels) and their tests skip, saying so
#   bench-gpu.txt    python -m ferry.bench.gpu: Ferry (torch, ORT) vs its in-process ceiling,
#                    the unbatched server and the null backend, 64 and 256 clients
# Each step has its own time bound, so one that hangs still leaves the others' figures.
#
#   tools/device_check.sh        (run by the device tool in the repository root)
set -uo pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-build/device/out}
DEVICE=build/device
VENV=${VENV:-.venv-device}
PYTHON=${PYTHON:-python3.12}
mkdir -p "$OUT"
began=$(date +%s)
say() { echo "[$(($(date +%s) - began))s] $*" | tee -a "$OUT/install.txt"; }

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || say "nvidia-smi failed: no GPU visible"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV" || { say "no $PYTHON"; exit 2; }
fi
links=()
for dir in "$DEVICE"/wheels-*; do links+=(--find-links "$dir"); done
pip=("$VENV/bin/python" -m pip install -q --no-index "${links[@]}")
"${pip[@]}" -r "$DEVICE/requirements.txt" >>"$OUT/install.txt" 2>&1 || { say "install failed"; exit 2; }
# Ferry itself from the checkout: ferry/ links to the package folders (no build step to carry).
export PYTHONPATH=$PWD

# onnxruntime-gpu: carried in parts (each under a call's 64 MiB), joined and checked here.
ort_gpu=no
if [ -f "$DEVICE/ort-gpu/SHA256SUMS" ]; then
    wheel=$(cut -d' ' -f3 "$DEVICE/ort-gpu/SHA256SUMS")
    cat "$DEVICE"/ort-gpu/part-* >"$DEVICE/ort-gpu/$wheel"
    if (cd "$DEVICE/ort-gpu" && sha256sum -c --quiet SHA256SUMS); then
        "$VENV/bin/python" -m pip uninstall -q -y onnxruntime >>"$OUT/install.txt" 2>&1
        "$VENV/bin/python" -m pip install -q --no-deps --no-index "$DEVICE/ort-gpu/$wheel" \
            >>"$OUT/install.txt" 2>&1
        # Its CUDA 13 and cuDNN 9 libraries must come from the image (torch's nvidia-* wheels):
        # the check names what disagrees, and the ORT lanes then fail at start, saying so.
        "$VENV/bin/python" tools/check_cuda_wheels.py >>"$OUT/install.txt" 2>&1 && ort_gpu=yes
    else
        say "onnxruntime-gpu parts incomplete or corrupt: carry every part-XX"
    fi
fi
"$VENV/bin/python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')" >>"$OUT/install.txt" 2>&1
say "installed; onnxruntime CUDA EP usable: $ort_gpu"

timeout 150 "$VENV/bin/python" -m pytest -q -m gpu -p no:cacheprovider \
    tests/backends/test_torch_backend_gpu.py tests/backends/test_onnxruntime_gpu.py \
    tests/server/test_gpu_metrics.py >"$OUT/test-gpu.txt" 2>&1
say "pytest -m gpu: exit $? ($(tail -1 "$OUT/test-gpu.txt"))"

timeout 300 "$VENV/bin/python" -m ferry.bench.gpu --seconds 4 --warmup 1 --random-weights \
    >"$OUT/bench-gpu.txt" 2>&1
say "bench.gpu: exit $?"
tail -40 "$OUT/bench-gpu.txt"
