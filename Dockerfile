# syntax=docker/dockerfile:1
# The three images of outbox-dispatcher, one target each, from one build of the wheel:
#
#   docker build --target operator -t outbox-dispatcher-operator:0.1.0 .
#   docker build --target enqueuer -t outbox-dispatcher-enqueuer:0.1.0 .
#   docker build --target worker   -t outbox-dispatcher-worker:0.1.0 .
#
# Build context: the repository root (see /.dockerignore). BuildKit builds the `build` stage
# once and shares it between the targets. Each image runs as UID 10001 and works with a
# read-only root filesystem (bytecode is compiled at build time; /tmp is the only scratch).
#
# Your handler image, FROM the worker image -- the handler's package goes on /app (on
# PYTHONPATH), its dependencies into the same venv (/opt/venv, first on PATH, pip kept for this):
#
#   FROM outbox-dispatcher-worker:0.1.0
#   USER root
#   COPY requirements.txt /tmp/requirements.txt
#   RUN pip install --no-cache-dir --compile -r /tmp/requirements.txt && rm /tmp/requirements.txt
#   COPY myapp/ /app/myapp/
#   RUN python -m compileall -q /app
#   USER 10001:10001
#
#   docker build -t registry.example.com/myapp-worker:1.0.0 .
#
# then point a queue of your OutboxDispatcher at it (the operator sets the arguments):
#
#   queues:
#     - name: emails
#       image: registry.example.com/myapp-worker:1.0.0
#       handler: myapp.tasks:send_email
#
# Dependencies that need a compiler: build wheels in a stage of your own and copy them in,
# so the final image carries no build tools either. Keep `USER 10001:10001` last: the
# operator's pods run as that UID with runAsNonRoot and a read-only root filesystem.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# The project as a wheel, then a venv with that wheel and its dependencies (binary wheels).
# pip stays in this venv so that handler images can install into the worker's.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dispatcher/ dispatcher/
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install --compile /wheels/outbox_dispatcher-*.whl \
 && /opt/venv/bin/pip uninstall --yes setuptools

# The same venv without pip: nothing installs into the operator and enqueuer images.
FROM build AS build-sealed
RUN /opt/venv/bin/python -m pip uninstall --yes pip

# What every image shares: the unprivileged user and the environment.
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --gid 10001 dispatcher \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin dispatcher
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

FROM runtime AS operator
LABEL org.opencontainers.image.title="outbox-dispatcher-operator" \
      org.opencontainers.image.description="kopf operator for OutboxDispatcher resources" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build-sealed /opt/venv /opt/venv
USER 10001:10001
# /healthz, /readyz and /metrics on one port when METRICS_PORT=9090 (what the manifests set)
EXPOSE 9090
ENTRYPOINT ["dispatcher", "operator"]

FROM runtime AS enqueuer
LABEL org.opencontainers.image.title="outbox-dispatcher-enqueuer" \
      org.opencontainers.image.description="PostgreSQL outbox to sharded Redis Streams enqueuer" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build-sealed /opt/venv /opt/venv
USER 10001:10001
# /metrics, /healthz, /readyz when METRICS_PORT=9090 (what the operator sets)
EXPOSE 9090
ENTRYPOINT ["dispatcher", "enqueuer"]

# Last, so a plain `docker build .` gives the worker, the image handler images start from.
FROM runtime AS worker
LABEL org.opencontainers.image.title="outbox-dispatcher-worker" \
      org.opencontainers.image.description="outbox-dispatcher worker runtime; base image for handler images" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
ENV PYTHONPATH=/app \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
USER 10001:10001
# /metrics, /healthz, /readyz when METRICS_PORT=9090 (what the operator sets)
EXPOSE 9090
ENTRYPOINT ["dispatcher", "worker"]
