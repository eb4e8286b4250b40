"""Loader and Python wrapper of the C++ release scheduler op.

The shared object ``_scheduler_ops*.so`` (built by ``setup.py build_ext`` from
``scheduler.cc`` + ``ops.cc`` against the installed TensorFlow) is loaded once,
both as a TensorFlow op library (``HvdPrioGate`` / ``HvdPrioDone``) and through
ctypes for its ``hvdprio_*`` C API.  Both use the same real path, so the
dynamic loader hands back the same handle and there is one scheduler per
process.

TensorFlow is imported lazily, inside the functions.

Usage per gradient chunk (on every rank; only rank 0 configures hold=True)::

    x = gate(chunk, priority, name)        # held until the scheduler releases it
    y = hvd.allreduce(x)
    y = done(y, name)                      # frees the chunk's in-flight bytes
"""
import ctypes
import glob
import json
import os
import sysconfig
import threading

__all__ = [
    "SchedulerOpError", "library_path", "load", "gate", "done", "configure",
    "set_tracing", "set_max_events", "drain_events", "stats", "reset", "abandon_inflight",
    "set_external_grant", "set_grant_callbacks", "grant", "STATS_FIELDS",
]

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD_HINT = ("build it with `make install` or "
               "`pip install --no-build-isolation --no-deps -e .` "
               "(or `python setup.py build_ext --inplace`) in the repository root")

_lock = threading.RLock()
_ops = None
_cdll = None
_path = None
# ctypes callback thunks are never freed: a TF thread may still be inside an
# old one right after it was replaced.
_grant_callbacks = []

STATS_FIELDS = (
    "submitted", "released", "completed", "max_inflight_bytes", "queued",
    "inflight_bytes", "inflight_chunks", "unknown_completions", "dropped_events",
    "credit_bytes", "hold", "external_grant", "requested", "unknown_grants", "tracing",
    "cancelled", "abandoned",
)

_REQUEST_CB = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64)
_COMPLETE_CB = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


class SchedulerOpError(RuntimeError):
    """The scheduler op library is missing or cannot be loaded."""


def _tf_version():
    import tensorflow as tf
    return tf.__version__


def library_path(tf_version=None):
    """Real path of ``_scheduler_ops_tf<version>*.so`` built for the running TF.

    setup.py names the library after the TF it was compiled against, so the
    venvs of two stacks (``make install TF=...``) can share one checkout.
    Raises SchedulerOpError if there is none for this TF.
    """
    version = tf_version or _tf_version()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    name = "_scheduler_ops_tf%s" % version.replace(".", "_")
    exact = os.path.join(_HERE, name + suffix)
    if os.path.exists(exact):
        return os.path.realpath(exact)
    found = sorted(glob.glob(os.path.join(_HERE, name + "*.so")))
    if not found:
        others = sorted(os.path.basename(p) for p in glob.glob(os.path.join(_HERE, "_scheduler_ops*.so")))
        raise SchedulerOpError(
            "horovod_prio scheduler op library for TensorFlow %s not found (looked for %s%s; "
            "present: %s): %s" % (version, os.path.join(_HERE, name), suffix,
                                  ", ".join(others) or "none", _BUILD_HINT))
    return os.path.realpath(found[0])


