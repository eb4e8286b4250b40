"""Discrete-event simulator of data-parallel jobs sharing links (``horovod-prio sim``).

Pure Python (matplotlib only for plots). The adaptive mode runs the product's
own :class:`horovod_prio.policy.AdaptivePriorityPolicy` built by
:meth:`horovod_prio.config.PriorityConfig.make_policy`, and the groups come
from :func:`horovod_prio.sequence.partition_groups`. See docs/sim.md.
"""
from .engine import MODES, JobSpec, LinkConfig, SimResult, StepRecord, comm_floor, simulate
from .profiles import BUILTIN, Layer, Profile, get_profile, load_profile, save_profile

__all__ = ["MODES", "JobSpec", "LinkConfig", "SimResult", "StepRecord", "comm_floor", "simulate",
           "BUILTIN", "Layer", "Profile", "get_profile", "load_profile", "save_profile"]
