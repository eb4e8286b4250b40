"""The TensorFlow kernels of horovod_prio (``kernels/ops.cc``) as Python ops.

``libhvdprio_tf_kernels_tf<version>.so`` is built per TensorFlow version
(``make install``) and linked to the scheduler library, so the gates submit to
the very scheduler ``horovod_prio.scheduler.Scheduler.process()`` configures.
It is loaded once, as an op library (the graph ops) and through ctypes (the
step clock's ``hvdprio_tf_*`` functions) on the same path.

Per gradient chunk (on every rank; only rank 0's scheduler holds)::

    y = allreduce(chunk, priority, name, op)   # held until released, then Horovod's
                                               # allreduce; completes in its callback

or, where that op has no kernel (GPU tensors), the same in three ops::

    x = gate(chunk, priority, name)        # held until the scheduler releases it
    y = hvd.allreduce(x, name=name)
    y = done(y, name)                      # frees the chunk's in-flight bytes

Per step: ``priorities = step_begin(slot, n)`` before the gates,
``step_end(slot, deps)`` after the last ``done``.
"""
import ctypes
import glob
import os
import threading

import numpy as np
import tensorflow as tf

from horovod_prio.scheduler import BUILD_HINT, SchedulerError, library_path as scheduler_path

__all__ = ["KernelLibraryError", "kernel_library_path", "load", "library", "gate", "allreduce", "done",
           "step_begin", "step_end", "StepClock", "independent"]

_HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
_lock = threading.Lock()
_ops = None
_cdll = None


class KernelLibraryError(SchedulerError):
    """The TensorFlow kernel library is missing or cannot be loaded."""


def kernel_library_path(tf_version=None):
    """Real path of the kernel library built for the running TensorFlow."""
    version = tf_version or tf.__version__
    name = "libhvdprio_tf_kernels_tf%s.so" % version.replace(".", "_")
    path = os.path.join(_HERE, name)
    if not os.path.exists(path):
        present = sorted(os.path.basename(p) for p in glob.glob(os.path.join(_HERE, "*.so")))
        raise KernelLibraryError(
            "horovod_prio TensorFlow kernels for TensorFlow %s not found (%s; present: %s): %s"
            % (version, path, ", ".join(present) or "none", BUILD_HINT))
    return os.path.realpath(path)


# Every C function of the kernel library, declared once: (name, restype, argtypes).
_i64, _int, _dbl, _cp = ctypes.c_int64, ctypes.c_int, ctypes.c_double, ctypes.c_char_p
_C_FUNCTIONS = (
    # the step clock (kernels/ops.cc)
    ("hvdprio_tf_slot_new", _i64, [ctypes.POINTER(ctypes.c_int32), _i64]),
    ("hvdprio_tf_set_priorities", _int, [_i64, ctypes.POINTER(ctypes.c_int32), _i64]),
    ("hvdprio_tf_wait", _int, [_dbl]),
    ("hvdprio_tf_take_steps", _i64, [_i64, ctypes.POINTER(_dbl), _i64, ctypes.POINTER(_i64)]),
    ("hvdprio_tf_steps_begun", _i64, []),
    ("hvdprio_tf_wake", None, []),
    # barrier crossing's channels (kernels/overlap.cc)
    ("hvdprio_overlap_new", _i64, [_cp, _i64, _i64, _i64]),
    ("hvdprio_overlap_flush", _int, [_i64, _dbl]),
    ("hvdprio_overlap_fail", None, [_i64, _cp]),
    ("hvdprio_overlap_close", None, [_i64]),
    ("hvdprio_overlap_state", _int, [_i64]),
    ("hvdprio_overlap_error", _i64, [_i64, _cp, _i64]),
    ("hvdprio_overlap_stats_fields", _cp, []),
    ("hvdprio_overlap_stats", _int, [_i64, ctypes.POINTER(_i64), _int]),
    ("hvdprio_overlap_set_tracing", None, [_int]),
    ("hvdprio_overlap_drain_events", _i64, [_cp, _i64]),
)


@tf.autograph.experimental.do_not_convert
def load():
    """Load (once) and return the op module (:func:`library` gives the C functions too)."""
    return library()[0]


