"""horovod.tensorflow.keras.callbacks, re-exported (every public name).

One repair: on TensorFlow >= 2.16, horovod 0.28.1's Keras callbacks take
``keras.backend`` (Keras 3) as their backend, which has no ``get_value`` /
``set_value``, so e.g. ``LearningRateWarmupCallback`` fails inside
``model.fit`` - also in unmodified Horovod scripts. Horovod jobs on TF 2.16
run Keras 2 from ``tf_keras`` (``TF_USE_LEGACY_KERAS=1``); when that is the
case here, Horovod's callbacks are pointed at ``tf.keras.backend`` (tf_keras),
whose ``get_value`` they need.
"""
import horovod.tensorflow.keras.callbacks as _impl


def _use_the_running_keras_backend():
    if hasattr(_impl.K, "get_value"):
        return False
    import tensorflow as tf
    backend = getattr(getattr(tf, "keras", None), "backend", None)
    if backend is None or not hasattr(backend, "get_value"):
        return False
    _impl.K = backend       # horovod 0.28.1 reads the backend from this module global
    return True


REPAIRED_BACKEND = _use_the_running_keras_backend()

globals().update({_n: getattr(_impl, _n) for _n in dir(_impl) if not _n.startswith("_")})


def __getattr__(name):
    return getattr(_impl, name)
