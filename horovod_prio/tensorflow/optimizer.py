"""Drop-in DistributedOptimizer / DistributedGradientTape.

We let Horovod build its own optimizer or tape from the user's arguments (so
every argument keeps Horovod's meaning and validation), then swap its
``_allreduce_grads`` callable -- the one place Horovod turns gradients into
allreduces -- for :class:`~horovod_prio.tensorflow.fusion.PriorityAllreduce`.
Local-gradient aggregation (``backward_passes_per_step``) calls the same
callable, so it is swapped there too.

Horovod features the priority path cannot honour keep Horovod's own path,
with one warning, never an exception: Horovod's ``groups``/``num_groups``
(explicit fusion groups), Horovod elastic (a world that changes size under a
traced graph), ``op=Adasum`` and non-global process sets (see
:class:`~horovod_prio.tensorflow.fusion.PriorityAllreduce`).
"""
import inspect
import os

from horovod_prio.method.config import PriorityConfig
from horovod_prio.runtime import get_runtime
from horovod_prio.tensorflow.fusion import PriorityAllreduce

FUSION_ARGS = ("device_dense", "device_sparse", "compression", "sparse_as_dense", "op",
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


def horovod_path_reason(config, hvd_args):
    """Why this optimizer/tape must keep Horovod's own allreduce path (None: it need not).

    Horovod features the priority path cannot honour are not refused: the
    gradients then go through the reduce function Horovod built from the
    user's arguments (same results as plain Horovod) and one warning says so.
    """
    if not config.enabled:
        return None
    if hvd_args.get("groups") is not None or hvd_args.get("num_groups"):
        return ("Horovod's explicit fusion groups (groups=%r, num_groups=%r) replace horovod_prio's "
                "priority groups; drop them and set PriorityConfig(num_groups=...) / "
                "HOROVOD_PRIO_NUM_GROUPS to schedule by priority"
                % (hvd_args.get("groups"), hvd_args.get("num_groups")))
    if os.environ.get("HOROVOD_ELASTIC", "0").strip() not in ("", "0"):
        return ("Horovod elastic (HOROVOD_ELASTIC=1): the world can change size under a traced "
                "graph, and the priority path plans chunks for one world")
    return None


def install(target, name, config, hvd_args, passthrough=None):
    """Replace ``target._allreduce_grads`` (an optimizer or tape) by the priority path
    (by a reducer that calls Horovod's own one, with a warning, if ``passthrough``
    names a reason)."""
    fallback = target._allreduce_grads
    kwargs = {k: hvd_args[k] for k in FUSION_ARGS if k in hvd_args}
    key = ("reducer", name, config, fallback, passthrough,
           tuple(sorted(kwargs.items(), key=lambda kv: kv[0])))
    # One reducer per distinct setup (like Horovod's cached allreduce fn): an
    # eager loop that wraps a fresh tape every step reuses one traced graph.
    fn = get_runtime().cached(key, lambda: PriorityAllreduce(name, config, fallback,
                                                             passthrough=passthrough, **kwargs))
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
