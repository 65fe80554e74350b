# syntax=docker/dockerfile:1
# The triage image: the CronJob in cronjob.yaml runs `triage feedback ...` in it.
#   docker build -t registry.example.com/kubeflow/triage:0.1.0 .
# Needs BuildKit (the default builder since Docker 23) for the bind mount in the final stage.
# Pin the base by digest in your build (PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...) for
# reproducible images; the default below is a tag.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- builder: the project's wheel and the wheels of its dependencies
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# only what the wheel is built from (hatchling: pyproject.toml, README.md, triage/, prompts/
# force-included as triage/prompts); .dockerignore keeps caches and local stores out
COPY pyproject.toml README.md ./
COPY triage ./triage
COPY prompts ./prompts
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m pip wheel --wheel-dir /wheels /wheels/feedback_triage-*.whl

# ---- final: the installed wheels on a slim base; no compilers, no sources, no pip
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# ca-certificates: the HTTPS clients (Langfuse, OpenAI, the MCP server) verify against the OS trust store
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# the wheels come in through a bind mount, so they never become a layer of the image
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links=/wheels feedback-triage \
 && python -m pip uninstall -y pip setuptools wheel
# numeric user, so the kubelet can verify runAsNonRoot; the same id as runAsUser in cronjob.yaml
RUN groupadd --system --gid 10001 triage \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin triage
USER 10001:10001
WORKDIR /tmp
# build check, as the runtime user: the console script runs, and the clients it loads lazily import
RUN triage --help \
 && python -c "import mcp, openai, triage.cli, triage.sources.langfuse.backend"
ENTRYPOINT ["triage"]
CMD ["--help"]
