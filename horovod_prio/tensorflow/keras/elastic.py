"""horovod.tensorflow.keras.elastic, re-exported unchanged."""
import horovod.tensorflow.keras.elastic as _impl
from horovod.tensorflow.keras.elastic import *  # noqa: F401,F403


def __getattr__(name):
    return getattr(_impl, name)
