#!/usr/bin/env bash
# The docker smoke test (.ci/run, `make docker-smoke`): on a machine that can pull no image, build
# the local base image, `docker compose build`, `up` (the trainer, then the API), wait for the
# container's health check, then call the API from outside the container and check its answers
# (docker/smoke_check.py), and that the container neither compiled kernels on start nor can write
# its root filesystem. Everything it made is removed on exit, failure included.
#
# Needs root where something is missing: it installs docker.io and debootstrap with apt-get and
# starts `dockerd --iptables=false` if no engine answers (and stops that engine again), and builds
# the base image (docker/build-base-image.sh) unless SMOKE_BASE_IMAGE already exists. gRPC (the Open
# Inference Protocol, tritonclient.grpc) is called on its published port as well.
#   SMOKE_PROTOCOL=0        skip /v2/models/digits/infer, gRPC, /metrics and the probe-log check
#   SMOKE_CLUSTER=0         skip the compose profile `cluster` (a Dask scheduler and two workers
#                           train a model into the volume, which the running API then serves)
#   SMOKE_BASE_IMAGE=...    the base image (default besvm-base:bookworm); SMOKE_REBUILD_BASE=1
#   DOCKERD_STORAGE_DRIVER  overlay2 or vfs, for an engine this script starts (default: dockerd's)
set -euo pipefail
cd "$(dirname "$0")/.."

STARTED_AT=$(date +%s)
RUN_ID=${SMOKE_RUN_ID:-$$}
PROJECT=besvm-smoke-$RUN_ID
export IMAGE=besvm-smoke:$RUN_ID CLUSTER_IMAGE=besvm-smoke-cluster:$RUN_ID
# the admin key of the API (the snapshot route needs one)
export ADMIN_TOKEN=smoke-admin-$RUN_ID
export BASE_IMAGE=${SMOKE_BASE_IMAGE:-besvm-base:bookworm}
PYTHON=${PYTHON:-.venv/bin/python}
HEALTH_TIMEOUT_S=${SMOKE_HEALTH_TIMEOUT_S:-600}
UP_TIMEOUT_S=${SMOKE_UP_TIMEOUT_S:-1800}
DOCKERD_PID=
BUILT_BASE=

log() { echo "== smoke: $*"; }
elapsed() { echo "$(($(date +%s) - STARTED_AT)) s"; }

apt_install() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "$* missing, and only root may install it (apt-get install $*)" >&2
        return 1
    fi
    log "installing $*"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

compose() {
    "${COMPOSE[@]}" -p "$PROJECT" -f docker-compose.yml "$@"
}

teardown() {
    local status=$?
    set +e
    if [ "$status" -ne 0 ] && [ -n "${COMPOSE:-}" ]; then
        log "failed: the containers' last log lines"
        compose --profile cluster logs --no-color --tail 100
    fi
    if [ -n "${COMPOSE:-}" ]; then
        log "tearing down"
        compose --profile cluster down --volumes --remove-orphans --rmi all --timeout 30 >/dev/null 2>&1
        docker image rm --force "$IMAGE" "$CLUSTER_IMAGE" >/dev/null 2>&1
        [ -n "$BUILT_BASE" ] && docker image rm --force "$BASE_IMAGE" >/dev/null 2>&1
        [ "${CI:-}" = true ] && docker builder prune --force >/dev/null 2>&1
    fi
    if [ -n "$DOCKERD_PID" ]; then
        log "stopping the engine it started"
        kill "$DOCKERD_PID" && wait "$DOCKERD_PID"
    fi
    if [ "$status" -eq 0 ]; then log "passed in $(elapsed)"; else log "FAILED after $(elapsed)"; fi
    exit "$status"
}
trap teardown EXIT

# 1. An engine, and the base image script's debootstrap.
if ! docker info >/dev/null 2>&1; then
    command -v dockerd >/dev/null || apt_install docker.io
    log "starting dockerd --iptables=false"
    dockerd --iptables=false ${DOCKERD_STORAGE_DRIVER:+--storage-driver "$DOCKERD_STORAGE_DRIVER"} \
        >/tmp/besvm-smoke-dockerd.log 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { cat /tmp/besvm-smoke-dockerd.log >&2; exit 1; }
fi
log "engine $(docker version --format '{{.Server.Version}}'), storage $(docker info --format '{{.Driver}}')"
command -v debootstrap >/dev/null || apt_install debootstrap

# The compose v2 plugin: docker's own if it has one, else the dev lock's (make setup): its binary
# itself, since the .venv/bin/docker-compose wrapper drops the exit status.
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
else
    COMPOSE=("$("$PYTHON" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')")
fi
log "$("${COMPOSE[@]}" version)"

