"""horovod.tensorflow.keras.callbacks, re-exported (every public name), plus
:class:`PrioritySummaryCallback` (ours: what the priority path did, as
TensorBoard scalars and a summary at the end of ``fit``).

One repair: on TensorFlow >= 2.16, horovod 0.28.1's Keras callbacks take
``keras.backend`` (Keras 3) as their backend, which has no ``get_value`` /
``set_value``, so e.g. ``LearningRateWarmupCallback`` fails inside
``model.fit`` - also in unmodified Horovod scripts. Horovod jobs on TF 2.16
run Keras 2 from ``tf_keras`` (``TF_USE_LEGACY_KERAS=1``); when that is the
case here, Horovod's callbacks are pointed at ``tf.keras.backend`` (tf_keras),
whose ``get_value`` they need.
"""
import horovod.tensorflow.keras.callbacks as _impl


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


import os  # noqa: E402

import tensorflow as _tf  # noqa: E402


class PrioritySummaryCallback(_tf.keras.callbacks.Callback):
    """What horovod_prio did during ``fit``, on rank 0 (where steps are timed and
    priorities decided).

    * ``log_dir``: also write TensorBoard scalars there, under ``horovod_prio/``
      (give the Keras ``TensorBoard`` callback's ``log_dir`` to see them beside its
      logs): ``step_seconds`` and ``boost`` per training step, ``boost_change`` at
      each priority change, per monitor (optimizer/tape). Written at every epoch end.
    * ``verbose``: print a short summary at the end of ``fit`` (steps, step times,
      the boost and its changes, chunks submitted/released/abandoned, the most bytes
      in flight, overlap waits, arbiter grant waits and outages).

    The step times are the training step itself (from its first op to its last
    reduced gradient), not the gap between steps.
    """

    hvd_prio_overlap_safe = True   # reads counters only, never a weight

    def __init__(self, log_dir=None, verbose=1):
        super().__init__()
        if log_dir is not None and not isinstance(log_dir, str):
            raise TypeError("PrioritySummaryCallback: log_dir must be a path (str) or None, "
                            "got %r" % (log_dir,))
        self.log_dir = log_dir
        self.verbose = verbose
        self.summary = None        # the last summary dict (horovod_prio.runtime.summary)
        self._written = {}         # monitor name -> steps / events already written
        self._writer = None

    def _rank0(self):
        from horovod_prio.runtime import get_runtime
        rt = get_runtime()
        return rt if rt.rank == 0 else None

    def _write(self, rt):
        if self.log_dir is None:
            return
        tf = _tf
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir,
                                                                      "horovod_prio"))
        with self._writer.as_default():
            for m in list(rt.monitors):
                done_step, done_events = self._written.get(m.name, (-1, 0))
                prefix = "horovod_prio/%s/" % m.name
                for step, seconds, boost in list(m.recent):
                    if step > done_step:
                        tf.summary.scalar(prefix + "step_seconds", seconds, step=step)
                        tf.summary.scalar(prefix + "boost", boost, step=step)
                        done_step = step
                total = m.raises + m.decays           # every change so far
                new = min(total - done_events, len(m.events))
                for step, kind, boost in (list(m.events)[-new:] if new > 0 else []):
                    tf.summary.scalar(prefix + "boost_change", boost, step=step)
                self._written[m.name] = (done_step, total)
        self._writer.flush()

    def on_epoch_end(self, epoch, logs=None):
        rt = self._rank0()
        if rt is not None:
            from horovod_prio.runtime.summary import summary
            self.summary = summary(rt)
            self._write(rt)

    def on_train_end(self, logs=None):
        rt = self._rank0()
        if rt is None:
            return
        from horovod_prio.runtime.summary import format_summary, summary
        from horovod_prio.tensorflow import overlapped
        self.summary = summary(rt)
        self._write(rt)
        if self.verbose:
            print(format_summary(self.summary, overlapped.stats()), flush=True)
