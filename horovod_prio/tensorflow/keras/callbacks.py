"""horovod.tensorflow.keras.callbacks, re-exported (every public name).

One repair: on TensorFlow >= 2.16, horovod 0.28.1's Keras callbacks take
``keras.backend`` (Keras 3) as their backend, which has no ``get_value`` /
``set_value``, so e.g. ``LearningRateWarmupCallback`` fails inside
``model.fit`` - also in unmodified Horovod scripts. Horovod jobs on TF 2.16
run Keras 2 from ``tf_keras`` (``TF_USE_LEGACY_KERAS=1``); when that is the
case here, Horovod's callbacks are pointed at ``tf.keras.backend`` (tf_keras),
whose ``get_value`` they need.

Also the guard ``hvd.overlap`` puts around a ``fit``'s callbacks
(:func:`guard_callbacks`, :class:`FlushAtEpochEnd`): a callback that may read
or write weights between steps sees them with every pending overlapped
update applied (docs/overlap.md).
"""
import logging

import horovod.tensorflow.keras.callbacks as _impl
import tensorflow as tf

from horovod_prio.runtime import get_runtime
from horovod_prio.tensorflow.overlapped import _classes

log = logging.getLogger("horovod_prio")


def _use_the_running_keras_backend():
    if hasattr(_impl.K, "get_value"):
        return False
    import tensorflow as tf
    backend = getattr(getattr(tf, "keras", None), "backend", None)
    if backend is None or not hasattr(backend, "get_value"):
        return False
    _impl.K = backend       # horovod 0.28.1 reads the backend from this module global
    return True


REPAIRED_BACKEND = _use_the_running_keras_backend()

globals().update({_n: getattr(_impl, _n) for _n in dir(_impl) if not _n.startswith("_")})


def __getattr__(name):
    return getattr(_impl, name)


# --------------------------------------------------------------------------- hvd.overlap's guard
def _safe_callback_classes():
    names = ("History", "ProgbarLogger", "BaseLogger", "TerminateOnNaN", "CSVLogger",
             "TensorBoard", "LearningRateScheduler", "ReduceLROnPlateau", "EarlyStopping",
             "ModelCheckpoint", "RemoteMonitor")
    safe = _classes(tf.keras.callbacks, names)
    try:
        from horovod._keras import callbacks as hk
        safe += _classes(hk, ("MetricAverageCallbackImpl", "LearningRateScheduleCallbackImpl"))
    except ImportError:  # pragma: no cover
        pass
    return safe


def _broadcast_class():
    try:
        from horovod._keras.callbacks import BroadcastGlobalVariablesCallbackImpl
        return BroadcastGlobalVariablesCallbackImpl
    except ImportError:  # pragma: no cover
        return ()


_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


def _is_default(method):
    return bool(getattr(method, "_is_default", False))


def guard_callbacks(callbacks, do_flush):
    """Make batch-level callbacks that may touch weights flush first. Returns an
    undo function (the callbacks are the user's objects)."""
    undo = []
    safe, bcast = _safe_callback_classes(), _broadcast_class()
    for cb in callbacks:
        if getattr(cb, "hvd_prio_overlap_safe", False) or isinstance(cb, safe) \
                or isinstance(cb, FlushAtEpochEnd):
            continue
        hooks = [h for h in _BATCH_HOOKS if hasattr(cb, h) and not _is_default(getattr(cb, h))]
        if bcast and isinstance(cb, bcast):
            hooks = ["on_batch_end"]
            cond = lambda cb=cb: not cb.broadcast_done  # noqa: E731 - flush before its broadcast
        else:
            cond = lambda: True  # noqa: E731
            if hooks and get_runtime().first_time(("overlap callback", type(cb))):
                log.info("horovod_prio: overlap: callback %s has batch hooks that may read or write "
                         "weights, so pending updates are flushed before each of them (set "
                         "`hvd_prio_overlap_safe = True` on it if it touches no weights)",
                         type(cb).__name__)
        for h in hooks:
            orig = getattr(cb, h)

            def hook(*args, _orig=orig, _cond=cond, **kwargs):
                if _cond():
                    do_flush()
                return _orig(*args, **kwargs)

            had = h in cb.__dict__
            old = cb.__dict__.get(h)
            cb.__dict__[h] = hook
            undo.append((cb, h, had, old))

    def restore():
        for cb, h, had, old in reversed(undo):
            if had:
                cb.__dict__[h] = old
            else:
                cb.__dict__.pop(h, None)
    return restore


class FlushAtEpochEnd(tf.keras.callbacks.Callback):
    """First callback of an overlapped fit: pending updates are applied before
    any other callback sees the epoch's end."""

    def __init__(self, do_flush):
        super().__init__()
        self._do_flush = do_flush

    def on_epoch_end(self, epoch, logs=None):
        self._do_flush()
