"""``import horovod_prio.tensorflow as hvd`` - horovod.tensorflow with priority scheduling.

Every public name of ``horovod.tensorflow`` is here unchanged (copied into
this module's namespace), except ``DistributedOptimizer``,
``DistributedGradientTape`` and ``PartialDistributedGradientTape``, which
take every Horovod argument plus ``priority=PriorityConfig(...)``.
"""
import tensorflow as _tf  # our code is plain Python: autograph must never convert it

import horovod.tensorflow as _hvd

from horovod_prio.method.config import PriorityConfig
from horovod_prio.tensorflow import optimizer as _opt

globals().update({_n: getattr(_hvd, _n) for _n in dir(_hvd) if not _n.startswith("_")})


@_tf.autograph.experimental.do_not_convert
def DistributedOptimizer(optimizer, *args, priority=None, **kwargs):
    """horovod.tensorflow.DistributedOptimizer + ``priority=PriorityConfig``."""
    config = _opt.resolve_config(priority)
    hvd_args = _opt.bound_arguments(_hvd.DistributedOptimizer, (optimizer,) + args, kwargs)
    passthrough = _opt.horovod_path_reason(config, hvd_args)
    dist = _hvd.DistributedOptimizer(optimizer, *args, **kwargs)
    if not hasattr(dist, "_allreduce_grads"):
        # e.g. the Adasum optimizer, which reduces deltas, not gradients: Horovod's own path.
        import logging
        logging.getLogger("horovod_prio").warning(
            "horovod_prio: %s has no gradient allreduce to schedule; using Horovod's own path",
            type(dist).__name__)
        return dist
    name = _opt.optimizer_name(dist, hvd_args.get("name"))
    return _opt.install(dist, name, config, hvd_args, passthrough)


@_tf.autograph.experimental.do_not_convert
def DistributedGradientTape(gradtape, *args, priority=None, **kwargs):
    """horovod.tensorflow.DistributedGradientTape + ``priority=PriorityConfig``."""
    config = _opt.resolve_config(priority)
    hvd_args = _opt.bound_arguments(_hvd.DistributedGradientTape, (gradtape,) + args, kwargs)
    passthrough = _opt.horovod_path_reason(config, hvd_args)
    tape = _hvd.DistributedGradientTape(gradtape, *args, **kwargs)
    return _opt.install(tape, "DistributedGradientTape", config, hvd_args, passthrough)


@_tf.autograph.experimental.do_not_convert
def PartialDistributedGradientTape(gradtape, *args, priority=None, **kwargs):
    """horovod.tensorflow.PartialDistributedGradientTape + ``priority=PriorityConfig``:
    ``local_layers``' gradients stay local (scaled as Horovod scales them), the
    rest go through the priority path."""
    hvd_args = _opt.bound_arguments(_hvd.PartialDistributedGradientTape, (gradtape,) + args,
                                    kwargs)
    local_layers = hvd_args.pop("local_layers")
    # Horovod's own validation of local_layers (same errors), on a throw-away tape.
    _hvd.PartialDistributedGradientTape(gradtape, local_layers=local_layers)
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple, set)):
        local_layers = [local_layers]
    hvd_args.pop("gradtape")
    tape = DistributedGradientTape(gradtape, priority=priority, **hvd_args)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape


# Barrier crossing (docs/overlap.md): hvd.overlap(model[, optimizer]), hvd.flush().
from horovod_prio.tensorflow.overlapped import flush, overlap  # noqa: E402,F401


def __getattr__(name):  # Horovod's private helpers, for scripts that reach them
    return getattr(_hvd, name)
