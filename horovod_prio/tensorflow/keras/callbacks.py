"""horovod.tensorflow.keras.callbacks, re-exported unchanged (every public name)."""
import horovod.tensorflow.keras.callbacks as _impl

globals().update({_n: getattr(_impl, _n) for _n in dir(_impl) if not _n.startswith("_")})


def __getattr__(name):
    return getattr(_impl, name)
