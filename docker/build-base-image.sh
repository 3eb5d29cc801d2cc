#!/usr/bin/env bash
# Build a minimal Debian bookworm base image with Python 3.11 and import it as
# besvm-base:bookworm (BASE_IMAGE_TAG), for machines that cannot pull python:3.11-slim from a
# registry. Uses only the Debian mirror that apt is configured with (MIRROR overrides it).
# Needs root, debootstrap and a running Docker engine. Then:
#   BASE_IMAGE=besvm-base:bookworm docker compose build
#
# The image holds python3 and python3-venv (whose ensurepip builds the image's virtual
# environment) and nothing else: no pip outside a venv, no compiler, no CA bundle (the build
# passes the host's as a build secret, see docs/operating/deploy.md). The root filesystem is built in a
# temporary directory that is removed on exit, failure included.
set -euo pipefail

TAG=${BASE_IMAGE_TAG:-besvm-base:bookworm}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)}
if [ -z "$MIRROR" ]; then
    echo "no Debian mirror found in apt's sources: set MIRROR=<the mirror's URL>" >&2
    exit 1
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }

WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/besvm-base.XXXXXX")
ROOTFS=$WORKDIR/rootfs

cleanup() {
    # debootstrap mounts /proc and /sys (and may bind /dev) inside the root filesystem; a failed
    # run can leave them mounted. Unmount them (deepest first) before removing anything, and never
    # cross into another file system while removing.
    if [ -d "$ROOTFS" ]; then
        awk -v root="$ROOTFS" 'index($2, root) == 1 {print $2}' /proc/self/mounts | sort -r |
            while read -r mountpoint; do umount -l "$mountpoint" || true; done
    fi
    rm -rf --one-file-system "$WORKDIR"
}
trap cleanup EXIT

debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$ROOTFS" "$MIRROR"

# Slim down: apt's lists and caches, documentation, manual pages and locales; /tmp empty. And no
# trust store (python3 pulls in ca-certificates): serving makes no outbound TLS connection.
rm -rf "$ROOTFS"/etc/ssl/certs/* "$ROOTFS"/usr/share/ca-certificates/* \
    "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
    "$ROOTFS"/var/cache/debconf/*-old "$ROOTFS"/var/log/*.log "$ROOTFS"/var/log/apt/* \
    "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
    "$ROOTFS"/usr/share/locale/* "$ROOTFS"/tmp/*

tar --numeric-owner -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$TAG"
docker image ls "$TAG"
