#!/usr/bin/env bash
# Docker test matrix for horovod_prio (behind `make docker-base|docker-build|
# docker-test|docker-run`, see docker/docker.mk and docs/docker.md).
#
#   docker/matrix.sh base            local Debian bookworm base image (debootstrap)
#   docker/matrix.sh build           build the image of every TF in DOCKER_TFS
#   docker/matrix.sh test            build + run the test suite in every cell
#   docker/matrix.sh run [TF]        run the main job (`make run`) in one image
#
# Settings (environment): DOCKER_TFS, DOCKER_CONTROLLERS, BASE_IMAGE,
# LOCAL_BASE_IMAGE, IMAGE_REPO, PULL_TIMEOUT, CELL_TIMEOUT, PYTEST_ARGS,
# DOCKER_RUN_ARGS, DOCKER (client), DEBIAN_MIRROR (docker-base only).
# pip/apt settings of this machine are handed to the build as BuildKit secrets
# made at run time in a private temporary directory; none is written to the
# project or baked into an image layer.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DOCKER_TFS=${DOCKER_TFS:-2.15.1 2.16.2 2.17.1 2.18.1 2.19.1 2.21.0}
DOCKER_CONTROLLERS=${DOCKER_CONTROLLERS:-gloo mpi}
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}
LOCAL_BASE_IMAGE=${LOCAL_BASE_IMAGE:-horovod-prio/base:bookworm}
IMAGE_REPO=${IMAGE_REPO:-horovod-prio}
PULL_TIMEOUT=${PULL_TIMEOUT:-20}
CELL_TIMEOUT=${CELL_TIMEOUT:-3600}
PYTEST_ARGS=${PYTEST_ARGS:-}
# Multi-process tests need shared memory (Open MPI) and may build network
# namespaces with shaped links (ip netns / tc): NET_ADMIN + SYS_ADMIN, not
# --privileged (which fails on hosts that do not grant every capability).
DOCKER_RUN_ARGS=${DOCKER_RUN_ARGS:---cap-add=NET_ADMIN --cap-add=SYS_ADMIN --security-opt seccomp=unconfined --shm-size=1g}
LOGDIR=${DOCKER_LOGDIR:-$ROOT/build/docker}
mkdir -p "$LOGDIR"
log() { printf '[docker] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
nice_io() { nice -n 19 ionice -c3 "$@"; }

# --- the docker client -------------------------------------------------------
# BuildKit is needed (RUN --mount). Use a client with buildx, else a Docker
# < 23 client (Debian bookworm's docker.io) with its built-in BuildKit.
pick_docker() {
  if [ -n "${DOCKER:-}" ]; then export DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-1}; return; fi
  local c v
  for c in docker /usr/bin/docker; do
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" buildx version >/dev/null 2>&1; then DOCKER=$c; return; fi
  done
  for c in docker /usr/bin/docker; do
    command -v "$c" >/dev/null 2>&1 || continue
    v=$("$c" version --format '{{.Client.Version}}' 2>/dev/null || true)
    if [ -n "$v" ] && [ "${v%%.*}" -lt 23 ] 2>/dev/null; then
      DOCKER=$c; export DOCKER_BUILDKIT=1; return
    fi
  done
  if ! command -v dockerd >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "no BuildKit-capable docker client: apt-get install docker.io"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null
    DOCKER=/usr/bin/docker; export DOCKER_BUILDKIT=1; return
  fi
  die "need docker with buildx, or Docker 20.10 (docker.io) for its built-in BuildKit"
}
pick_docker
export DOCKER
bash "$ROOT/docker/ensure-dockerd.sh" || exit 1

