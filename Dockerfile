# syntax=docker/dockerfile:1
# gpushare operator image.  The build stage installs the package and its runtime dependencies
# into a virtual environment; the final stage is the base image plus that environment: no pip,
# no compiler, no source tree.
#
# Any base with python3 (3.11 or newer) and its venv module works.  The default is the public
# python image; `make image` passes a Debian bookworm base it builds from Debian's packages,
# for machines that reach no container registry:
#   buildah bud --build-arg BASE_IMAGE=localhost/gpushare-base:bookworm-python3 -t gpushare-operator .
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
# A package index mirror, or the CA bundle of a TLS-inspecting proxy (a path inside the build,
# e.g. a --volume): pip reads both from the environment.  Unset, pip uses PyPI as usual.
ARG PIP_INDEX_URL
ARG PIP_CERT
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python3 -m venv /opt/gpushare \
    && /opt/gpushare/bin/pip install --no-cache-dir --disable-pip-version-check . \
    && /opt/gpushare/bin/pip uninstall --yes --quiet pip setuptools \
    && /opt/gpushare/bin/python -c "import gpushare_operator, cryptography, kopf"

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="gpushare-operator" \
      org.opencontainers.image.description="GPU-sharing policies to NVIDIA device-plugin configuration and live sharing state" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/gpushare /opt/gpushare
# The chart mounts the root filesystem read-only: no bytecode is written at run time (pip
# compiled it at install), and logs leave unbuffered.
ENV PATH=/opt/gpushare/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Non-root, numeric so that runAsNonRoot can verify it.
USER 65532:65532
# 8080: /healthz and /readyz (plain HTTP); 8443: /metrics (HTTPS, TokenReview-guarded);
# 9443: the memory-request webhook (HTTPS, its certificate from the Secret the leader keeps).
EXPOSE 8080 8443 9443
ENTRYPOINT ["python", "-m", "gpushare_operator", "run"]
