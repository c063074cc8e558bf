# Phalanx operator image.  Build from the repository root:
#   docker build -t phalanx-operator:dev .
# Two stages: the first resolves and installs the operator with its exact pins into a virtualenv,
# the second copies only that virtualenv onto a clean base (no pip cache, no build tools, no tests).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY requirements-dev.txt ./
COPY operator/ ./operator/
# requirements-dev.txt serves as a constraints file: it pins the operator's runtime dependencies
# to the versions the tests ran with, without installing the development tools it also lists.
# The development cluster, development node and demo (phalanx.devcluster, phalanx.devnode,
# phalanx.demo) are tools for a developer's machine: the production image does not ship them.
RUN python -m venv /opt/phalanx \
    && /opt/phalanx/bin/pip install --no-cache-dir --constraint requirements-dev.txt ./operator \
    && rm -r /opt/phalanx/lib/python3.11/site-packages/phalanx/devcluster \
             /opt/phalanx/lib/python3.11/site-packages/phalanx/devnode \
             /opt/phalanx/lib/python3.11/site-packages/phalanx/demo.py

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="phalanx-operator" \
      org.opencontainers.image.description="Phalanx TrainingJob operator (kopf)" \
      org.opencontainers.image.source="https://github.com/phalanx-dev/phalanx" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/phalanx/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/phalanx /opt/phalanx
# The chart runs with a read-only root filesystem; nothing here writes outside /tmp.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["phalanx", "operator"]
