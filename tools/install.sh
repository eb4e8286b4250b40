#!/usr/bin/env bash
# Idempotent installer behind `make install`. Every step checks before it acts,
# so a re-run with nothing changed takes a few seconds.
#
#   tools/install.sh VENV TF_VERSION
#   tools/install.sh --horovod-patch TF_VERSION   print the patch the Horovod build of
#                                                 that TF takes (nothing: none), exit
set -euo pipefail
HOROVOD_VERSION=0.28.1
ROOT=$(cd "$(dirname "$0")/.." && pwd)

# A TensorFlow whose headers Horovod's sdist does not compile against unchanged
# gets tools/horovod-<horovod>-tf<major.minor>.patch applied before the build: the
# patch of the newest such major.minor not above its own (a patch holds from its
# TensorFlow on, e.g. tf2.19 for 2.19, 2.20 and 2.21).
horovod_patch() {
  [[ "$1" =~ ^([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || { echo "[install] bad TF version '$1' (want X.Y.Z)" >&2; return 2; }
  local want=$((BASH_REMATCH[1] * 1000 + BASH_REMATCH[2])) best="" best_v=-1 p v
  for p in "$ROOT"/tools/horovod-"$HOROVOD_VERSION"-tf*.patch; do
    [[ "$p" =~ -tf([0-9]+)\.([0-9]+)\.patch$ ]] || continue
    v=$((BASH_REMATCH[1] * 1000 + BASH_REMATCH[2]))
    if [ "$v" -le "$want" ] && [ "$v" -gt "$best_v" ]; then best=$p; best_v=$v; fi
  done
  if [ -n "$best" ]; then echo "$best"; fi
}
if [ "${1:-}" = --horovod-patch ]; then horovod_patch "${2:-}"; exit; fi

VENV=${1:-.venv}
TF=${2:-2.15.1}
PY=${PYTHON:-python3.11}
CACHE=${HOROVOD_PRIO_CACHE:-$HOME/.cache/horovod_prio}
log() { printf '[install] %s\n' "$*"; }

# 1. Debian packages the horovod build and its MPI controller need.
need=()
for p in openmpi-bin libopenmpi-dev cmake g++ iproute2 libssl-dev patch; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if ((${#need[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "[install] missing Debian packages: ${need[*]} (run as root or install them)" >&2; exit 1
  fi
  log "apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# 2. The virtual environment.
command -v "$PY" >/dev/null || PY=python3
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
VPY="$ROOT/$VENV/bin/python"
[ -x "$VPY" ] || VPY="$VENV/bin/python"
STAMPS="$VENV/.stamps"; mkdir -p "$STAMPS"

# 3. Pinned Python dependencies for this TensorFlow stack.
reqs="$ROOT/requirements/tf-$TF.txt"
[ -f "$reqs" ] || { echo "[install] no pinned stack for TF=$TF (have: $(ls "$ROOT"/requirements | sed 's/^tf-//;s/.txt$//' | tr '\n' ' '))" >&2; exit 2; }
key=$(cat "$reqs" "$ROOT/requirements/common.txt" | sha1sum | cut -c1-12)
if [ ! -f "$STAMPS/deps-$key" ]; then
  log "pip install pinned stack TF=$TF"
  "$VPY" -m pip install -q --upgrade 'pip<25' 'setuptools<70' wheel
  "$VPY" -m pip install -q -r "$reqs" -r "$ROOT/requirements/common.txt"
  rm -f "$STAMPS"/deps-*; touch "$STAMPS/deps-$key"
fi

# 4. horovod built from source against this TensorFlow (TensorFlow + Gloo + MPI).
#    The built wheel is cached per TF/Python version (and patch) so fresh venvs skip
#    the build. A TF with a patch (horovod_patch above) builds from the patched sdist.
pyver=$("$VPY" -c 'import sys; print("%d%d" % sys.version_info[:2])')
patch_file=$(horovod_patch "$TF")
if ! "$VPY" -m pip show -q horovod >/dev/null 2>&1 || [ ! -f "$STAMPS/horovod-$TF" ]; then
  wheeldir="$CACHE/horovod-$HOROVOD_VERSION-tf$TF-py$pyver"
  [ -z "$patch_file" ] || wheeldir="$wheeldir-patch$(sha1sum < "$patch_file" | cut -c1-8)"
  if ! ls "$wheeldir"/horovod-*.whl >/dev/null 2>&1; then
    log "building horovod==$HOROVOD_VERSION from source against TF $TF (takes ~3 min)"
    rm -rf "$wheeldir.tmp"; mkdir -p "$wheeldir.tmp"
    src="horovod==$HOROVOD_VERSION"
    if [ -n "$patch_file" ]; then
      log "patching the horovod sdist with ${patch_file#"$ROOT"/}"
      "$VPY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
        -d "$wheeldir.tmp/src" "horovod==$HOROVOD_VERSION"
      tar xzf "$wheeldir.tmp/src/horovod-$HOROVOD_VERSION.tar.gz" -C "$wheeldir.tmp/src"
      src="$wheeldir.tmp/src/horovod-$HOROVOD_VERSION"
      patch -d "$src" -p1 --forward --quiet < "$patch_file"
    fi
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      "$VPY" -m pip wheel -q --no-build-isolation --no-cache-dir --no-deps \
        -w "$wheeldir.tmp" "$src"
    rm -rf "$wheeldir.tmp/src" "$wheeldir"; mv "$wheeldir.tmp" "$wheeldir"
  fi
  "$VPY" -m pip install -q --no-deps --force-reinstall "$wheeldir"/horovod-*.whl
  build=$(TF_CPP_MIN_LOG_LEVEL=3 PATH="$ROOT/$VENV/bin:$PATH" "$VENV/bin/horovodrun" --check-build)
  for fw in TensorFlow MPI Gloo; do
    echo "$build" | grep -q "\[X\] $fw" || { echo "$build" >&2; echo "[install] horovod lacks $fw" >&2; exit 1; }
  done
  rm -f "$STAMPS"/horovod-*; touch "$STAMPS/horovod-$TF"
fi

# 5. horovod_prio itself, editable, with its two libraries: the scheduler and
#    the TensorFlow kernels built against this TF. The stamp stands for the
#    sources AND the built files: a missing library (make clean) rebuilds.
src_key=$(cat "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT"/horovod_prio/scheduler/*.cc \
  "$ROOT"/horovod_prio/scheduler/*.h "$ROOT"/horovod_prio/tensorflow/kernels/*.cc 2>/dev/null \
  | sha1sum | cut -c1-12)
tfv=$("$VPY" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))' 2>/dev/null \
  || echo "$TF")
libs=("$ROOT/horovod_prio/scheduler/libhvdprio_scheduler.so"
      "$ROOT/horovod_prio/tensorflow/kernels/libhvdprio_tf_kernels_tf${tfv//./_}.so")
built=1
for f in "${libs[@]}"; do [ -f "$f" ] || built=0; done
if [ ! -f "$STAMPS/prio-$src_key" ] || [ "$built" = 0 ]; then
  log "pip install -e . (builds the scheduler and the TensorFlow kernels)"
  "$VPY" -m pip install -q --no-build-isolation --no-deps -e "$ROOT"
  for f in "${libs[@]}"; do
    [ -f "$f" ] || { echo "[install] build did not produce $f" >&2; exit 1; }
  done
  rm -f "$STAMPS"/prio-*; touch "$STAMPS/prio-$src_key"
fi
log "ready: $VENV (TF $TF, horovod $HOROVOD_VERSION)"
