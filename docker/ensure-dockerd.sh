#!/usr/bin/env bash
# Make sure a Docker daemon answers; start Debian's dockerd (package docker.io)
# when none is running, and say so. Used by the docker-* make targets.
#
#   docker/ensure-dockerd.sh            # exit 0 once `docker info` works
set -euo pipefail
log() { printf '[docker] %s\n' "$*" >&2; }
DOCKER=${DOCKER:-docker}
LOGFILE=${DOCKERD_LOG:-/var/log/horovod_prio-dockerd.log}

if $DOCKER info >/dev/null 2>&1; then exit 0; fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    log "no Docker daemon and no dockerd: install docker.io (apt-get install docker.io) or start Docker"; exit 1
  fi
  log "dockerd missing: apt-get install docker.io"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null
fi
if [ "$(id -u)" != 0 ]; then
  log "Docker daemon is not running and starting it needs root (sudo dockerd, or systemctl start docker)"; exit 1
fi

start() {  # start dockerd in the background with extra flags "$@", wait until it answers
  log "dockerd is not running: starting it${*:+ with $*} at low CPU/IO priority (log: $LOGFILE)"
  # nice/ionice are inherited by containerd, the build steps and the containers.
  nohup nice -n 19 ionice -c3 dockerd "$@" >>"$LOGFILE" 2>&1 &
  local pid=$!
  for _ in $(seq 1 60); do
    if $DOCKER info >/dev/null 2>&1; then log "dockerd started (pid $pid)"; return 0; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  return 1
}
# Builds and runs here use host networking only, so a daemon that cannot set up
# its bridge/iptables rules (some VMs, nested containers) is still enough.
start || start --iptables=false --ip-masq=false --bridge=none || {
  log "could not start dockerd; last lines of $LOGFILE:"; tail -n 20 "$LOGFILE" >&2; exit 1; }
