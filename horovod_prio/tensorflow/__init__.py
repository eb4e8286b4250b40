"""``import horovod_prio.tensorflow as hvd`` - horovod.tensorflow with priority scheduling.

Every public name of ``horovod.tensorflow`` is here unchanged (copied into
this module's namespace), except ``DistributedOptimizer`` and
``DistributedGradientTape``, which take every Horovod argument plus
``priority=PriorityConfig(...)``.
"""
import horovod.tensorflow as _hvd

from horovod_prio.method.config import PriorityConfig
from horovod_prio.tensorflow import optimizer as _opt

globals().update({_n: getattr(_hvd, _n) for _n in dir(_hvd) if not _n.startswith("_")})


def DistributedOptimizer(optimizer, *args, priority=None, **kwargs):
    """horovod.tensorflow.DistributedOptimizer + ``priority=PriorityConfig``."""
    config = _opt.resolve_config(priority)
    hvd_args = _opt.bound_arguments(_hvd.DistributedOptimizer, (optimizer,) + args, kwargs)
    _opt.check_supported(config, hvd_args, "DistributedOptimizer")
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
    _opt.check_supported(config, hvd_args, "DistributedGradientTape")
    tape = _hvd.DistributedGradientTape(gradtape, *args, **kwargs)
    return _opt.install(tape, "DistributedGradientTape", config, hvd_args)


# Barrier crossing (docs/overlap.md): hvd.overlap(model[, optimizer]), hvd.flush().
from horovod_prio.tensorflow.overlapped import flush, overlap  # noqa: E402,F401


def __getattr__(name):  # Horovod's private helpers, for scripts that reach them
    return getattr(_hvd, name)
