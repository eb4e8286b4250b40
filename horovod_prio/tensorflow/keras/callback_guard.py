"""Which Keras callbacks make an overlapped ``fit`` flush, and when.

Under ``hvd.overlap(model)`` a step's updates are applied while the next step
runs. ``fit`` flushes (waits until every posted update is applied) before it
starts, at every epoch end before any callback sees it, and at its end; so
epoch-level hooks always see applied weights. A *batch* hook runs between two
steps, while updates may be pending: a hook that reads or writes weights
there needs a flush first, and a flush before every step removes the next
step's head start, i.e. most of what ``hvd.overlap`` gains.

:func:`decide` gives, per callback, which batch hooks flush and when;
:func:`guard` applies the decisions to a ``fit`` call's callbacks (and undoes
them afterwards: they are the user's objects). The decisions:

====================================== ============================================================
callback                               decision
====================================== ============================================================
``hvd_prio_overlap_safe = True``       no flush (the user declares its batch hooks weight-free)
History, BaseLogger, ProgbarLogger,    no flush: their batch hooks read only the ``logs`` dict
TerminateOnNaN, CSVLogger,             (metrics of the step that just ran), or they have none
RemoteMonitor, EarlyStopping,
LearningRateScheduler, ReduceLROnPlat.
tqdm's ``TqdmCallback``                no flush: a progress bar over the ``logs`` dict
TensorBoard, any ``update_freq``       no flush: its batch hooks write the ``logs`` scalars, the
                                       steps/s and the graph, and start/stop the profiler; weight
                                       histograms and images are written at epoch end (flushed)
ModelCheckpoint / Horovod's            no flush from the guard: ``save_freq='epoch'`` saves at
BestModelCheckpoint                    epoch end (flushed); an int ``save_freq`` saves through
                                       ``model.save``/``save_weights``, which flush first under
                                       ``hvd.overlap`` - a flush only on the batches it saves
BackupAndRestore                       ``save_freq='epoch'``: no flush. An int ``save_freq``: a
                                       flush before ``on_train_batch_end`` only on the batches it
                                       backs up (it writes a ``tf.train.Checkpoint``, which the
                                       model's wrappers do not see)
Horovod's BroadcastGlobalVariables     a flush before its broadcast (first batch), then none
Horovod's MetricAverage,               no flush: they average the ``logs`` at epoch end / set the
LearningRateSchedule/Warmup            learning rate, which each step posts with its gradients
anything else with a batch hook        a flush before each call of each hook it overrides (once
(LambdaCallback with a batch           per step per hook), and ONE warning per class naming it
function, user callbacks)              and the cost
====================================== ============================================================
"""
import collections
import logging

import tensorflow as tf

log = logging.getLogger("horovod_prio")

BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")

_SAFE_KERAS = ("History", "BaseLogger", "ProgbarLogger", "TerminateOnNaN", "CSVLogger",
               "RemoteMonitor", "EarlyStopping", "LearningRateScheduler", "ReduceLROnPlateau",
               "TensorBoard", "ModelCheckpoint")
_SAFE_HOROVOD = ("MetricAverageCallbackImpl", "LearningRateScheduleCallbackImpl")
#: third-party callbacks known to read only the logs dict, by "module.class"
SAFE_THIRD_PARTY = ("tqdm.keras.TqdmCallback",)

_warned = set()       # classes warned about (once per class and process)

#: ``flush``: per overridden batch hook, ``None`` (never) or ``cond(cb) -> bool``
#: evaluated before each call; ``warn``: the guard logs the cost once.
Decision = collections.namedtuple("Decision", "flush warn reason")



def _always(cb):
    return True


def _classes(module, names):
    return tuple(c for c in (getattr(module, n, None) for n in names) if isinstance(c, type))


def _horovod(names):
    try:
        from horovod._keras import callbacks as hk
    except ImportError:  # pragma: no cover
        return ()
    return _classes(hk, names)


def _is_default(method):
    return bool(getattr(method, "_is_default", False))


def overridden_batch_hooks(cb):
    return [h for h in BATCH_HOOKS if hasattr(cb, h) and not _is_default(getattr(cb, h))]


def _qualname(cls):
    return "%s.%s" % (cls.__module__, cls.__name__)


def _third_party_safe(cb):
    return any(_qualname(c) in SAFE_THIRD_PARTY for c in type(cb).__mro__)


def _backup_due(cb):
    """BackupAndRestore(save_freq=N): its next ``on_train_batch_end`` backs up."""
    return cb._batches_count + 1 >= cb.save_freq


def decide(cb):
    """The :class:`Decision` for callback ``cb`` (see the module's table)."""
    kc = tf.keras.callbacks
    if getattr(cb, "hvd_prio_overlap_safe", False):
        return Decision({}, False, "declared safe (hvd_prio_overlap_safe)")
    bcast = _horovod(("BroadcastGlobalVariablesCallbackImpl",))
    if bcast and isinstance(cb, bcast):
        return Decision({"on_batch_end": lambda c: not c.broadcast_done}, False,
                        "flushes before its first-batch broadcast")
    backup = _classes(kc, ("BackupAndRestore",))
    if backup and isinstance(cb, backup):
        freq = getattr(cb, "save_freq", "epoch")
        if freq == "epoch" or not freq:
            return Decision({}, False, "backs up at epoch end (flushed)")
        if isinstance(freq, int) and hasattr(cb, "_batches_count"):
            return Decision({"on_train_batch_end": _backup_due}, False,
                            "flushes on the batches it backs up (every %d)" % freq)
        hooks = overridden_batch_hooks(cb)
        return Decision({h: _always for h in hooks}, bool(hooks),
                        "unknown BackupAndRestore version: flushes before every batch hook")
    if isinstance(cb, _classes(kc, _SAFE_KERAS) + _horovod(_SAFE_HOROVOD)):
        return Decision({}, False, "batch hooks read only the logs dict, or save through the "
                                   "model (which flushes)")
    if _third_party_safe(cb):
        return Decision({}, False, "a progress bar over the logs dict")
    hooks = overridden_batch_hooks(cb)
    return Decision({h: _always for h in hooks}, bool(hooks),
                    "not known to be weight-free: flushes before each batch hook")


def _warn(cb, hooks):
    cls = type(cb)
    if cls in _warned:
        return
    _warned.add(cls)
    log.warning("horovod_prio: hvd.overlap: callback %s overrides %s and is not known to leave "
                "weights alone, so pending updates are flushed before each call: %d flush(es) "
                "per training step, and the next step no longer starts while this one's layers "
                "are still being reduced (most of the overlap's gain is lost). If its batch "
                "hooks neither read nor write weights, set `hvd_prio_overlap_safe = True` on it "
                "(class or instance).", cls.__name__, ", ".join(hooks), len(hooks))


def guard(callbacks, do_flush):
    """Wrap the batch hooks of ``callbacks`` per :func:`decide` so that they
    call ``do_flush()`` first when due. Returns a function that undoes it."""
    undo = []
    for cb in callbacks:
        d = decide(cb)
        if d.warn:
            _warn(cb, list(d.flush))
        for h, cond in d.flush.items():
            if cond is None or not hasattr(cb, h):
                continue
            orig = getattr(cb, h)

            def hook(*args, _orig=orig, _cond=cond, _cb=cb, **kwargs):
                if _cond(_cb):
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
