"""``import horovod_prio.tensorflow.keras as hvd`` — horovod.tensorflow.keras with priorities.

Everything ``horovod.tensorflow.keras`` exposes (init, rank, size, callbacks,
elastic, broadcast, allreduce, ...) is here unchanged; ``DistributedOptimizer``
and ``load_model`` add priority scheduling (``priority=PriorityConfig(...)`` or
``HOROVOD_PRIO_*`` environment variables).
"""
import horovod.tensorflow.keras as _hvd_keras
from horovod.tensorflow.keras import *  # noqa: F401,F403  (the drop-in surface)
from horovod_prio.tensorflow.keras import callbacks, elastic  # noqa: F401
from horovod.tensorflow.keras import Compression  # noqa: F401

from horovod_prio.config import PriorityConfig  # noqa: F401
from horovod_prio.tensorflow import optimizer as _opt


def DistributedOptimizer(optimizer, *args, priority=None, **kwargs):
    """horovod.tensorflow.keras.DistributedOptimizer + ``priority=PriorityConfig``."""
    config = _opt.resolve_config(priority)
    hvd_args = _opt.bound_arguments(_hvd_keras.DistributedOptimizer, (optimizer,) + args, kwargs)
    dist = _hvd_keras.DistributedOptimizer(optimizer, *args, **kwargs)
    return _opt.install(dist, _opt.optimizer_name(dist, hvd_args.get("name")), config, hvd_args)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False, priority=None):
    """horovod.tensorflow.keras.load_model whose optimizer schedules by priority."""
    model = _hvd_keras.load_model(filepath, custom_optimizers, custom_objects, compression,
                                  legacy_opts)
    opt = getattr(model, "optimizer", None)
    if opt is not None and hasattr(opt, "_allreduce_grads"):
        _opt.install(opt, _opt.optimizer_name(opt, None), _opt.resolve_config(priority),
                     {"compression": compression})
    return model


def __getattr__(name):
    return getattr(_hvd_keras, name)