# 2. The base image, unless there is one.
if [ -n "${SMOKE_REBUILD_BASE:-}" ] || ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "building $BASE_IMAGE (debootstrap)"
    BUILT_BASE=1
    BASE_IMAGE_TAG=$BASE_IMAGE docker/build-base-image.sh >/dev/null
    log "base built at $(elapsed)"
fi

# 3. Build and start: a free loopback port, limits that fit this machine.
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
GRPC_HOST_PORT=$(free_port)
CPUS=$(( $(nproc) < 2 ? $(nproc) : 2 ))
DASK_DASHBOARD_PORT=$(free_port)
export PORT GRPC_HOST_PORT DASK_DASHBOARD_PORT BIND_ADDRESS=127.0.0.1 CPUS TRAINER_CPUS=$CPUS NUMBA_NUM_THREADS=$CPUS
if [ ! -s "${BUILD_CA_FILE:-/etc/ssl/certs/ca-certificates.crt}" ]; then export BUILD_CA_FILE=/dev/null; fi
log "compose build ($IMAGE from $BASE_IMAGE)"
compose build --quiet
log "built at $(elapsed): $(docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$IMAGE")"

# The image: runs as uid 10001; holds no CA bundle, build directory, egg-info, pip or compiler
# (searched as root, so that no directory is left unread).
test "$(docker image inspect --format '{{.Config.User}}' "$IMAGE")" = 10001:10001
found=$(docker run --rm --user 0 --entrypoint find "$IMAGE" / -xdev \( \
    \( -type f \( -name '*.crt' -o -name '*.pem' -o -name build_ca \) \) -o -name '*.egg-info' \
    -o -path /app -o -path '/*/build' -o -name pip -o -path '/usr/include/*' \
    -o \( -path '/usr/bin/*' \( -name cc -o -name 'gcc*' -o -name 'c++' -o -name 'g++*' \) \) \) -print)
if [ -n "$found" ]; then echo "the image holds what it must not: $found" >&2; exit 1; fi
log "image: uid 10001; no CA bundle, build/, egg-info, pip or compiler"

log "compose up -d (trainer, then api on 127.0.0.1:$PORT, gRPC on 127.0.0.1:$GRPC_HOST_PORT)"
timeout "$UP_TIMEOUT_S" "${COMPOSE[@]}" -p "$PROJECT" -f docker-compose.yml up -d --quiet-pull
trainer=$(compose ps --all --quiet trainer)
test "$(docker inspect --format '{{.State.ExitCode}}' "$trainer")" = 0
trainer_s=$("$PYTHON" -c 'import sys, datetime as dt
start, end = (dt.datetime.fromisoformat(t[:26].rstrip("Z")) for t in sys.argv[1:])
print(round((end - start).total_seconds()))' \
    "$(docker inspect --format '{{.State.StartedAt}}' "$trainer")" \
    "$(docker inspect --format '{{.State.FinishedAt}}' "$trainer")")
log "trained at $(elapsed) (the trainer ran $trainer_s s)"

api=$(compose ps --quiet api)
deadline=$(($(date +%s) + HEALTH_TIMEOUT_S))
until [ "$(docker inspect --format '{{.State.Health.Status}}' "$api")" = healthy ]; do
    state=$(docker inspect --format '{{.State.Status}} {{.State.Health.Status}}' "$api")
    case $state in
        running\ starting | running\ unhealthy) ;;
        *) echo "api container: $state" >&2; exit 1 ;;
    esac
    [ "$(date +%s)" -lt "$deadline" ] || { echo "api not healthy after $HEALTH_TIMEOUT_S s: $state" >&2; exit 1; }
    sleep 2
done
log "api healthy at $(elapsed)"
# The healthcheck asked PROBE_PORT: the probe process answers there, inside the container.
docker exec "$api" python -c "import json, urllib.request; assert json.load(urllib.request.urlopen('http://127.0.0.1:8082/readyz', timeout=4))['status'] == 'ready'"
log "the probe port (8082) answers ready"

# 4. From outside the container: the answers, checked against the data set.
"$PYTHON" docker/smoke_check.py "http://127.0.0.1:$PORT" "127.0.0.1:$GRPC_HOST_PORT"

# A catalogue snapshot through the API into the `snapshots` volume (SNAPSHOTS_DIR): the API
# writes it there while it reads the models volume read-only.
snapshot=$(SMOKE_ADMIN_TOKEN=$ADMIN_TOKEN "$PYTHON" docker/smoke_check.py --snapshot "http://127.0.0.1:$PORT" | tail -n 1)
docker exec "$api" test -s "/snapshots/digits/$snapshot/snapshot.json"
log "a catalogue snapshot taken through the API: /snapshots/digits/$snapshot in the snapshots volume"

