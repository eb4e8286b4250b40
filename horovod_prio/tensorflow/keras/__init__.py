"""``import horovod_prio.tensorflow.keras as hvd`` - horovod.tensorflow.keras with priorities.

Every public name of ``horovod.tensorflow.keras`` (init, rank, size,
callbacks, elastic, broadcast, allreduce, ...) is here unchanged (copied into
this module's namespace); ``DistributedOptimizer`` and ``load_model`` add
priority scheduling (``priority=PriorityConfig(...)`` or ``HOROVOD_PRIO_*``
environment variables).

Needs Keras 2 as ``tf.keras`` (TensorFlow <= 2.15, or TensorFlow >= 2.16 with
``tf_keras`` and ``TF_USE_LEGACY_KERAS=1``): on Keras 3 the import fails with
the fix (:mod:`horovod_prio.stack`).
"""
import tensorflow as _tf

from horovod_prio.stack import require_keras2 as _require_keras2

_require_keras2(_tf.__version__)

import horovod.tensorflow.keras as _hvd_keras  # noqa: E402

from horovod_prio.method.config import PriorityConfig  # noqa: E402
from horovod_prio.tensorflow import optimizer as _opt  # noqa: E402

# (our own callbacks/elastic submodules replace Horovod's: not copied)
globals().update({_n: getattr(_hvd_keras, _n) for _n in dir(_hvd_keras)
                  if not _n.startswith("_") and _n not in ("callbacks", "elastic")})
from horovod_prio.tensorflow.keras import callbacks, elastic  # noqa: E402,F401


@_tf.autograph.experimental.do_not_convert
def DistributedOptimizer(optimizer, *args, priority=None, **kwargs):
    """horovod.tensorflow.keras.DistributedOptimizer + ``priority=PriorityConfig``."""
    config = _opt.resolve_config(priority)
    hvd_args = _opt.bound_arguments(_hvd_keras.DistributedOptimizer, (optimizer,) + args, kwargs)
    passthrough = _opt.horovod_path_reason(config, hvd_args)
    dist = _hvd_keras.DistributedOptimizer(optimizer, *args, **kwargs)
    return _opt.install(dist, _opt.optimizer_name(dist, hvd_args.get("name")), config, hvd_args,
                        passthrough)


@_tf.autograph.experimental.do_not_convert
def load_model(*args, priority=None, **kwargs):
    """horovod.tensorflow.keras.load_model (every argument, same meaning) whose
    optimizer schedules by priority."""
    hvd_args = _opt.bound_arguments(_hvd_keras.load_model, args, kwargs)
    config = _opt.resolve_config(priority)
    model = _hvd_keras.load_model(*args, **kwargs)
    opt = getattr(model, "optimizer", None)
    if opt is not None and hasattr(opt, "_allreduce_grads"):
        # Horovod's load_model wraps the optimizer with these arguments
        # (compression); the rest of the fusion arguments are Horovod's defaults.
        _opt.install(opt, _opt.optimizer_name(opt, None), config, hvd_args)
    return model


# Barrier crossing (docs/overlap.md): model = hvd.overlap(model) before compile; hvd.flush().
from horovod_prio.tensorflow.overlapped import flush, overlap  # noqa: E402,F401


def __getattr__(name):
    return getattr(_hvd_keras, name)
