"""horovod_prio — priority-aware gradient communication for Horovod + TensorFlow.

This package root imports no TensorFlow: the method (``sequence``, ``policy``)
and its configuration (``config``) are pure Python. The TensorFlow binding is
``horovod_prio.tensorflow`` / ``horovod_prio.tensorflow.keras``.
"""
__version__ = "0.1.0"

from horovod_prio.config import PriorityConfig  # noqa: E402,F401