@tf.autograph.experimental.do_not_convert
def library():
    """``(op module, ctypes library)`` of the kernel library: the one loader of it.

    Never converted by autograph: a converted copy of this function would
    assign the module globals below in autograph's namespace, not this
    module's, and every later use would find the library unloaded.
    """
    global _ops, _cdll
    with _lock:
        if _ops is not None:
            return _ops, _cdll
        scheduler_path()  # a clear error if the scheduler library is missing
        path = kernel_library_path()
        try:
            ops = tf.load_op_library(path)
        except Exception as e:  # tf.errors.NotFoundError on undefined symbols etc.
            raise KernelLibraryError(
                "cannot load the horovod_prio kernels %s (%s: %s); they were probably built "
                "against another TensorFlow: %s" % (path, type(e).__name__, e, BUILD_HINT)) from e
        lib = ctypes.CDLL(path)
        for name, res, args in _C_FUNCTIONS:
            try:
                fn = getattr(lib, name)
            except AttributeError as e:
                raise KernelLibraryError("stale kernel library %s (%s): %s"
                                         % (path, e, BUILD_HINT)) from e
            fn.restype, fn.argtypes = res, args
        _register_gradients()
        _cdll, _ops = lib, ops
        return _ops, _cdll


def _register_gradients():
    # Gradients flow straight through (the ops are identities on the data).
    from tensorflow.python.framework import ops as tf_ops
    for op_type, n_inputs in (("HvdPrioGate", 2), ("HvdPrioDone", 1)):
        def _grad(op, grad, _n=n_inputs):
            return [grad] + [None] * (_n - 1)
        try:
            tf_ops.RegisterGradient(op_type)(_grad)
        except KeyError:  # already registered (module reloaded)
            pass

    def _allreduce_grad(op, grad):
        # As Horovod's own HorovodAllreduce gradient: the same reduction of grad.
        from horovod.tensorflow import mpi_ops
        return [mpi_ops._allreduce(
            grad, op=op.get_attr("reduce_op"), prescale_factor=op.get_attr("prescale_factor"),
            postscale_factor=op.get_attr("postscale_factor"),
            process_set=mpi_ops._temp_process_set_object(op.get_attr("process_set_id"))), None]
    try:
        tf_ops.RegisterGradient("HvdPrioAllreduce")(_allreduce_grad)
    except KeyError:
        pass
    for op_type in ("HvdPrioStepBegin", "HvdPrioStepEnd"):
        try:
            tf_ops.NotDifferentiable(op_type)
        except KeyError:
            pass


def _check_name(name, what):
    if not isinstance(name, str) or not name:
        raise ValueError("%s: name must be a non-empty str, got %r" % (what, name))


def _priority_tensor(priority, name, what):
    if isinstance(priority, bool):
        raise ValueError("%s(%s): priority must be an int, got %r" % (what, name, priority))
    if isinstance(priority, int) and not -2**31 <= priority < 2**31:
        raise ValueError("%s(%s): priority must fit in int32, got %r" % (what, name, priority))
    return tf.cast(priority, tf.int32) if tf.is_tensor(priority) else tf.constant(
        priority, dtype=tf.int32)


def gate(tensor, priority, name, abandon_on_cancel=None, nbytes=None):
    """Return ``tensor`` once the scheduler releases chunk ``name`` (op HvdPrioGate).

    ``priority``: int or int32 scalar tensor, higher goes first.
    ``abandon_on_cancel``: a chunk still in flight when the step (the function
    call) is cancelled or ends is abandoned; default: when built in a graph,
    where the chunk's ``done`` runs in the same call. Pass False for a chunk
    whose ``done`` runs in a later call.
    ``nbytes``: the chunk's size for the scheduler and the arbiter (an int >= 0),
    default the tensor's bytes: a collective whose other members send parts
    of their own is asked for with all of them.
    """
    _check_name(name, "gate")
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer))
                               or nbytes < 0):
        raise ValueError("gate(%r): nbytes=%r, give an int >= 0 or None" % (name, nbytes))
    ops = load()
    priority = _priority_tensor(priority, name, "gate")
    if abandon_on_cancel is None:
        abandon_on_cancel = not tf.executing_eagerly()
    return independent(ops.hvd_prio_gate(tensor, priority, chunk_name=name,
                                         abandon_on_cancel=bool(abandon_on_cancel),
                                         nbytes=-1 if nbytes is None else int(nbytes)))