# --- pip/apt settings of this machine, as build secrets ----------------------
SECRETS=$(mktemp -d "${TMPDIR:-/tmp}/hp-docker-secrets.XXXXXX"); chmod 700 "$SECRETS"
trap 'rm -rf "$SECRETS"' EXIT
secret_args=()
make_secrets() {
  local py ca
  # pip: only http(s) indexes (local file mirrors do not exist in a container).
  for py in python3 python; do command -v $py >/dev/null 2>&1 && break; done
  if $py -m pip --version >/dev/null 2>&1; then
    $py -m pip config list 2>/dev/null | $py -c '
import re, sys
keep = {"index-url", "extra-index-url", "trusted-host", "default-timeout", "retries", "timeout"}
out = {}
for line in sys.stdin:
    m = re.match(r"^[^.]*\.([a-z-]+)=(.*)$", line.strip())
    if not m or m.group(1) not in keep:
        continue
    key, val = m.group(1), m.group(2).strip().strip("\x27\"")
    if key.endswith("index-url"):
        val = " ".join(u for u in val.split() if u.startswith(("http://", "https://")))
    if val:
        out[key] = val
if out:
    print("[global]")
    for k, v in out.items():
        print(f"{k} = {v}")
' > "$SECRETS/pip.conf" || true
  fi
  # PIP_* variables set in this environment win, as they do for pip here.
  local v
  for v in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_DEFAULT_TIMEOUT PIP_RETRIES; do
    if [ -n "${!v:-}" ]; then
      grep -q '^\[global\]' "$SECRETS/pip.conf" 2>/dev/null || echo '[global]' >> "$SECRETS/pip.conf"
      local key; key=$(echo "${v#PIP_}" | tr 'A-Z_' 'a-z-')
      sed -i "/^$key = /d" "$SECRETS/pip.conf"
      local val=${!v}
      [[ $key == *index-url ]] && val=$(printf '%s\n' $val | grep -E '^https?://' | tr '\n' ' ')
      [ -n "${val// /}" ] && echo "$key = $val" >> "$SECRETS/pip.conf"
    fi
  done
  [ -s "$SECRETS/pip.conf" ] && secret_args+=(--secret "id=pipconf,src=$SECRETS/pip.conf")
  # CA bundle: the one pip/curl here are told to trust (may hold a proxy's CA).
  for ca in "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}" "${CURL_CA_BUNDLE:-}" /etc/ssl/certs/ca-certificates.crt; do
    if [ -n "$ca" ] && [ -s "$ca" ]; then cp "$ca" "$SECRETS/ca.crt"; secret_args+=(--secret "id=cacert,src=$SECRETS/ca.crt"); break; fi
  done
  # apt: proxy and date-check settings of this machine's apt, if any.
  if command -v apt-config >/dev/null 2>&1; then
    apt-config dump 2>/dev/null | grep -E '^Acquire::((https?|ftp)::Proxy|Check-Valid-Until|Check-Date|Retries|(https?)::Timeout)' \
      > "$SECRETS/apt.conf" || true
    [ -s "$SECRETS/apt.conf" ] && secret_args+=(--secret "id=aptconf,src=$SECRETS/apt.conf")
  fi
  return 0
}

# --- base image ----------------------------------------------------------------
resolve_base() {  # sets BASE to the base image to build on
  if $DOCKER image inspect "$BASE_IMAGE" >/dev/null 2>&1; then BASE=$BASE_IMAGE; return; fi
  log "pulling $BASE_IMAGE (timeout ${PULL_TIMEOUT}s)"
  if timeout "$PULL_TIMEOUT" $DOCKER pull -q "$BASE_IMAGE" >"$LOGDIR/pull.log" 2>&1; then BASE=$BASE_IMAGE; return; fi
  log "cannot pull $BASE_IMAGE within ${PULL_TIMEOUT}s (details: ${LOGDIR#$ROOT/}/pull.log);"
  log "falling back to the local base $LOCAL_BASE_IMAGE (make docker-base)"
  bash "$ROOT/docker/make-base.sh" "$LOCAL_BASE_IMAGE" || die "could not build $LOCAL_BASE_IMAGE"
  BASE=$LOCAL_BASE_IMAGE
}

declare -A BUILD_RC BUILD_SECS
build_one() {  # build_one TF
  local tf=$1 img="$IMAGE_REPO:tf$1" t0 rc
  log "building $img on $BASE (log: ${LOGDIR#$ROOT/}/build-tf$tf.log)"
  t0=$(date +%s)
  nice_io $DOCKER build --network host --progress=plain \
    -f docker/Dockerfile --build-arg BASE_IMAGE="$BASE" --build-arg TF="$tf" \
    "${secret_args[@]}" -t "$img" . >"$LOGDIR/build-tf$tf.log" 2>&1
  rc=$?
  BUILD_RC[$tf]=$rc; BUILD_SECS[$tf]=$(( $(date +%s) - t0 ))
  if [ $rc = 0 ]; then log "built $img in ${BUILD_SECS[$tf]}s"
  else log "build of $img FAILED after ${BUILD_SECS[$tf]}s; last lines:"; tail -n 25 "$LOGDIR/build-tf$tf.log" >&2; fi
  return $rc
}

