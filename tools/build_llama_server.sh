#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the sources vendored in the llama-cpp-python sdist, as the
# peer for `python -m ferry.bench.llm_peer` (issue 27). CPU only, web UI off, no curl; the server and
# llama-quantize (the bench makes its Q4_0 GGUFs with it, issue 38) only. The binaries land in
# .venv-llama/bin (git-ignored), the unpacked sdist (convert_hf_to_gguf.py) in .venv-llama/src.
# ~450 s on 2 quiet cores.
#
#   nice -n 19 tools/build_llama_server.sh            # uses .venv/bin/pip to fetch the sdist
#   LLAMA_CPP_PYTHON_VERSION=0.3.36 OUT=.venv-llama tools/build_llama_server.sh
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
OUT="${OUT:-.venv-llama}"
PIP="${PIP:-$(command -v .venv/bin/pip || echo /work/main/.venv/bin/pip)}"
JOBS="${JOBS:-2}"
mkdir -p "$OUT/src" "$OUT/bin"
OUT="$(cd "$OUT" && pwd)"
if [ -x "$OUT/bin/llama-server" ] && [ -x "$OUT/bin/llama-quantize" ]; then
    echo "already built: $OUT/bin/llama-server $OUT/bin/llama-quantize"; exit 0
fi
SDIST="$(ls "$OUT"/src/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)"
if [ -z "$SDIST" ]; then
    "$PIP" download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$OUT/src"
    SDIST="$(ls "$OUT"/src/llama_cpp_python-"$VERSION".tar.gz)"
fi
tar -xzf "$SDIST" -C "$OUT/src"
LLAMA="$OUT/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
# No AMX kernels, even where -march=native has them (Sapphire Rapids): this llama.cpp's AMX
# buffers crashed llama-server (SIGSEGV in its warmup) on SmolLM2-135M, AMX permitted by the
# kernel. Its AVX-512 VNNI repacked Q4_0 kernels stay; a decode step is bound by memory, not
# by the matrix unit.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$LLAMA" -B "$OUT/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_SERVER_WEBUI=OFF -DLLAMA_BUILD_WEBUI=OFF \
    -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX"
cmake --build "$OUT/build" --target llama-server llama-quantize -j "$JOBS"
cp "$OUT/build/bin/llama-server" "$OUT/build/bin/llama-quantize" "$OUT/bin/"
echo "built: $OUT/bin/llama-server $OUT/bin/llama-quantize"
echo "sources (convert_hf_to_gguf.py): $LLAMA"
