"""Which Keras ``tf.keras`` is, from installed versions alone (imports nothing heavy).

TensorFlow <= 2.15 ships Keras 2 as ``tf.keras``. TensorFlow >= 2.16 gives
Keras 3 unless ``TF_USE_LEGACY_KERAS`` is ``1``/``true`` (read when TensorFlow
is imported), in which case ``tf.keras`` is Keras 2 from the ``tf_keras``
package. Horovod 0.28.1's Keras binding, and so ours, needs Keras 2.

Used by ``horovod_prio.tensorflow.keras`` (fails at import on Keras 3) and by
``horovod-prio check``.
"""
import os
from importlib import metadata

KERAS2, TF_KERAS, KERAS3 = "Keras 2", "tf_keras", "Keras 3"
LEGACY_ENV = "TF_USE_LEGACY_KERAS"


class KerasFlavourError(ImportError):
    """``tf.keras`` is not a Keras 2 that horovod_prio.tensorflow.keras can drive."""


def _major_minor(version):
    parts = []
    for p in str(version).split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts + [0] * (2 - len(parts)))


def _legacy(env_value):
    return (env_value or "").strip().lower() in ("1", "true")


def keras_flavour(tf_version, keras_version, tf_keras_version, legacy_env):
    """``(flavour, problem)``: which Keras ``tf.keras`` is for these installed
    versions (``None`` = not installed) and ``TF_USE_LEGACY_KERAS`` value;
    ``problem`` is ``None`` or the message (with the fix) of why
    ``horovod_prio.tensorflow.keras`` cannot work with it."""
    tf_mm = _major_minor(tf_version)
    if tf_mm < (2, 16):
        if _legacy(legacy_env) and tf_keras_version is not None:
            return TF_KERAS, None
        if _legacy(legacy_env):
            return KERAS2, ("%s=%s is set on TensorFlow %s, which has no tf_keras: it breaks "
                            "`import horovod.tensorflow`; unset %s (it is for TensorFlow >= 2.16)"
                            % (LEGACY_ENV, legacy_env, tf_version, LEGACY_ENV))
        return KERAS2, None
    pin = "tf_keras~=%d.%d.0" % tf_mm
    if _legacy(legacy_env):
        if tf_keras_version is None:
            return TF_KERAS, ("%s=%s but tf_keras is not installed: `pip install %s`"
                              % (LEGACY_ENV, legacy_env, pin))
        return TF_KERAS, None
    if keras_version is not None and _major_minor(keras_version) < (3, 0):
        return KERAS2, None
    return KERAS3, ("TensorFlow %s gives Keras 3 (keras %s) as tf.keras; Horovod 0.28.1's Keras "
                    "binding, and horovod_prio.tensorflow.keras on it, need Keras 2: "
                    "`pip install %s` and run with %s=1 (export it before Python starts; every "
                    "rank needs it), or use horovod_prio.tensorflow (DistributedGradientTape) "
                    "without Keras" % (tf_version, keras_version or "?", pin, LEGACY_ENV))


def installed_version(dist):
    """The installed version of distribution ``dist`` or ``None`` (no import)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def tensorflow_version():
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos",
                 "tensorflow-intel"):
        v = installed_version(dist)
        if v is not None:
            return v
    return None


def running_keras_flavour(tf_version=None, environ=None):
    """:func:`keras_flavour` for this process (``tf_version``: the imported
    TensorFlow's, else the installed one)."""
    environ = os.environ if environ is None else environ
    return keras_flavour(tf_version or tensorflow_version() or "0", installed_version("keras"),
                         installed_version("tf_keras") or installed_version("tf-keras"),
                         environ.get(LEGACY_ENV))


def require_keras2(tf_version=None, environ=None):
    """Raise :class:`KerasFlavourError` unless ``tf.keras`` is a Keras 2."""
    flavour, problem = running_keras_flavour(tf_version, environ)
    if problem is not None:
        raise KerasFlavourError("horovod_prio.tensorflow.keras: " + problem)
    return flavour
