"""horovod.tensorflow.keras.callbacks, re-exported unchanged."""
import horovod.tensorflow.keras.callbacks as _impl
from horovod.tensorflow.keras.callbacks import *  # noqa: F401,F403


def __getattr__(name):
    return getattr(_impl, name)
