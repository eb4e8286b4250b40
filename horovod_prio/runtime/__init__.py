"""The runtime layer: the one owner of horovod_prio's process state, between
the method (:mod:`horovod_prio.method`) and a framework binding
(:mod:`horovod_prio.tensorflow`). No TensorFlow.

* :mod:`.runtime` - :class:`Runtime` / :func:`get_runtime`;
* :mod:`.monitor` - the per-optimizer timing monitor (rank 0 runs the policy);
* :mod:`.trace` - the crash-safe Chrome trace and its reader;
* :mod:`.arbiter_link` - rank 0's scheduler <-> the arbiter client.
"""
from horovod_prio.runtime.runtime import PROCESS_FIELDS, Runtime, get_runtime  # noqa: F401
