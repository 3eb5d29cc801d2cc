# The service image: serves the model repository $MODEL_REPOSITORY (/models) on port 8000 (and
# gRPC on 8081 with GRPC_PORT=8081); the
# same image runs the trainer (`python -m training ...`). docker-compose.yml builds and runs it.
#   BASE_IMAGE=besvm-base:bookworm docker compose build     (network and CA secret: docker-compose.yml)
# or, where the docker CLI has buildx (BuildKit is needed for the secret):
#   docker build --network host --secret id=build_ca,src=/etc/ssl/certs/ca-certificates.crt \
#       --build-arg BASE_IMAGE=besvm-base:bookworm -t besvm .
# Offline machines build BASE_IMAGE with docker/build-base-image.sh: docs/operating/deploy.md.
ARG BASE_IMAGE=python:3.11-slim

# Stage 1: a virtual environment with the locked dependencies (requirements-service.lock: exact,
# hash-checked pins, wheels only, so nothing is compiled) and the project itself (--no-deps: it
# resolves and fetches nothing), then everything serving does not read is cut from it. This stage
# and its build/, *.egg-info, pip and the CA bundle stay behind: the image copies the venv only.
FROM ${BASE_IMAGE} AS build
# The lock the venv is installed from: the service's, or requirements-cluster.lock for the
# image of the compose profile `cluster` (the same pins, and Dask's scheduler and workers).
ARG LOCK=requirements-service.lock
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY requirements-build.lock requirements-service.lock requirements-cluster.lock ./
# build_ca: a CA bundle for pip (behind a TLS-inspecting proxy, or on a base without one), a build
# secret: mounted for this RUN only, written to no layer. Optional: without it pip uses its own.
RUN --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca; fi \
    && python3 -m venv /opt/besvm \
    && /opt/besvm/bin/python -m pip install --quiet --require-hashes --only-binary=:all: -r requirements-build.lock \
    && /opt/besvm/bin/python -m pip install --quiet --require-hashes --only-binary=:all: -r "$LOCK"
COPY pyproject.toml README.md ./
COPY service ./service
COPY training ./training
# Then cut what serving never reads: pip, setuptools and wheel, the packages' test suites and
# their compiled bytecode, C headers and Cython sources, and the CA bundles of grpcio and certifi
# (for client channels and requests: the server opens none but the OTLP exporter's, and the image
# trusts no CA; an HTTPS collector's CA is mounted, OTEL_EXPORTER_OTLP_CERTIFICATE names it). (The dependencies' bytecode is kept: a
# read-only container could not write it, and would compile every module on each start.)
RUN /opt/besvm/bin/python -m pip install --quiet --no-index --no-deps --no-build-isolation . \
    && /opt/besvm/bin/python -m pip check \
    && /opt/besvm/bin/python -m pip uninstall --quiet --yes setuptools wheel \
    && /opt/besvm/bin/python -m pip uninstall --quiet --yes pip \
    && find /opt/besvm/lib -depth -type d \( -name tests -o -name include \) -exec rm -rf {} + \
    && find /opt/besvm/lib -type f \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' \) -delete \
    && rm -f /opt/besvm/lib/python3*/site-packages/grpc/_cython/_credentials/roots.pem \
        /opt/besvm/lib/python3*/site-packages/certifi/cacert.pem \
    && rm -f /opt/besvm/bin/activate* /opt/besvm/bin/Activate.ps1

# Stage 2: the base and the venv; nothing else.
FROM ${BASE_IMAGE}
ENV PATH=/opt/besvm/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MODEL_REPOSITORY=/models \
    HOST=0.0.0.0 \
    PORT=8000 \
    WORKERS=1 \
    NUMBA_CACHE_DIR=/var/cache/besvm/numba
# Threads. numba's threading layer: workqueue is built into numba and needs no libgomp (OpenMP's
# layer needs the system's libgomp, which the base does not carry); it must not be entered from
# two threads at once, which service.model.threads.PARALLEL_REGION rules out. Change it here.
# numba's thread count (NUMBA_NUM_THREADS) is left to the server, which gives each of WORKERS an
# equal share of the CPUs it may run on: set it (docker-compose.yml does) where a CPU quota, not
# a cpuset, limits the container. BLAS stays on one thread: the kernels are numba's.
ENV NUMBA_THREADING_LAYER=workqueue \
    OPENBLAS_NUM_THREADS=1 \
    MKL_NUM_THREADS=1

# /models and /snapshots (catalogue snapshots, SNAPSHOTS_DIR in docker-compose.yml) are owned by
# the service's user: a named volume mounted there starts as the image's directory, writable.
RUN groupadd --gid 10001 besvm \
    && useradd --uid 10001 --gid besvm --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin besvm \
    && mkdir -p /models /snapshots /var/cache/besvm/numba /var/cache/besvm/numba-seed \
    && chown besvm:besvm /models /snapshots /var/cache/besvm/numba /var/cache/besvm/numba-seed
COPY --from=build /opt/besvm /opt/besvm
COPY docker/entrypoint.sh /usr/local/bin/besvm-entrypoint

# numeric ids, so that runtimes can check runAsNonRoot without an /etc/passwd lookup
USER 10001:10001
# Compile every numba kernel now, into the seed the entrypoint copies into NUMBA_CACHE_DIR (a
# tmpfs in a read-only container), so that neither the server nor the trainer compiles on start.
RUN NUMBA_CACHE_DIR=/var/cache/besvm/numba-seed python -m service.model.warmup

# 8000: HTTP; 8081: gRPC, when GRPC_PORT=8081; 8082: the probes, when PROBE_PORT=8082
# (docker-compose.yml sets both)
EXPOSE 8000 8081 8082
# /readyz: 200 once the models are loaded, on PROBE_PORT when it is set (answered at once under
# any load, plain HTTP even when the service port speaks TLS), else on PORT. The probe prints
# nothing when it succeeds.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('PROBE_PORT') or os.environ.get('PORT', '8000')}/readyz\", timeout=4)"]

ENTRYPOINT ["besvm-entrypoint"]
CMD ["python", "-m", "service.api"]
