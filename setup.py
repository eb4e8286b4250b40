"""horovod_prio: priority-aware gradient communication for Horovod + TensorFlow.

The C++ scheduler op (horovod_prio/cc) is compiled against the TensorFlow that
is installed in the build environment, so install with
``pip install --no-build-isolation -e .`` (``make install`` does this).
"""
import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

CC_DIR = os.path.join("horovod_prio", "cc")
OP_SOURCES = [os.path.join(CC_DIR, f) for f in ("scheduler.cc", "ops.cc")]


def _tf_flags():
    code = ("import tensorflow as tf, json; "
            "print(json.dumps([tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags(), "
            "tf.__version__]))")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.check_output([sys.executable, "-c", code], env=env, text=True)
    import json
    return json.loads(out.strip().splitlines()[-1])


class BuildTFOp(build_ext):
    """Builds the scheduler op with g++ and TensorFlow's own flags."""

    _flags = None

    def tf_flags(self):
        if self._flags is None:
            self._flags = _tf_flags()
        return self._flags

    def get_ext_filename(self, fullname):
        # One library per TF version (horovod_prio/cc/__init__.py loads the one
        # matching the running TF), so the venvs of two stacks can share a checkout.
        name = super().get_ext_filename(fullname)
        if fullname.split(".")[-1] == "_scheduler_ops":
            head, sep, tail = name.partition("_scheduler_ops")
            name = "%s%s_tf%s%s" % (head, sep, self.tf_flags()[2].replace(".", "_"), tail)
        return name

    def build_extension(self, ext):
        cflags, lflags, _ = self.tf_flags()
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = (["g++", "-std=c++17", "-shared", "-fPIC", "-O2", "-Wall"]
               + ext.sources + ["-o", out] + cflags + lflags)
        print(" ".join(cmd))
        subprocess.check_call(cmd)


setup(
    name="horovod_prio",
    version="0.1.0",
    description="Priority-aware gradient communication for Horovod (TensorFlow)",
    packages=find_packages(include=["horovod_prio", "horovod_prio.*"]),
    python_requires=">=3.9",
    ext_modules=[Extension("horovod_prio.cc._scheduler_ops", OP_SOURCES)],
    cmdclass={"build_ext": BuildTFOp},
    entry_points={"console_scripts": ["horovod-prio=horovod_prio.cli:main"]},
)
