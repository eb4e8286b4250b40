"""glibc malloc kept from handing big blocks back to the kernel
(``malloc_tuning``). Stdlib only.

TensorFlow's CPU allocator is the C library's ``malloc``. With glibc's
defaults a block above the mmap threshold (128 KiB, raised dynamically up to
32 MiB) is a fresh ``mmap`` and goes back to the kernel when freed, and free
memory above the heap's top beyond the trim threshold (twice the dynamic
mmap threshold) is returned too. A step that allocates and frees the same
tens of megabytes every time (a heterogeneous trainer's concatenations,
gathers and splits of keys, rows and their gradients) then maps, faults in
and unmaps them every step: page faults and ``munmap`` in the kernel, on the
rank's CPU.

:func:`tune` sets, through ``mallopt``, a fixed mmap threshold of
:data:`MMAP_THRESHOLD` (blocks up to it come from the heap; a fixed value
also ends the dynamic adjustment), a trim threshold of
:data:`TRIM_THRESHOLD` and a top pad of :data:`TOP_PAD`: freed blocks stay
in the process for the next step's allocations. The cost is memory held:
free memory at a heap's top is kept up to the trim threshold instead of
returned (the peak is what the process used at once, as before).

A parameter the user set in the environment (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_`` or the matching
``glibc.malloc.*`` entry of ``GLIBC_TUNABLES``, which glibc read at start-up)
is left as the user set it. Where the C library is not glibc (no
``mallopt``) nothing changes and one line is logged.

:func:`apply` is the process's one decision, taken at the first set-up that
asks (``HeterTrainer`` before it allocates anything, the runtime's set-up
otherwise): ``malloc_tuning`` unset tunes a heterogeneous trainer's ranks
only, ``True`` every rank, ``False`` none.
"""
import ctypes
import threading

ENV = "HOROVOD_PRIO_MALLOC_TUNING"
MMAP_THRESHOLD = 256 << 20
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20
# (name, mallopt parameter, value, glibc's environment variable, GLIBC_TUNABLES name)
SETTINGS = (
    ("mmap threshold", -3, MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"),
    ("trim threshold", -1, TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold"),
    ("top pad", -2, TOP_PAD, "MALLOC_TOP_PAD_", "glibc.malloc.top_pad"),
)

_lock = threading.Lock()
_decided = None         # the process's outcome, once a set-up decided (apply)


def _size(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def user_set(environ):
    """The glibc variables of :data:`SETTINGS` the environment sets (their
    ``MALLOC_*_`` names, or the ``GLIBC_TUNABLES`` entry)."""
    tunables = {part.split("=", 1)[0].strip()
                for part in str(environ.get("GLIBC_TUNABLES", "")).split(":") if "=" in part}
    out = []
    for _, _, _, var, tunable in SETTINGS:
        if environ.get(var) is not None:
            out.append(var)
        elif tunable in tunables:
            out.append("GLIBC_TUNABLES " + tunable)
    return out


def glibc_mallopt():
    """``mallopt`` of the process's C library if it is glibc, else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version            # glibc's own symbol
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def tune(log, environ, why, mallopt=None):
    """Set :data:`SETTINGS` with ``mallopt`` (default: glibc's, found now),
    each unless the environment sets it. One log line. Returns
    ``{name: value}`` of what was set (empty where there is no glibc)."""
    fn = glibc_mallopt() if mallopt is None else mallopt
    if not fn:
        log.info("horovod_prio: %s: the C library is not glibc (no mallopt): malloc keeps its "
                 "own settings", ENV)
        return {}
    kept = user_set(environ)
    done, refused = {}, []
    for (name, param, value, var, tunable) in SETTINGS:
        if var in kept or "GLIBC_TUNABLES " + tunable in kept:
            continue
        if fn(param, value) == 1:
            done[name] = value
        else:
            refused.append(name)
    text = ", ".join("%s %s" % (n, _size(v)) for n, v in done.items()) or "nothing set"
    if kept:
        text += "; from the environment, kept: " + ", ".join(kept)
    if refused:
        log.warning("horovod_prio: %s: glibc refused mallopt of the %s; %s", ENV,
                    " and ".join(refused), text)
    else:
        log.info("horovod_prio: glibc malloc keeps freed blocks for reuse (%s): %s (%s=0: "
                 "glibc's defaults)", why, text, ENV)
    return done


def decided():
    """What the process's decision set (``{}``: not tuned), or None before any set-up decided."""
    return _decided


def apply(config, heter, log, environ=None, mallopt=None):
    """The process's decision (the first call decides, later ones return it):
    tune where ``config.malloc_tuning`` is True, or unset and ``heter`` (a
    heterogeneous trainer's rank). Returns what :func:`tune` set (empty: not
    tuned)."""
    global _decided
    import os
    with _lock:
        if _decided is not None:
            return _decided
        want = config.malloc_tuning
        if want is None:
            want = bool(heter)
        if not want:
            _decided = {}
        else:
            why = "a heterogeneous trainer's rank" if heter else ENV + "=1"
            _decided = tune(log, os.environ if environ is None else environ, why, mallopt)
        return _decided
