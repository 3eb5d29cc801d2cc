#!/bin/sh
# The image's entrypoint: copy the numba kernels compiled at build time into NUMBA_CACHE_DIR when
# it is empty (docker-compose.yml mounts a fresh tmpfs there: the root filesystem is read-only,
# and numba refuses to run a cache=True kernel without a writable cache directory), then run the
# command. A cache compiled for another CPU is simply recompiled into NUMBA_CACHE_DIR.
set -eu
seed=/var/cache/besvm/numba-seed
if [ -n "${NUMBA_CACHE_DIR:-}" ] && [ "$NUMBA_CACHE_DIR" != "$seed" ] && [ -d "$seed" ]; then
    mkdir -p "$NUMBA_CACHE_DIR"
    if [ -z "$(ls -A "$NUMBA_CACHE_DIR")" ]; then
        cp -R "$seed/." "$NUMBA_CACHE_DIR/"
    fi
fi
exec "$@"
