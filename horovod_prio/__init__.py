"""horovod_prio - priority-aware gradient communication for Horovod + TensorFlow.

Layers, each a folder (see README "How it is built"):

* ``horovod_prio.method`` - the patent's method and its configuration (pure Python);
* ``horovod_prio.scheduler`` - the C++ release scheduler and its TF-free handle;
* ``horovod_prio.runtime`` - the one owner of process state (scheduler set-up,
  monitors, arbiter link, trace);
* ``horovod_prio.tensorflow`` - the TensorFlow/Horovod binding (the only code
  that knows TensorFlow and Horovod);
* ``horovod_prio.arbiter`` - the cross-job link arbiter; ``horovod_prio.sim`` -
  the simulator.

This package root imports no TensorFlow.
"""
from horovod_prio.version import __version__  # noqa: F401
from horovod_prio.method.config import PriorityConfig  # noqa: F401