run_cell() {  # run_cell TF CONTROLLER -> sets CELL_RC, CELL_SECS, CELL_SUMMARY
  local tf=$1 ctl=$2 name="hp-test-tf$1-$2-$$" logf="$LOGDIR/test-tf$1-$2.log" t0
  log "testing tf$tf x $ctl (log: ${logf#$ROOT/})"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout "$CELL_TIMEOUT" nice -n 19 ionice -c3 $DOCKER run --rm --name "$name" --network host $DOCKER_RUN_ARGS \
    -e HOROVOD_PRIO_TEST_CONTROLLERS="$ctl" -e CI="${CI:-}" \
    "$IMAGE_REPO:tf$tf" make test PYTEST_ARGS="$PYTEST_ARGS" >"$logf" 2>&1
  CELL_RC=$?
  if [ $CELL_RC = 124 ]; then $DOCKER rm -f "$name" >/dev/null 2>&1; echo "[docker] timed out after ${CELL_TIMEOUT}s" >>"$logf"; fi
  CELL_SECS=$(( $(date +%s) - t0 ))
  CELL_SUMMARY=$(grep -E '^=+ .*(passed|failed|error|skipped|no tests ran|deselected).* in [0-9.]+s' "$logf" | tail -n1 | sed -E 's/^=+ //; s/ =+$//')
  [ -n "$CELL_SUMMARY" ] || CELL_SUMMARY=$(tail -n1 "$logf" | cut -c1-60)
}

cmd=${1:-test}
case $cmd in
  base)
    bash "$ROOT/docker/make-base.sh" "$LOCAL_BASE_IMAGE" ;;
  build)
    make_secrets; resolve_base; rc=0
    for tf in $DOCKER_TFS; do build_one "$tf" || rc=1; done
    exit $rc ;;
  run)
    tf=${2:-2.15.1}
    make_secrets; resolve_base
    build_one "$tf" || exit 1
    log "running the main job (make run) in $IMAGE_REPO:tf$tf"
    # shellcheck disable=SC2086
    nice_io $DOCKER run --rm --network host $DOCKER_RUN_ARGS "$IMAGE_REPO:tf$tf" make run ;;
  test)
    make_secrets; resolve_base
    rows=(); failed=0; T0=$(date +%s)
    for tf in $DOCKER_TFS; do
      build_one "$tf"
      first=1
      for ctl in $DOCKER_CONTROLLERS; do
        bsecs=${BUILD_SECS[$tf]}; [ $first = 1 ] || bsecs="(same)"; first=0
        if [ "${BUILD_RC[$tf]}" != 0 ]; then
          rows+=("tf$tf|$ctl|${bsecs}s|-|${BUILD_SECS[$tf]}s|BUILD FAILED|see build-tf$tf.log"); failed=1; continue
        fi
        run_cell "$tf" "$ctl"
        case $CELL_RC in
          0) st=PASS ;;
          5) st="NO TESTS" ;;
          124) st=TIMEOUT; failed=1 ;;
          *) st=FAIL; failed=1 ;;
        esac
        total=$CELL_SECS; [ "$bsecs" = "(same)" ] || total=$(( CELL_SECS + BUILD_SECS[$tf] ))
        rows+=("tf$tf|$ctl|${bsecs}s|${CELL_SECS}s|${total}s|$st|$CELL_SUMMARY")
      done
    done
    {
      echo
      echo "horovod_prio docker test matrix (base: $BASE; $(date -u '+%Y-%m-%d %H:%M UTC'))"
      printf '%-10s %-6s %9s %7s %7s  %-12s %s\n' TF ctl build tests total result summary
      for r in "${rows[@]}"; do
        IFS='|' read -r a b c d e f g <<<"$r"
        printf '%-10s %-6s %9s %7s %7s  %-12s %s\n' "$a" "$b" "${c/(same)s/(same)}" "$d" "$e" "$f" "$g"
      done
      echo "whole matrix: $(( $(date +%s) - T0 ))s; logs in ${LOGDIR#$ROOT/}/"
    } | tee "$LOGDIR/matrix.txt"
    exit $failed ;;
  *) die "usage: $0 base|build|test|run [TF]" ;;
esac
