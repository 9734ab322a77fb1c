#!/bin/bash
# Build the local base image voiceedge-base:bookworm from Debian packages (debootstrap), for
# machines whose registries serve no images (docs/deployment.md, "docker-compose").
#   scripts/base-image.sh            build it unless the image is up to date (DOCKER_HOST is honoured)
#   FORCE=1 scripts/base-image.sh    build the rootfs tarball again
# The tarball is cached in /var/cache/voiceedge, so a rerun only runs `docker import`.
# Both are keyed by a hash of what goes into the rootfs (suite, package list, the slimming
# step's version): the tarball's name carries it and so does the image's label
# voiceedge.base-key, so changing PACKAGES (or SUITE) rebuilds the rootfs and re-imports the
# image on the next run, and an unchanged one costs nothing.
# The image carries what the Dockerfile needs offline: python3 (venv, dev headers), gcc and the
# headers and libraries of the C extensions (the relay's fast path and admission: OpenSSL; the
# media plane: libsrtp2, Opus, OpenSSL), redis-server for the compose stack's redis service, and conntrack for its
# relay-conntrack guard (deploy/compose/conntrack_guard.py).
set -euo pipefail
IMAGE=${IMAGE:-voiceedge-base:bookworm}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
CACHE=${CACHE:-/var/cache/voiceedge}
PACKAGES=python3,python3-venv,python3-dev,gcc,libc6-dev,libssl-dev,libsrtp2-dev,libopus-dev,redis-server,procps,iproute2,ca-certificates,conntrack
# Bump when the rootfs recipe below changes in a way the package list does not show.
RECIPE=1
KEY=$(printf '%s\n' "$SUITE" "$PACKAGES" "$RECIPE" | sha256sum | cut -c1-12)
TARBALL=$CACHE/$SUITE-rootfs-$KEY.tar

if [ "$(id -u)" != 0 ]; then echo "base-image.sh: needs root (debootstrap)" >&2; exit 2; fi
if have=$(docker image inspect -f '{{index .Config.Labels "voiceedge.base-key"}}' "$IMAGE" 2>/dev/null); then
    case "$have" in ""|"<no value>") have="(none)" ;; esac
else
    have=
fi
if [ -z "${FORCE:-}" ] && [ "$have" = "$KEY" ]; then
    echo "base-image.sh: $IMAGE is up to date (key $KEY)"; exit 0
fi
[ -z "$have" ] || echo "base-image.sh: $IMAGE has key $have, the package list makes $KEY: building it again"
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
    # Tarballs of other keys are stale (343 MB each): keep only this one.
    find "$CACHE" -maxdepth 1 -name "$SUITE-rootfs*.tar" ! -path "$TARBALL" -delete
    echo "base-image.sh: rootfs $TARBALL ($(du -h "$TARBALL" | cut -f1)) in $(( $(date +%s) - start )) s"
fi
start=$(date +%s)
docker import --change 'ENV LANG=C.UTF-8' --change "LABEL voiceedge.base-key=$KEY" \
    --change 'CMD ["/bin/bash"]' "$TARBALL" "$IMAGE" >/dev/null
echo "base-image.sh: $IMAGE (key $KEY) imported in $(( $(date +%s) - start )) s"