def allreduce(tensor, priority, name, op, prescale_factor=1.0, postscale_factor=1.0,
              process_set_id=0, abandon_on_cancel=None):
    """``gate`` + Horovod's allreduce + ``done`` as one op (HvdPrioAllreduce, CPU).

    Held until the scheduler releases chunk ``name``; then Horovod's own
    ``HorovodAllreduce`` kernel runs on it (tensor name ``name``, reduce op
    ``op``, the scale factors and process set: what ``hvd.allreduce(...,
    name=name, ignore_name_scope=True)`` builds, so the arithmetic is Horovod's)
    from the releasing thread, and the chunk completes in Horovod's callback:
    a chunk granted while TensorFlow's inter-op threads are busy reaches
    Horovod at once. ``priority`` and ``abandon_on_cancel`` as for :func:`gate`.
    """
    _check_name(name, "allreduce")
    ops = load()
    priority = _priority_tensor(priority, name, "allreduce")
    if abandon_on_cancel is None:
        abandon_on_cancel = not tf.executing_eagerly()
    # The node is named after the chunk: Horovod's tensor name is that name
    # without its scope, uniquified by TensorFlow as hvd.allreduce's would be.
    return independent(ops.hvd_prio_allreduce(
        tensor, priority, chunk_name=name, abandon_on_cancel=bool(abandon_on_cancel),
        reduce_op=int(op), prescale_factor=float(prescale_factor),
        postscale_factor=float(postscale_factor), process_set_id=int(process_set_id),
        name=name))


def done(tensor, name):
    """Mark chunk ``name`` finished and return ``tensor`` (op HvdPrioDone)."""
    _check_name(name, "done")
    return independent(load().hvd_prio_done(tensor, chunk_name=name))


def step_begin(slot, num_groups):
    """The step starts: int32[num_groups] priority vector of monitor ``slot``."""
    return independent(load().hvd_prio_step_begin(slot=slot, num_groups=num_groups))


def step_end(slot, after):
    """The step's gradients are reduced: stamp monitor ``slot`` after the tensors ``after``."""
    with tf.control_dependencies([t for t in after if t is not None]):
        op = load().hvd_prio_step_end(slot=slot)
    return independent(op)


def independent(out):
    """Exempt an op from tf.function's automatic control dependencies.

    The ops are stateful (so grappler never folds, dedupes or prunes them), and
    tf.function chains stateful ops without resource inputs in program order:
    gate0 -> done0 -> gate1 -> ... would serialise the chunks and leave the
    scheduler nothing to choose from. run_independently() keeps them "must
    run" but lets them run in parallel, ordered only by their data edges.
    """
    if tf.executing_eagerly():
        return out
    op = out if isinstance(out, tf.Operation) else out.op
    acd = getattr(op.graph, "experimental_acd_manager", None)
    if acd is not None:
        acd.run_independently(op)
    return out


class StepClock:
    """The step clock of the kernels, as the runtime's monitors use it
    (see :mod:`horovod_prio.runtime.monitor`)."""

    _instance = None

    @classmethod
    @tf.autograph.experimental.do_not_convert
    def get(cls):
        load()
        with _lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def new_slot(self, priorities):
        arr = (ctypes.c_int32 * len(priorities))(*priorities)
        return int(_cdll.hvdprio_tf_slot_new(arr, len(priorities)))

    def set_priorities(self, slot, priorities):
        arr = (ctypes.c_int32 * len(priorities))(*priorities)
        if _cdll.hvdprio_tf_set_priorities(slot, arr, len(priorities)) != 0:
            raise ValueError("set_priorities: bad slot %r or size %d" % (slot, len(priorities)))

    def wait(self, timeout):
        return bool(_cdll.hvdprio_tf_wait(float(timeout)))

    def take_steps(self, slot):
        out = []
        buf = (ctypes.c_double * 512)()
        dropped = ctypes.c_int64(0)
        while True:
            n = _cdll.hvdprio_tf_take_steps(slot, buf, 256, ctypes.byref(dropped))
            out.extend((buf[2 * i], buf[2 * i + 1]) for i in range(max(n, 0)))
            if n < 256:
                return out

    def steps_begun(self):
        """How many steps have begun in this process (every monitor's);
        the arbiter link tags its requests with it."""
        return int(_cdll.hvdprio_tf_steps_begun())

    @property
    def steps_begun_address(self):
        """Address of the C function behind :meth:`steps_begun` (the native
        arbiter client reads the step tag there, without Python)."""
        return ctypes.cast(_cdll.hvdprio_tf_steps_begun, ctypes.c_void_p).value

    def wake(self):
        _cdll.hvdprio_tf_wake()
