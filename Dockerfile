# thinktrans: the sidecar as a container image (see docs/deploy.md).
#
#   docker build -t thinktrans .                                                   # CPU torch
#   docker build -t thinktrans:cuda --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124 .
#   docker run -p 8088:8088 -v thinktrans-models:/models thinktrans
#
# Build arguments (all optional):
#   TORCH_INDEX_URL  where torch comes from: the PyTorch CPU index by default; a CUDA index
#                    (.../whl/cu124) for GPU hosts; empty: the package index (PIP_INDEX_URL or
#                    PyPI) plus PIP_FIND_LINKS, for offline builds.
#   TORCH_VERSION    pin torch, e.g. 2.13.0 (default: the newest the index has).
#   EXTRAS           the package extras to install (default: local,ct2,deepl).
#   PIP_CERT         a CA bundle for pip (TLS-inspecting proxies), a path inside the build:
#                    a mounted file (podman/buildah -v), or the build secret pip_cert:
#                    --secret id=pip_cert,src=ca.pem --build-arg PIP_CERT=/run/secrets/pip_cert
#   PIP_INDEX_URL    a PyPI mirror.
#   PIP_FIND_LINKS   a directory (mounted into the build) or URL of wheels, e.g. torch's.

ARG BASE_IMAGE=debian:bookworm-slim

# -- build: a virtual environment in /opt/thinktrans ----------------------------------------
FROM ${BASE_IMAGE} AS build

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/thinktrans
ENV PATH=/opt/thinktrans/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_DEFAULT_TIMEOUT=120

ARG PIP_CERT
ARG PIP_INDEX_URL
ARG PIP_FIND_LINKS

# torch first and on its own: the largest layer, and the one that changes least.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION
RUN --mount=type=secret,id=pip_cert \
    pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
        "torch${TORCH_VERSION:+==$TORCH_VERSION}"

# The dependencies, from pyproject.toml alone (empty packages stand in for the code), so that
# a change to the code does not reinstall them.
ARG EXTRAS=local,ct2,deepl
WORKDIR /src
COPY pyproject.toml README.md ./
RUN --mount=type=secret,id=pip_cert \
    mkdir service models pool && touch service/__init__.py models/__init__.py pool/__init__.py \
    && pip install ".[${EXTRAS}]" \
    && pip uninstall -y thinktrans \
    && rm -rf service models pool build ./*.egg-info

COPY service ./service
COPY models ./models
COPY pool ./pool
RUN --mount=type=secret,id=pip_cert \
    pip install --no-deps . \
    && cd / && python -c "import torch, service.http.app; print('torch', torch.__version__)"

# -- runtime: Debian's Python, the venv, a non-root user -------------------------------------
FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.title="thinktrans" \
      org.opencontainers.image.description="Translates an agent's streamed thinking into the user's language" \
      org.opencontainers.image.licenses="Apache-2.0"

# Python only (no pip, no compilers); ca-certificates for DeepL, LLM endpoints and the Hub.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 ca-certificates \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --create-home --home-dir /home/thinktrans \
        --shell /usr/sbin/nologin thinktrans \
    && mkdir -p /models \
    && chown 10001:10001 /models

COPY --from=build /opt/thinktrans /opt/thinktrans

# HF_HOME=/models: hub downloads land on the volume, survive restarts, and can be pre-seeded
# for sites without network (then set HF_HUB_OFFLINE=1).
ENV PATH=/opt/thinktrans/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/models \
    THINKTRANS_HOST=0.0.0.0 \
    THINKTRANS_PORT=8088

VOLUME /models
WORKDIR /home/thinktrans
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
EXPOSE 8088

# Liveness only: /healthz answers while a model still loads; /readyz says when it has.
# It asks where the server really listens: `thinktrans serve` records its bound address
# (after --port, --config, THINKTRANS_PORT) in ~/.cache/thinktrans/serve.json; without that
# file, THINKTRANS_PORT. Standard library only, so it starts fast.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python3", "-m", "service.tools.healthcheck"]

ENTRYPOINT ["thinktrans"]
CMD ["serve"]
