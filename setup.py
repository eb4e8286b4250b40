"""Build of horovod_prio's two shared libraries; metadata is in pyproject.toml.

* ``horovod_prio/scheduler/libhvdprio_scheduler.so`` -- the release scheduler
  and its C API (no TensorFlow); the simulator and the runtime load it with
  ctypes.
* ``horovod_prio/tensorflow/kernels/libhvdprio_tf_kernels_tf<version>.so`` --
  the TensorFlow kernels, compiled against the TensorFlow installed in the
  build environment and linked to the scheduler library (one process-wide
  scheduler). One per TF version, so the venvs of two stacks can share a
  checkout.

Install with ``pip install --no-build-isolation --no-deps -e .`` (``make
install`` does): the kernels need the installed TensorFlow's headers.
"""
import json
import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SCHED_DIR = os.path.join("horovod_prio", "scheduler")
KERNEL_DIR = os.path.join("horovod_prio", "tensorflow", "kernels")
SCHEDULER = Extension("horovod_prio.scheduler.libhvdprio_scheduler",
                      [os.path.join(SCHED_DIR, f)
                       for f in ("scheduler.cc", "arbiter_client.cc", "c_api.cc")])
KERNELS = Extension("horovod_prio.tensorflow.kernels.libhvdprio_tf_kernels",
                    [os.path.join(KERNEL_DIR, "ops.cc"),
                     os.path.join(KERNEL_DIR, "overlap.cc")])  # barrier crossing (docs/overlap.md)
CXXFLAGS = ["-std=c++17", "-shared", "-fPIC", "-O2", "-Wall"]


def tf_build_info():
    """(compile flags, link flags, version) of the installed TensorFlow."""
    code = ("import tensorflow as tf, json; print(json.dumps([tf.sysconfig.get_compile_flags(), "
            "tf.sysconfig.get_link_flags(), tf.__version__]))")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.check_output([sys.executable, "-c", code], env=env, text=True)
    return json.loads(out.strip().splitlines()[-1])


def kernel_library_name(tf_version):
    return "libhvdprio_tf_kernels_tf%s.so" % tf_version.replace(".", "_")


class BuildLibraries(build_ext):
    """Plain g++ builds: the scheduler first, then the TF kernels linked to it."""

    _tf = None

    def tf(self):
        if self._tf is None:
            self._tf = tf_build_info()
        return self._tf

    # Plain shared libraries (loaded with ctypes / tf.load_op_library), not
    # Python extension modules: fixed names, no EXT_SUFFIX.  setuptools builds
    # into build_lib and copies to the source tree for --inplace/editable.
    def get_ext_filename(self, fullname):
        if fullname == SCHEDULER.name:
            return os.path.join(SCHED_DIR, "libhvdprio_scheduler.so")
        if fullname == KERNELS.name:
            return os.path.join(KERNEL_DIR, kernel_library_name(self.tf()[2]))
        return super().get_ext_filename(fullname)

    def get_ext_fullpath(self, ext_name):
        if ext_name in (SCHEDULER.name, KERNELS.name):
            rel = self.get_ext_filename(ext_name)
            return os.path.abspath(rel if self.inplace else os.path.join(self.build_lib, rel))
        return super().get_ext_fullpath(ext_name)

    def build_extensions(self):
        self.build_extension(SCHEDULER)  # the kernels link to it
        self.build_extension(KERNELS)

    def build_extension(self, ext):
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if ext.name == SCHEDULER.name:
            cmd = (["g++"] + CXXFLAGS + ["-pthread"] + ext.sources
                   + ["-Wl,-soname,libhvdprio_scheduler.so", "-o", out])
        else:
            cflags, lflags, _ = self.tf()
            sched = self.get_ext_fullpath(SCHEDULER.name)
            cmd = (["g++"] + CXXFLAGS + ["-I", SCHED_DIR] + ext.sources + ["-o", out] + cflags
                   + ["-L", os.path.dirname(sched), "-l:libhvdprio_scheduler.so",
                      "-Wl,-rpath,$ORIGIN/../../scheduler"] + lflags)
        print(" ".join(cmd))
        subprocess.check_call(cmd)


setup(ext_modules=[SCHEDULER, KERNELS], cmdclass={"build_ext": BuildLibraries})
