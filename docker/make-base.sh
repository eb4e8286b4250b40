#!/usr/bin/env bash
# Build a local Debian bookworm base image with debootstrap + `docker import`,
# for machines that cannot pull the public python:3.11-slim image.
#
#   docker/make-base.sh [IMAGE]        (make docker-base; default IMAGE below)
#
# The Debian mirror is DEBIAN_MIRROR if set, else the one this machine's apt
# already uses for bookworm (read at run time, never stored in the project),
# else debootstrap's own default.
set -euo pipefail
IMAGE=${1:-${LOCAL_BASE_IMAGE:-horovod-prio/base:bookworm}}
SUITE=bookworm
DOCKER=${DOCKER:-docker}
log() { printf '[docker-base] %s\n' "$*" >&2; }
nice_io() { nice -n 19 ionice -c3 "$@"; }

if [ "${FORCE:-0}" != 1 ] && $DOCKER image inspect "$IMAGE" >/dev/null 2>&1; then
  log "$IMAGE already exists (FORCE=1 to rebuild)"; exit 0
fi
[ "$(id -u)" = 0 ] || { log "debootstrap needs root"; exit 1; }
if ! command -v debootstrap >/dev/null; then
  log "apt-get install debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ] && command -v apt-get >/dev/null; then
  fmt='$(REPO_URI) $(RELEASE) $(TARGET_OF)'
  mirror=$(apt-get indextargets --format "$fmt" 2>/dev/null | awk -v s="$SUITE" '$2 == s && $3 == "deb" {print $1; exit}')
fi

root=$(mktemp -d "${TMPDIR:-/tmp}/hp-rootfs.XXXXXX")
trap 'rm -rf "$root"' EXIT
# Python 3.11 (with venv) like the public python:3.11-slim; the Dockerfile adds
# the build tool chain, Open MPI and the Python headers on top.
pkgs=ca-certificates,python3.11,python3.11-venv,python3-venv
log "debootstrap $SUITE (minbase + $pkgs) into $root ${mirror:+from the apt mirror this machine uses}"
t0=$(date +%s)
nice_io debootstrap --variant=minbase --include="$pkgs" "$SUITE" "$root" ${mirror:+"$mirror"} \
  > "$root.log" 2>&1 || { tail -n 30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# Trim what an image does not need.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/*
log "docker import -> $IMAGE"
nice_io tar -C "$root" --numeric-owner -c . | nice_io $DOCKER import \
  -c 'ENV LANG=C.UTF-8' \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'CMD ["bash"]' \
  -m "debootstrap $SUITE minbase + python3.11 (horovod_prio make docker-base)" - "$IMAGE" >/dev/null
log "built $IMAGE in $(( $(date +%s) - t0 ))s"
