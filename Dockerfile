# syntax=docker/dockerfile:1
# gpushare operator image: wheels are built in the first stage; the final stage has the
# installed package and nothing to build with.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="gpushare-operator" \
      org.opencontainers.image.description="GPU-sharing policies to NVIDIA device-plugin configuration and live sharing state" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index /wheels/*.whl \
    && rm -rf /wheels \
    && pip uninstall --yes pip setuptools wheel
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Non-root, numeric so that runAsNonRoot can verify it; the chart also mounts the root read-only.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["python", "-m", "gpushare_operator", "run"]
