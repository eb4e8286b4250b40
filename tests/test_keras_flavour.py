"""Which Keras ``tf.keras`` is (``horovod_prio.stack``), and the Keras
binding's import refusing Keras 3 with the fix."""
import os
import subprocess
import sys

import pytest

from horovod_prio import stack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("tf_v, keras_v, tf_keras_v, env, flavour", [
    ("2.15.1", "2.15.0", None, None, stack.KERAS2),
    ("2.15.1", "2.15.0", "2.15.1", "1", stack.TF_KERAS),
    ("2.16.2", "3.3.3", "2.16.0", "1", stack.TF_KERAS),
    ("2.16.2", "3.3.3", "2.16.0", "true", stack.TF_KERAS),
    ("2.17.0rc1", "3.4.1", "2.17.0", "True", stack.TF_KERAS),
    ("2.16.2", "2.15.0", None, None, stack.KERAS2),          # keras 2 pinned beside TF 2.16
])
def test_keras2_flavours_are_accepted(tf_v, keras_v, tf_keras_v, env, flavour):
    assert stack.keras_flavour(tf_v, keras_v, tf_keras_v, env) == (flavour, None)


@pytest.mark.parametrize("tf_v, keras_v, tf_keras_v, env", [
    ("2.16.2", "3.3.3", None, None),
    ("2.16.2", "3.3.3", "2.16.0", None),        # tf_keras installed, variable not set
    ("2.16.2", "3.3.3", "2.16.0", "0"),
    ("2.16.2", "3.3.3", "2.16.0", "yes"),       # TF reads only 1/true
    ("2.18.0", "3.6.0", None, ""),
])
def test_keras3_is_refused_naming_the_variable_and_the_package(tf_v, keras_v, tf_keras_v, env):
    flavour, problem = stack.keras_flavour(tf_v, keras_v, tf_keras_v, env)
    assert flavour == stack.KERAS3
    minor = ".".join(tf_v.split(".")[:2])
    assert "TF_USE_LEGACY_KERAS=1" in problem and "pip install tf_keras~=%s.0" % minor in problem
    assert "Keras 3 (keras %s)" % keras_v in problem


def test_legacy_variable_without_tf_keras_is_refused_with_the_fix():
    flavour, problem = stack.keras_flavour("2.16.2", "3.3.3", None, "1")
    assert flavour == stack.TF_KERAS and "pip install tf_keras~=2.16.0" in problem
    flavour, problem = stack.keras_flavour("2.15.1", "2.15.0", None, "1")
    assert flavour == stack.KERAS2 and "unset TF_USE_LEGACY_KERAS" in problem


def test_require_keras2_raises_an_import_error():
    env = {"TF_USE_LEGACY_KERAS": "0"}
    orig = stack.installed_version
    try:
        stack.installed_version = lambda d: {"keras": "3.3.3", "tf_keras": None}.get(d)
        with pytest.raises(ImportError, match=r"horovod_prio.tensorflow.keras: TensorFlow 2.16.2 "
                                              r"gives Keras 3 .*TF_USE_LEGACY_KERAS=1"):
            stack.require_keras2("2.16.2", env)
        stack.installed_version = lambda d: {"keras": "3.3.3", "tf_keras": "2.16.0"}.get(d)
        assert stack.require_keras2("2.16.2", {"TF_USE_LEGACY_KERAS": "1"}) == stack.TF_KERAS
    finally:
        stack.installed_version = orig


IMPORT_ON_KERAS3 = r"""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
import horovod_prio.tensorflow               # (imports horovod.tensorflow with this stack's env)
from horovod_prio import stack
os.environ["TF_USE_LEGACY_KERAS"] = "0"       # what a TF 2.16 user without the variable has
tf.__version__ = "2.16.2"                     # what a TF 2.16 install reports
stack.installed_version = lambda d: {"keras": "3.3.3"}.get(d)
try:
    import horovod_prio.tensorflow.keras
except ImportError as e:
    print("REFUSED", e)
    sys.exit(0)
print("IMPORTED")
"""


@pytest.mark.tf_stack
def test_the_keras_binding_refuses_keras3_at_import(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", IMPORT_ON_KERAS3], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0 and r.stdout.startswith("REFUSED"), r.stdout + r.stderr
    assert "TF_USE_LEGACY_KERAS=1" in r.stdout and "pip install tf_keras~=2.16.0" in r.stdout
