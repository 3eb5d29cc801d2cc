# Service image: serves the artifact in $MODEL_DIR on port 8000.
# Build: docker build -t besvm .   (offline machines: --build-arg BASE_IMAGE=<local image>)
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/var/cache/besvm/numba \
    MODEL_DIR=/models/current \
    HOST=0.0.0.0 \
    PORT=8000

WORKDIR /app

# A CA bundle for pip behind a TLS-inspecting proxy can be put in the build context as
# .build-ca.crt (it is optional: the glob matches nothing when it is absent).
COPY pyproject.toml README.md .build-ca.cr[t] ./
COPY service ./service
COPY training ./training
RUN if [ -f .build-ca.crt ]; then export PIP_CERT=/app/.build-ca.crt; fi \
    && python -m pip install --no-cache-dir . \
    && rm -f .build-ca.crt \
    && groupadd --system --gid 10001 besvm \
    && useradd --system --uid 10001 --gid besvm --home-dir /app --shell /usr/sbin/nologin besvm \
    && mkdir -p /models /var/cache/besvm/numba \
    && chown -R besvm:besvm /models /var/cache/besvm

# numeric ids, so that runtimes can check runAsNonRoot without an /etc/passwd lookup
USER 10001:10001
# Compile the numba kernels into the image's cache so the server does not compile on start.
RUN python -m service.model.warmup

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('PORT', '8000')}/readyz\", timeout=2)"]

CMD ["python", "-m", "service.api"]
