# Service image: serves the model repository $MODEL_REPOSITORY (one model: set MODEL_DIR and
# MODEL_REPOSITORY=) on port 8000.
# Build: docker build -t besvm .   (offline machines: --build-arg BASE_IMAGE=<local image>)
# Dependencies come only from requirements-service.lock (exact, hash-checked pins: `make lock`);
# the project itself is then installed without resolving or fetching anything.
ARG BASE_IMAGE=python:3.11-slim

# The locked dependencies are installed in a stage of their own, into a virtual environment that
# the image copies: the optional .build-ca.crt (a CA bundle for pip behind a TLS-inspecting proxy;
# the glob matches nothing when it is absent) stays in this stage and in no layer of the image.
FROM ${BASE_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements-build.lock requirements-service.lock .build-ca.cr[t] /tmp/requirements/
RUN if [ -f /tmp/requirements/.build-ca.crt ]; then export PIP_CERT=/tmp/requirements/.build-ca.crt; fi \
    && python -m venv /opt/besvm \
    && /opt/besvm/bin/python -m pip install --no-cache-dir --require-hashes -r /tmp/requirements/requirements-build.lock \
    && /opt/besvm/bin/python -m pip install --no-cache-dir --require-hashes -r /tmp/requirements/requirements-service.lock

FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/var/cache/besvm/numba \
    MODEL_REPOSITORY=/models \
    PATH=/opt/besvm/bin:$PATH \
    HOST=0.0.0.0 \
    PORT=8000

WORKDIR /app

# The locked dependencies first, in a layer of their own that source changes do not rebuild.
COPY --from=deps /opt/besvm /opt/besvm
COPY requirements-build.lock requirements-service.lock ./

COPY pyproject.toml README.md ./
COPY service ./service
COPY training ./training
RUN python -m pip install --no-cache-dir --no-index --no-deps --no-build-isolation . \
    && python -m pip check \
    && rm -rf build ./*.egg-info \
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
