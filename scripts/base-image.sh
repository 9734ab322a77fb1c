#!/bin/bash
# Build the local base image voiceedge-base:bookworm from Debian packages (debootstrap), for
# machines whose registries serve no images (docs/deployment.md, "docker-compose").
#   scripts/base-image.sh            build it unless the image exists (DOCKER_HOST is honoured)
#   FORCE=1 scripts/base-image.sh    build the rootfs tarball again
# The tarball is cached in /var/cache/voiceedge, so a rerun only runs `docker import`.
# The image carries what the Dockerfile needs offline: python3 (venv, dev headers), gcc for the
# relay's C fast path, and redis-server for the compose stack's redis service.
set -euo pipefail
IMAGE=${IMAGE:-voiceedge-base:bookworm}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
CACHE=${CACHE:-/var/cache/voiceedge}
TARBALL=$CACHE/$SUITE-rootfs.tar
PACKAGES=python3,python3-venv,python3-dev,gcc,libc6-dev,redis-server,procps,iproute2,ca-certificates

if [ "$(id -u)" != 0 ]; then echo "base-image.sh: needs root (debootstrap)" >&2; exit 2; fi
if [ -z "${FORCE:-}" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base-image.sh: $IMAGE exists"; exit 0
fi
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap
mkdir -p "$CACHE"
if [ -n "${FORCE:-}" ] || [ ! -s "$TARBALL" ]; then
    start=$(date +%s)
    root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    # Slim it: apt lists, caches, docs, man pages; no services start inside an image build.
    chroot "$root" apt-get clean
    rm -rf "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
        "$root"/usr/share/locale/* "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
    tar -C "$root" --numeric-owner -cf "$TARBALL.tmp" .
    mv "$TARBALL.tmp" "$TARBALL"
    echo "base-image.sh: rootfs $TARBALL ($(du -h "$TARBALL" | cut -f1)) in $(( $(date +%s) - start )) s"
fi
start=$(date +%s)
docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' "$TARBALL" "$IMAGE" >/dev/null
echo "base-image.sh: $IMAGE imported in $(( $(date +%s) - start )) s"