# Nothing compiled on start (the kernels came from the image's cache), the root file system is
# read-only, and the health probes left no access-log lines.
listing='find . -type f -printf "%p %s\n" | sort'
seed=$(docker exec "$api" sh -c "cd /var/cache/besvm/numba-seed && $listing")
used=$(docker exec "$api" sh -c "cd \"\$NUMBA_CACHE_DIR\" && $listing")
[ -n "$seed" ] && [ "$seed" = "$used" ] || { echo "numba compiled in the container:"; diff <(echo "$seed") <(echo "$used"); exit 1; } >&2
log "no kernel compiled in the container ($(echo "$seed" | wc -l) cache files, all from the image)"
if docker exec "$api" sh -c 'touch /opt/besvm/written /written' 2>/dev/null; then
    echo "the root filesystem is writable" >&2
    exit 1
fi
log "root filesystem read-only"
# A selection cut by its budget abandons its joblib pool, whose workers loky kills through psutil
# or `pgrep` (the image has no pgrep): without psutil the trainer waited about 330 s at its exit
# (the workers' 300 s idle timeout). The script checks that it ran in worker processes.
pool_check='import os, time, psutil
from joblib import Parallel, delayed
pool = Parallel(n_jobs=2, return_as="generator_unordered")(delayed(os.getpid)() for _ in range(4))
assert os.getpid() not in set(pool), "joblib ran the tasks in this process"
pool = Parallel(n_jobs=2, return_as="generator_unordered")(delayed(time.sleep)(0.5) for _ in range(20))
next(pool)
pool.close()'
set +e
pool_out=$(docker exec "$api" timeout 60 python -W ignore -c "$pool_check" 2>&1)
pool_status=$?
set -e
case $pool_status in
    0) log "an abandoned joblib pool ends with its command" ;;
    124) echo "an abandoned joblib pool kept its command 60 s" >&2; exit 1 ;;
    *) echo "the joblib pool check failed ($pool_status): $pool_out" >&2; exit 1 ;;
esac
# A CPU quota the affinity mask does not show bounds the CPUs the code counts (the fold fits'
# processes, the server's threads): one CPU under `--cpus 1` whatever the host's cores.
quota_cpus=$(docker run --rm --cpus 1 --entrypoint python "$IMAGE" -c \
    'from service.model.threads import available_cpus; print(available_cpus())')
[ "$quota_cpus" = 1 ] || { echo "under --cpus 1 the image counts $quota_cpus CPUs" >&2; exit 1; }
log "under --cpus 1 the image counts 1 CPU"
if [ "${SMOKE_PROTOCOL:-1}" != 0 ]; then
    probes=$(compose logs --no-color api | grep -c 'GET /readyz' || true)
    [ "$probes" -eq 0 ] || { echo "$probes health-probe lines in the api's log" >&2; exit 1; }
    log "no health-probe lines in the api's log"
fi

# 5. The compose profile `cluster`: its image, a scheduler and two workers; the cluster trainer
# fits a model through them (DASK_SCHEDULER_ADDRESS) into the volume, and the API above, which
# rescans the volume every RELOAD_INTERVAL_S, serves it.
if [ "${SMOKE_CLUSTER:-1}" != 0 ]; then
    log "cluster profile: build ($CLUSTER_IMAGE)"
    compose --profile cluster build --quiet dask-scheduler
    log "cluster image built at $(elapsed): $(docker image ls --format '{{.Size}}' "$CLUSTER_IMAGE")"
    timeout "$UP_TIMEOUT_S" "${COMPOSE[@]}" -p "$PROJECT" -f docker-compose.yml --profile cluster \
        up -d --quiet-pull dask-scheduler dask-worker
    # The workers have joined the scheduler (they have no health check of their own).
    compose --profile cluster run --rm --no-deps --entrypoint python cluster-trainer -c \
        'from distributed import Client; Client(timeout=30).wait_for_workers(2, timeout=120)'
    log "a scheduler and 2 workers up at $(elapsed)"
    timeout "$UP_TIMEOUT_S" "${COMPOSE[@]}" -p "$PROJECT" -f docker-compose.yml --profile cluster \
        run --rm --no-deps cluster-trainer
    # The fit ran on the workers: they executed its tasks (not the trainer alone).
    executed=$(compose --profile cluster run --rm --no-deps --entrypoint python cluster-trainer -c \
        'from distributed import Client; c = Client(timeout=30); print(sum(c.run(lambda dask_worker: dask_worker.state.executed_count).values()))')
    [ "${executed##*$'\n'}" -gt 0 ] || { echo "the workers ran no task of the fit: $executed" >&2; exit 1; }
    log "trained through the cluster at $(elapsed): the workers ran ${executed##*$'\n'} tasks"
    "$PYTHON" docker/smoke_check.py --cluster-model digits-cluster "http://127.0.0.1:$PORT"
    log "the API serves the model trained on the cluster"
fi