def _setup_ctypes(lib):
    i64, i64p, c_int = ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_int
    sigs = {
        "hvdprio_configure": (c_int, [i64, c_int]),
        "hvdprio_set_tracing": (None, [c_int]),
        "hvdprio_set_max_events": (None, [i64]),
        "hvdprio_drain_events": (i64, [ctypes.c_char_p, i64]),
        "hvdprio_stats_fields": (ctypes.c_char_p, []),
        "hvdprio_stats": (c_int, [i64p, c_int]),
        "hvdprio_reset": (c_int, []),
        "hvdprio_abandon_inflight": (i64, []),
        "hvdprio_set_external_grant": (None, [c_int]),
        "hvdprio_set_grant_callbacks": (None, [_REQUEST_CB, _COMPLETE_CB]),
        "hvdprio_grant": (c_int, [ctypes.c_char_p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    fields = tuple(lib.hvdprio_stats_fields().decode().split(","))
    if fields != STATS_FIELDS:
        raise SchedulerOpError(
            "stale scheduler op library %s (stats fields %s); rebuild it: %s"
            % (_path, fields, _BUILD_HINT))


def load():
    """Load (once) and return the TF op module with ``hvd_prio_gate`` / ``hvd_prio_done``."""
    global _ops, _cdll, _path
    with _lock:
        if _ops is not None:
            return _ops
        path = library_path()
        import tensorflow as tf  # lazily: the .so needs libtensorflow_framework
        try:
            ops = tf.load_op_library(path)
        except Exception as e:  # tf.errors.NotFoundError on undefined symbols etc.
            raise SchedulerOpError(
                "cannot load the horovod_prio scheduler op library %s (%s: %s); it was probably "
                "built against another TensorFlow; re%s"
                % (path, type(e).__name__, e, _BUILD_HINT)) from e
        # Same path -> dlopen returns the handle TF already holds: one Scheduler.
        lib = ctypes.CDLL(path)
        _path = path
        _setup_ctypes(lib)
        _register_gradients(tf)
        _cdll, _ops = lib, ops
        return _ops


def _register_gradients(tf):
    # Gradients flow straight through (the ops are identities on the data).
    from tensorflow.python.framework import ops as tf_ops
    for op_type, n_inputs in (("HvdPrioGate", 2), ("HvdPrioDone", 1)):
        def _grad(op, grad, _n=n_inputs):
            return [grad] + [None] * (_n - 1)
        try:
            tf_ops.RegisterGradient(op_type)(_grad)
        except KeyError:  # already registered (module reloaded)
            pass


def _lib():
    if _cdll is None:
        load()
    return _cdll


def _check_name(name, what):
    if not isinstance(name, str) or not name:
        raise ValueError("%s: name must be a non-empty str, got %r" % (what, name))


def gate(tensor, priority, name):
    """Return ``tensor`` once the scheduler releases chunk ``name`` (graph op HvdPrioGate).

    ``priority``: int or int32 scalar tensor, higher goes first.
    """
    _check_name(name, "gate")
    ops = load()
    import tensorflow as tf
    if isinstance(priority, bool):
        raise ValueError("gate(%s): priority must be an int, got %r" % (name, priority))
    if isinstance(priority, int) and not -2**31 <= priority < 2**31:
        raise ValueError("gate(%s): priority must fit in int32, got %r" % (name, priority))
    priority = tf.cast(priority, tf.int32) if tf.is_tensor(priority) else tf.constant(
        priority, dtype=tf.int32)
    return _independent(ops.hvd_prio_gate(tensor, priority, chunk_name=name))


def done(tensor, name):
    """Mark chunk ``name`` finished and return ``tensor`` (graph op HvdPrioDone)."""
    _check_name(name, "done")
    return _independent(load().hvd_prio_done(tensor, chunk_name=name))


def _independent(out):
    """Exempt the op from tf.function's automatic control dependencies.

    The ops are stateful (so grappler never folds, dedupes or prunes them), and
    tf.function chains stateful ops without resource inputs in program order:
    gate0 -> done0 -> gate1 -> ... would serialise the chunks and leave the
    scheduler nothing to choose from.  run_independently() keeps them "must
    run" but lets them run in parallel, ordered only by their data edges.
    """
    import tensorflow as tf
    if tf.executing_eagerly():
        return out
    acd = getattr(out.graph, "experimental_acd_manager", None)
    if acd is not None:
        acd.run_independently(out.op)
    return out


def configure(credit_bytes, hold):
    """Set the in-flight byte credit (int >= 0) and whether to hold chunks (rank 0: True)."""
    if isinstance(credit_bytes, bool) or not isinstance(credit_bytes, int):
        raise ValueError("configure: credit_bytes must be an int >= 0, got %r" % (credit_bytes,))
    if credit_bytes < 0 or credit_bytes >= 2**63:
        raise ValueError("configure: credit_bytes must be an int >= 0, got %r" % (credit_bytes,))
    if not isinstance(hold, bool):
        raise ValueError("configure: hold must be a bool, got %r" % (hold,))
    if _lib().hvdprio_configure(credit_bytes, int(hold)) != 0:
        raise ValueError("configure: credit_bytes rejected by the scheduler: %r" % (credit_bytes,))


def set_tracing(on):
    """Record ready/release/done events (see drain_events)."""
    _lib().hvdprio_set_tracing(int(bool(on)))


def set_max_events(n):
    """Bound of the event buffer (default 1,000,000); extra events are counted as dropped."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError("set_max_events: n must be an int >= 0, got %r" % (n,))
    _lib().hvdprio_set_max_events(n)


def drain_events():
    """Return and forget the recorded events, oldest first, as dicts with keys
    kind ("ready"|"request"|"release"|"done"|"cancel"), name, priority, bytes,
    t_us (system clock, microseconds; compare with time.time()*1e6), queued,
    inflight_bytes and, for "request"/"release", waiting_max_priority."""
    lib = _lib()
    cap = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = lib.hvdprio_drain_events(buf, cap)
        if n >= 0:
            text = buf.raw[:n].decode("utf-8", "replace")
            return [json.loads(line) for line in text.splitlines() if line]
        cap = max(-n, cap * 2)


def stats():
    """Counters and current state as a dict (keys: STATS_FIELDS); hold/tracing/external_grant are bools."""
    lib = _lib()
    arr = (ctypes.c_int64 * len(STATS_FIELDS))()
    lib.hvdprio_stats(arr, len(STATS_FIELDS))
    out = dict(zip(STATS_FIELDS, (int(v) for v in arr)))
    for k in ("hold", "tracing", "external_grant"):
        out[k] = bool(out[k])
    return out


def reset():
    """Back to defaults (credit 0, hold off, tracing off, counters/events cleared).
    Raises RuntimeError if chunks are still held (their ops would never finish)."""
    if not _lib().hvdprio_reset():
        raise RuntimeError("reset: refused, chunks are still waiting in the scheduler: %r" % stats())


def abandon_inflight():
    """Forget released chunks whose Done will never run (call after a failed step, else
    their bytes stay "in flight" and may hold later chunks forever); returns how many.
    Chunks still held when a step is aborted are withdrawn automatically (the gate
    fails with Cancelled)."""
    return int(_lib().hvdprio_abandon_inflight())


def set_external_grant(on):
    """Hook for a cross-job arbiter: when on (and hold is on), a chunk that passes the
    local rule is reported to the request callback and released only by grant(name).
    Turning it off releases every pending request."""
    _lib().hvdprio_set_external_grant(int(bool(on)))


def set_grant_callbacks(request=None, complete=None):
    """request(name: str, priority: int, bytes: int) is called when a chunk asks for a
    grant; complete(name: str) when a granted chunk's Done runs.  Called from TF threads,
    outside the scheduler lock; they must not block.  None unregisters."""
    lib = _lib()
    # A CFUNCTYPE instantiated without arguments is a NULL function pointer.
    req = _REQUEST_CB(lambda n, p, b: request(n.decode(), int(p), int(b))) if request \
        else _REQUEST_CB()
    com = _COMPLETE_CB(lambda n: complete(n.decode())) if complete else _COMPLETE_CB()
    with _lock:
        _grant_callbacks.append((req, com))
        lib.hvdprio_set_grant_callbacks(req, com)


def grant(name):
    """Release requested chunk ``name``; returns False if no such request is pending."""
    _check_name(name, "grant")
    return bool(_lib().hvdprio_grant(name.encode()))
