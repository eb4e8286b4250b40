"""Discrete-event simulator of data-parallel jobs sharing links (``horovod-prio sim``).

The simulator runs the product's own rules, not copies: the chunk plan
(:func:`horovod_prio.method.plan.make_plan`), the C++ release scheduler (one
:class:`horovod_prio.scheduler.Scheduler` instance per job, through its C
API), the arbiter's grant policy (:class:`horovod_prio.arbiter.core.Arbiter`)
and the adaptive policy (:meth:`horovod_prio.method.config.PriorityConfig.make_policy`).
No TensorFlow; matplotlib only for plots. See docs/sim.md.
"""
from .engine import MODES, JobSpec, LinkConfig, SimResult, StepRecord, comm_floor, simulate
from .profiles import BUILTIN, Layer, Profile, get_profile, load_profile, save_profile

__all__ = ["MODES", "JobSpec", "LinkConfig", "SimResult", "StepRecord", "comm_floor", "simulate",
           "BUILTIN", "Layer", "Profile", "get_profile", "load_profile", "save_profile"]
