"""Drop-in DistributedOptimizer / DistributedGradientTape.

We let Horovod build its own optimizer or tape from the user's arguments (so
every argument keeps Horovod's meaning and validation), then swap its
``_allreduce_grads`` callable — the one place Horovod turns gradients into
allreduces — for :class:`~horovod_prio.tensorflow.fusion.PriorityAllreduce`.
Local-gradient aggregation (``backward_passes_per_step``) calls the same
callable, so it is swapped there too.
"""
import inspect

from horovod_prio.config import PriorityConfig
from horovod_prio.tensorflow.fusion import PriorityAllreduce

_FUSION_ARGS = ("device_dense", "device_sparse", "compression", "sparse_as_dense", "op",
                "gradient_predivide_factor", "process_set")


def resolve_config(priority):
    if priority is None:
        return PriorityConfig()
    if isinstance(priority, PriorityConfig):
        return priority
    if isinstance(priority, dict):
        return PriorityConfig(**priority)
    raise TypeError("priority must be a horovod_prio.PriorityConfig, a dict of its fields or None, "
                    "got %r" % type(priority).__name__)


def bound_arguments(hvd_fn, args, kwargs):
    """The user's arguments as Horovod's function sees them (defaults filled in)."""
    bound = inspect.signature(hvd_fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


_FNS = {}


def _priority_allreduce(name, config, fallback, kwargs):
    """One PriorityAllreduce per distinct setup, like Horovod's cached allreduce fn:
    an eager loop that wraps a fresh tape every step then reuses one traced graph."""
    try:
        key = (name, config, fallback, tuple(sorted(kwargs.items())))
        hash(key)
    except TypeError:
        return PriorityAllreduce(name, config, fallback, **kwargs)
    if key not in _FNS:
        _FNS[key] = PriorityAllreduce(name, config, fallback, **kwargs)
    return _FNS[key]


def install(target, name, config, hvd_args):
    """Replace ``target._allreduce_grads`` (an optimizer or tape) by the priority path."""
    fallback = target._allreduce_grads
    kwargs = {k: hvd_args[k] for k in _FUSION_ARGS if k in hvd_args}
    fn = _priority_allreduce(name, config, fallback, kwargs)
    target._allreduce_grads = fn
    helper = getattr(target, "_agg_helper", None)
    if helper is not None:  # backward_passes_per_step > 1
        if hasattr(helper, "_allreduce_grads"):
            helper._allreduce_grads = fn
        if hasattr(helper, "allreduce_grads"):
            helper.allreduce_grads = fn
    return target


def optimizer_name(opt, given):
    return given or getattr(opt, "_name", None) or "Distributed%s" % type(opt).__name__
