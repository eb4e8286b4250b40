"""``import horovod_prio.tensorflow as hvd`` — horovod.tensorflow with priority scheduling.

Everything ``horovod.tensorflow`` exposes is here unchanged, except
``DistributedOptimizer`` and ``DistributedGradientTape``, which take every
Horovod argument plus ``priority=PriorityConfig(...)``.
"""
import horovod.tensorflow as _hvd
from horovod.tensorflow import *  # noqa: F401,F403  (the drop-in surface)
from horovod.tensorflow import Compression  # noqa: F401

from horovod_prio.config import PriorityConfig  # noqa: F401
from horovod_prio.tensorflow import optimizer as _opt


def DistributedOptimizer(optimizer, *args, priority=None, **kwargs):
    """horovod.tensorflow.DistributedOptimizer + ``priority=PriorityConfig``."""
    config = _opt.resolve_config(priority)
    hvd_args = _opt.bound_arguments(_hvd.DistributedOptimizer, (optimizer,) + args, kwargs)
    dist = _hvd.DistributedOptimizer(optimizer, *args, **kwargs)
    if not hasattr(dist, "_allreduce_grads"):
        # e.g. the Adasum optimizer, which reduces deltas, not gradients: Horovod's own path.
        import logging
        logging.getLogger("horovod_prio").warning(
            "horovod_prio: %s has no gradient allreduce to schedule; using Horovod's own path",
            type(dist).__name__)
        return dist
    name = _opt.optimizer_name(dist, hvd_args.get("name"))
    return _opt.install(dist, name, config, hvd_args)


def DistributedGradientTape(gradtape, *args, priority=None, **kwargs):
    """horovod.tensorflow.DistributedGradientTape + ``priority=PriorityConfig``."""
    config = _opt.resolve_config(priority)
    hvd_args = _opt.bound_arguments(_hvd.DistributedGradientTape, (gradtape,) + args, kwargs)
    tape = _hvd.DistributedGradientTape(gradtape, *args, **kwargs)
    return _opt.install(tape, "DistributedGradientTape", config, hvd_args)


def __getattr__(name):  # anything else horovod.tensorflow has (private helpers too)
    return getattr(_hvd, name)
