#!/usr/bin/env bash
# Build a minimal Debian bookworm base image with Python 3.11 (venv at /opt/venv) and import it
# as besvm-base:bookworm, for machines that cannot pull python:3.11-slim from a registry. Uses only
# the Debian mirror apt is configured with. Then: docker build --build-arg BASE_IMAGE=besvm-base:bookworm .
set -euo pipefail
ROOTFS=${ROOTFS:-$(mktemp -d)/rootfs}
MIRROR=${MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)}
rm -rf "$ROOTFS"
debootstrap --variant=minbase \
  --include=python3,python3-venv,python3-pip,ca-certificates \
  bookworm "$ROOTFS" "$MIRROR"
chroot "$ROOTFS" python3 -m venv /opt/venv
chroot "$ROOTFS" /opt/venv/bin/python -m pip --version
# slim down: apt lists, caches, docs, man pages
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
       "$ROOTFS"/usr/share/locale/* "$ROOTFS"/var/log/*.log "$ROOTFS"/tmp/*
tar --numeric-owner -C "$ROOTFS" -c . | docker import \
  --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  - besvm-base:bookworm
docker image ls besvm-base:bookworm
